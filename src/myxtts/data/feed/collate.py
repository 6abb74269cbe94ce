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

import warnings
from typing import Any

import numpy as np
import torch

from myxtts.data.batch import (
    PAD_MULTIPLE,
    Batch,
    BatchShape,
    allocate,
    allocate_pinned,
    round_up,
    stop_targets,
)
from myxtts.data.feed.buckets import ShapeTable

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

    def __call__(self, items: list[dict[str, Any]]) -> Batch:
        if not items:
            raise ValueError("Collator got an empty batch")
        batch = len(items)
        mel_lens = np.fromiter((it["mel"].shape[0] for it in items), np.int64, batch)
        tok_lens = np.fromiter((len(it["tokens"]) for it in items), np.int64, batch)
        n_frames, n_tokens = self.padded_shape(int(mel_lens.max()), int(tok_lens.max()))
        n_mels, n_ref = self.n_mels, self.ref_frames
        shape = BatchShape(batch, n_tokens, n_frames, n_ref, n_mels)
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
