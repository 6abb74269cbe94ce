"""Batch assembly: per-utterance numpy items -> the padded batch dict the model consumes
(``myxtts.data.batch`` defines it).

Why preallocate-and-fill: ``torch.tensor`` per item + ``pad_sequence`` copies every item
twice; here each batch allocates its arrays once (lazily zeroed) and each item is one slice
assignment (float16 bytes stay float16 for a GPU), wrapped by ``torch.from_numpy`` or built
in pinned memory for a GPU. Why pad to the bucket's shape, not the batch maximum: the
sampler promises at most ``num_buckets`` shapes; per-batch maxima would make nearly every
batch a new shape (recompiles, allocator churn).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch

from myxtts.data.batch import (
    FIELDS,
    PAD_MULTIPLE,
    Batch,
    BatchShape,
    allocate,
    allocate_pinned,
    numpy_dtype,
    round_up,
    stop_targets,
)
from myxtts.data.feed.buckets import ShapeTable
from myxtts.data.feed.dataset import StoreBatch

Specs = dict[str, tuple[tuple[int, ...], torch.dtype]]  # field -> (shape, dtype) of a batch

_SERIAL_ELEMENTS = 32767  # torch runs element-wise ops on fewer elements than 32768 inline


def _cast_into(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[:] = src`` across dtypes (float16 store frames into a float32 batch), one pass
    with no temporary: torch's vectorised cast (numpy's float16 cast measures ~2x slower), in
    pieces below torch's parallel grain (waking OpenMP for a 50k copy costs more than it)."""
    d = torch.from_numpy(dst)
    s = torch.from_numpy(src)  # a read-only memmap view: only ever read (warning silenced)
    rows = max(1, _SERIAL_ELEMENTS // max(1, dst.shape[-1]))
    for a in range(0, dst.shape[0], rows):
        d[a:a + rows].copy_(s[a:a + rows])


POOL_PER_SHAPE = 4  # batch buffers kept per shape: one held by the loop, one being filled, prefetch


class BufferPool:
    """Batch arrays reused once nobody holds them: a fresh multi-MB batch per step costs
    page faults or a calloc memset on top of the copies. An entry is reused only when its
    arrays are referenced by the pool alone (every tensor handed out keeps its array alive
    through ``torch.from_numpy``, views included), so a batch the consumer keeps is never
    overwritten; with all of a shape's entries held, a new one is allocated. Not pickled
    (each worker process builds its own)."""

    def __init__(self, per_shape: int = POOL_PER_SHAPE) -> None:
        self.per_shape = int(per_shape)
        self._entries: dict[Any, list[dict[str, np.ndarray]]] = {}

    def take(self, key: Any, make: Any) -> dict[str, np.ndarray]:
        """A free entry for ``key``, else ``make()`` (kept while fewer than ``per_shape``)."""
        entries = self._entries.setdefault(key, [])
        for entry in entries:
            if unreferenced(entry.values()):
                return entry
        entry = make()
        if len(entries) < self.per_shape:
            entries.append(entry)
        return entry


def _ref_counts(arrays: Iterable[np.ndarray]) -> list[int]:
    return [sys.getrefcount(a) for a in arrays]


# What ``_ref_counts`` reads for an array its container alone holds. Measured here, by the
# same code, rather than written down: how many references the interpreter itself keeps
# while counting (a loop variable, the call's argument) differs between Python versions.
_ALONE = max(_ref_counts([np.empty(0)]))


def unreferenced(arrays: Iterable[np.ndarray]) -> bool:
    """Whether the container ``arrays`` iterates holds the only reference to each array:
    no tensor (``torch.from_numpy`` keeps its array alive, views included) or other name
    does. What decides that a pooled buffer or a loader slot may be written again."""
    return max(_ref_counts(arrays), default=0) <= _ALONE


class Collator:
    """Picklable ``collate_fn`` (lives in loader workers).

    ``shape_table``: pads each batch to its bucket's ``(T, L)``; ``None`` pads to the
    batch's own maxima rounded up to ``pad_multiple`` (mel) and ``PAD_MULTIPLE`` (text) --
    for evaluation or on-the-fly data without a bucketed sampler.
    ``ref_frames``: reference mels are zero-padded to this; longer ones are cropped to
    their first ``ref_frames`` frames (a reference is a crop anyway).
    ``transfer``: build the batch in the dtypes it travels to a GPU in (float16 mels, copied
    from the store without a cast; see ``data.batch``); else float32 (the cast is free here).
    ``pinned``: build it in pinned host memory (the training process itself collates for a
    GPU: no second copy before the asynchronous transfer; loader workers cannot pin).
    """

    def __init__(self, shape_table: ShapeTable | None, n_mels: int, ref_frames: int,
                 pad_multiple: int = PAD_MULTIPLE, transfer: bool = False,
                 pinned: bool = False) -> None:
        if n_mels < 1 or ref_frames < 1 or pad_multiple < 1:
            raise ValueError(f"n_mels, ref_frames and pad_multiple must be >= 1, got {n_mels}, "
                             f"{ref_frames}, {pad_multiple}")
        self.shape_table = shape_table
        self.n_mels = int(n_mels)
        self.ref_frames = int(ref_frames)
        self.pad_multiple = int(pad_multiple)
        self.transfer = bool(transfer) or bool(pinned)
        self.pinned = bool(pinned)
        self._pool = BufferPool()

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_pool"}  # buffers stay here

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pool = BufferPool()

    def padded_shape(self, max_mel_frames: int, max_tokens: int) -> tuple[int, int]:
        """``(T, L)`` a batch with these maxima is padded to."""
        if self.shape_table is None:
            return (round_up(max(max_mel_frames, 1), self.pad_multiple),
                    round_up(max(max_tokens, 1), PAD_MULTIPLE))
        n_frames, n_tokens = self.shape_table.shape_for(max_mel_frames)
        if max_tokens > n_tokens:
            raise ValueError(
                f"a batch has {max_tokens} text tokens but its bucket caps text at {n_tokens}; the "
                f"sampler was built from other text lengths than the dataset serves (stale store?) "
                f"-- rebuild the sampler from the store's lengths")
        return n_frames, n_tokens

    # A loader worker's ``SlotCollator`` passes ``alloc`` to build the batch in its shared slot.
    builds_into = True

    def __call__(self, items: list[dict[str, Any]] | StoreBatch,
                 alloc: Callable[[Specs], dict[str, np.ndarray] | None] | None = None) -> Batch:
        """The padded batch of ``items``. ``alloc``: given every field's ``(shape, dtype)``,
        the arrays to build it in (or None: this collator's own)."""
        if not len(items):
            raise ValueError("Collator got an empty batch")
        if isinstance(items, StoreBatch):
            return self._columns(items, alloc)
        batch = len(items)
        mel_lens = np.fromiter((it["mel"].shape[0] for it in items), np.int64, batch)
        tok_lens = np.fromiter((len(it["tokens"]) for it in items), np.int64, batch)
        n_frames, n_tokens = self.padded_shape(int(mel_lens.max()), int(tok_lens.max()))
        n_mels, n_ref = self.n_mels, self.ref_frames
        shape = BatchShape(batch, n_tokens, n_frames, n_ref, n_mels)
        out = alloc(self._specs(shape)) if alloc is not None else None
        if out is not None:
            pinned = None
            for a in out.values():
                a.fill(0)  # zeros = padding
        else:
            pinned = allocate_pinned(shape) if self.pinned else None
            out = ({k: t.numpy() for k, t in pinned.items()} if pinned is not None
                   else allocate(shape, self.transfer))  # zeros = padding
        tokens, mel, ref = out["tokens"], out["mel"], out["ref_mel"]
        ref_lens, speakers = out["ref_lengths"], out["speaker_ids"]
        languages, indices = out["language_ids"], out["indices"]
        with warnings.catch_warnings():  # torch.from_numpy of read-only memmap views
            warnings.simplefilter("ignore", UserWarning)
            for i, it in enumerate(items):
                m = it["mel"]  # [T_i, n_mels], float16 or float32
                r = it["ref_mel"]  # [R_i, n_mels]
                if m.ndim != 2 or m.shape[1] != n_mels or r.ndim != 2 or r.shape[1] != n_mels:
                    raise ValueError(
                        f"utterance {it.get('index')}: mel {tuple(m.shape)} / ref_mel "
                        f"{tuple(r.shape)} must be [frames, {n_mels}] (audio.n_mels); re-run "
                        f"prepare if the config changed")
                n, t = int(mel_lens[i]), int(tok_lens[i])
                tokens[i, :t] = it["tokens"]
                k = min(r.shape[0], n_ref)
                if m.dtype == mel.dtype:  # float16 bytes into float16 (a GPU's batch): a copy
                    mel[i, :n] = m
                    ref[i, :k] = r[:k]
                else:  # float16 store frames into a float32 batch: cast in the same pass
                    _cast_into(mel[i, :n], m)
                    _cast_into(ref[i, :k], r[:k])
                ref_lens[i] = k
                speakers[i] = it["speaker_id"]
                languages[i] = it["language_id"]
                indices[i] = it["index"]
        out["token_lengths"][:], out["mel_lengths"][:] = tok_lens, mel_lens  # (in place: a
        out["stop_target"][:] = stop_targets(mel_lens, n_frames)  # pinned batch stays pinned)
        if pinned is not None:
            return pinned  # type: ignore[return-value]
        return {k: torch.from_numpy(v) for k, v in out.items()}  # type: ignore[return-value]

    def _specs(self, shape: BatchShape) -> Specs:
        sizes = shape.sizes()
        return {name: (shape.of(name, sizes), spec.host_dtype(self.transfer))
                for name, spec in FIELDS.items()}

    def _columns(self, cols: StoreBatch, alloc: Any = None) -> Batch:
        """A batch from a dataset's columns (the store loader's path): pooled buffers whose
        every element is written (real values or padding), the tokens gathered in one numpy
        pass, each utterance's frames cast or copied straight out of the memory map."""
        n_mels, n_ref, batch = self.n_mels, self.ref_frames, len(cols)
        if cols.mels.ndim != 2 or cols.mels.shape[1] != n_mels:
            raise ValueError(f"utterance {int(cols.index[0])}: mel {tuple(cols.mels.shape[1:])} "
                             f"frames must be [frames, {n_mels}] (audio.n_mels); re-run prepare "
                             f"if the config changed")
        mel_lens, tok_lens = cols.mel_len, cols.tok_len
        n_frames, n_tokens = self.padded_shape(int(mel_lens.max()), int(tok_lens.max()))
        shape = BatchShape(batch, n_tokens, n_frames, n_ref, n_mels)
        out = alloc(self._specs(shape)) if alloc is not None else None
        pinned = None
        if out is None:
            pinned = allocate_pinned(shape) if self.pinned else None  # handed on, never pooled
            out = ({k: t.numpy() for k, t in pinned.items()} if pinned is not None else
                   self._pool.take((shape, self.transfer), lambda: _empty(self._specs(shape))))
        # tokens: [B, L] gather, PAD_ID (0) after each utterance's length
        cols_l = np.arange(n_tokens)
        real = cols_l < tok_lens[:, None]
        ids = cols.tokens[np.where(real, cols.tok_off[:, None] + cols_l, 0)]  # int32 [B, L]
        if cols.token_map is not None:
            ids = cols.token_map[ids]
        np.multiply(ids, real, out=out["tokens"], casting="unsafe")
        ref_lens = np.minimum(cols.ref_len, n_ref)
        mel, ref = out["mel"], out["ref_mel"]
        with warnings.catch_warnings():  # torch.from_numpy of the read-only memmap: only read
            warnings.simplefilter("ignore", UserWarning)
            fill_rows(mel, cols.mels, cols.mel_off.tolist(), mel_lens.tolist())
            fill_rows(ref, cols.mels, cols.ref_off.tolist(), ref_lens.tolist())
        out["token_lengths"][:], out["mel_lengths"][:] = tok_lens, mel_lens
        out["ref_lengths"][:], out["indices"][:] = ref_lens, cols.index
        out["speaker_ids"][:], out["language_ids"][:] = cols.speaker, cols.language
        np.greater_equal(np.arange(n_frames), np.maximum(mel_lens - 1, 0)[:, None],
                         out=out["stop_target"])  # = stop_targets(), written in place
        if pinned is not None:
            return pinned  # type: ignore[return-value]
        return {k: torch.from_numpy(v) for k, v in out.items()}  # type: ignore[return-value]


def _empty(specs: Specs) -> dict[str, np.ndarray]:
    return {name: np.empty(shape, numpy_dtype(dtype)) for name, (shape, dtype) in specs.items()}


def fill_rows(dst: np.ndarray, src: np.ndarray, starts: list[int], lengths: list[int]) -> None:
    """``dst[i, :n_i] = src[start_i:start_i + n_i]`` and ``dst[i, n_i:] = 0`` for every row
    (every element of ``dst`` written), casting float16 into float32 where the dtypes differ.
    One torch copy per row where torch runs on one thread; below its parallel grain where it
    would wake its thread pool (``_cast_into``). Read-only ``src``: the caller silences
    torch's warning about it."""
    cast = dst.dtype != src.dtype
    if cast:
        flat, serial = torch.from_numpy(dst.reshape(len(dst), -1)), torch.get_num_threads() == 1
        whole = torch.from_numpy(src.reshape(-1))
    width = src.shape[1]
    for i, (start, n) in enumerate(zip(starts, lengths)):
        if not cast:  # float16 bytes into float16 (a GPU's batch): a numpy copy
            dst[i, :n] = src[start:start + n]
        elif serial:
            flat[i, :n * width].copy_(whole[start * width:(start + n) * width])
        else:
            _cast_into(dst[i, :n], src[start:start + n])
        dst[i, n:] = 0
