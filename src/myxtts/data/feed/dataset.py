"""A store's padded batches: ``(epoch, indices)`` -> the batch the model consumes.

Why it is this thin: all decoding and feature work happened in ``prepare``; a batch is a few
gathers over the memmapped store (O(1) look-ups, no file opened), each utterance's frames
copied once from the memory map into the batch's buffer, plus a reference crop. Crops are
deterministic: the reference and the crop start come from a hash of ``(seed, epoch,
index)``, so a resumed run sees the same crops, whatever the worker count and fetch order.
The epoch arrives with the indices (the sampler yields ``(epoch, indices)``), because
``set_epoch`` in the main process never reaches persistent workers.

Why pad to the bucket's shape, not the batch maximum: the sampler promises at most
``num_buckets`` shapes; per-batch maxima would make nearly every batch a new shape
(recompiles, allocator churn). Buffers come from a pool, from pinned memory (the training
process building a GPU's batch: no second copy before the asynchronous transfer) or from a
loader worker's shared slot (``slots``); ``buffers`` says why.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from myxtts.data.batch import FIELDS, PAD_MULTIPLE, Batch, BatchShape, allocate_pinned, round_up
from myxtts.data.feed.buckets import BucketPlan
from myxtts.data.feed.buffers import BufferPool, Specs, empty, fill_rows
from myxtts.data.feed.slots import SlotRef, Slots
from myxtts.data.store import FeatureStore

if TYPE_CHECKING:
    from myxtts.text.tokenizer import Tokenizer

_MASK64 = (1 << 64) - 1


def mix64(*values: int) -> int:
    """A 64-bit hash of small integers (splitmix64 finaliser per value): ~1 us, no RNG object."""
    x = 0x9E3779B97F4A7C15
    for v in values:
        x = (x ^ (int(v) & _MASK64)) * 0xBF58476D1CE4E5B9 & _MASK64
        x ^= x >> 31
        x = x * 0x94D049BB133111EB & _MASK64
        x ^= x >> 29
    return x


def mix64_many(seed: int, epoch: int, values: np.ndarray) -> np.ndarray:
    """``mix64(seed, epoch, v)`` of every ``v`` (uint64 [B]): the same bits, one numpy pass
    instead of a Python call per utterance (uint64 arithmetic wraps like ``& _MASK64``)."""
    x = np.full(len(values), mix64(seed, epoch), np.uint64)
    x ^= np.asarray(values, np.int64).view(np.uint64)  # int(v) & _MASK64: two's complement
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(31)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(29)
    return x


class VocabMap(NamedTuple):
    """The data's token and language ids in a model's larger vocabulary (a fine-tuned model
    grows the vocabulary it was trained with by the new data's symbols: ``Tokenizer.extended``)."""

    tokens: np.ndarray  # int32 [data vocab_size]: data token id -> model token id
    languages: np.ndarray  # int64 [data languages]: data language index -> model's

    @classmethod
    def between(cls, data: Tokenizer, model: Tokenizer) -> VocabMap | None:
        """None where the two vocabularies are the same (nothing to map)."""
        if data == model:
            return None
        return cls(np.asarray(model.id_map(data), np.int32),
                   np.asarray([model.language_id(x) for x in data.languages], np.int64))


Alloc = Callable[[Specs], dict[str, np.ndarray] | None]  # a batch's arrays, or None


class StoreBatches:
    """The padded batches of one split of a ``FeatureStore``; picklable (workers re-map the
    files and build their own buffer pool).

    ``batch(epoch, indices)`` -> ``data.batch.Batch``: padded to the bucket's ``(T, L)`` of
    ``plan`` (None: to the batch's own maxima rounded up to ``pad_multiple`` (mel) and
    ``PAD_MULTIPLE`` (text), where no sampler planned the batches); references zero-padded
    to ``ref_frames``, longer ones cropped. ``transfer``: the batch goes to a GPU, so its mels
    stay float16, the store's bytes copied without a cast (the GPU casts exactly; widening
    here and narrowing there costs ~20x the copy); else float32, cast from the float16
    memmap in the same pass. ``pinned``: built in pinned host memory (never pooled: torch's
    caching host allocator must see the copies queued from it). ``vocab_map``: token and
    language ids mapped into a model's vocabulary (None: the store's ids). ``slots``: a
    loader worker's shared slots, what ``__getitems__`` builds its task's batches into.
    """

    def __init__(self, store: FeatureStore, plan: BucketPlan | None, ref_frames: int,
                 seed: int = 0, pad_multiple: int = PAD_MULTIPLE, transfer: bool = False,
                 pinned: bool = False, vocab_map: VocabMap | None = None,
                 slots: Slots | None = None) -> None:
        if ref_frames < 1 or pad_multiple < 1:
            raise ValueError(f"ref_frames (data.ref_frames) and pad_multiple must be >= 1, got "
                             f"{ref_frames} and {pad_multiple}")
        self.store, self.plan, self.ref_frames = store, plan, int(ref_frames)
        self.seed, self.pad_multiple = int(seed), int(pad_multiple)
        self.transfer, self.pinned = bool(transfer) or bool(pinned), bool(pinned)
        self.vocab_map, self.slots = vocab_map, slots
        self._refresh()

    def _refresh(self) -> None:
        # Numpy arrays, gathered per BATCH (one fancy-index per field): per-item numpy scalar
        # access would be slow, and per-utterance Python lists would cost ~250
        # bytes/utterance in every worker (refcount writes defeat fork's page sharing).
        st = self.store
        self.n_mels = st.n_mels
        self._mel_off, self._mel_len = st.mel_offsets, st.mel_lengths
        self._tok_off, self._tok_len = st.token_offsets, st.token_lengths
        self._speaker, self._language = st.speaker_ids, st.language_ids
        self._token_map = None if self.vocab_map is None else self.vocab_map.tokens
        if self.vocab_map is not None:
            self._language = self.vocab_map.languages[self._language]
        self._refs = st.ref_table  # int32 [N, R], valid entries first, -1 after
        self._n_refs = (st.ref_table >= 0).sum(axis=1)  # [N]
        self._plain: tuple[np.ndarray, np.ndarray] | None = None  # mapped on first use
        self._pool = BufferPool()

    _STATE = ("store", "plan", "ref_frames", "seed", "pad_multiple", "transfer", "pinned",
              "vocab_map", "slots")

    def __getstate__(self) -> dict[str, Any]:  # no arrays, no memmaps, no buffers
        return {k: self.__dict__[k] for k in self._STATE}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._refresh()

    def __len__(self) -> int:
        return len(self._mel_len)

    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(mels, tokens) of the store as plain ndarrays over its memmaps: slicing a
        ``np.memmap`` runs Python-level subclass hooks (~5 us a slice), a plain view not."""
        if self._plain is None:
            self._plain = (self.store.mel_array.view(np.ndarray),
                           self.store.token_array.view(np.ndarray))
        return self._plain

    def padded_shape(self, max_mel_frames: int, max_tokens: int) -> tuple[int, int]:
        """``(T, L)`` a batch with these maxima is padded to."""
        if self.plan is None:
            return (round_up(max(max_mel_frames, 1), self.pad_multiple),
                    round_up(max(max_tokens, 1), PAD_MULTIPLE))
        n_frames, n_tokens = self.plan.shape_for(max_mel_frames)
        if max_tokens > n_tokens:
            raise ValueError(
                f"a batch has {max_tokens} text tokens but its bucket caps text at {n_tokens}; the "
                f"sampler was built from other text lengths than the dataset serves (stale store?) "
                f"-- rebuild the sampler from the store's lengths")
        return n_frames, n_tokens

    def _specs(self, shape: BatchShape) -> Specs:
        sizes = shape.sizes()
        return {name: (shape.of(name, sizes), spec.host_dtype(self.transfer))
                for name, spec in FIELDS.items()}

    def batch(self, epoch: int, indices: Sequence[int], alloc: Alloc | None = None) -> Batch:
        """The padded batch of utterances ``indices`` as served in ``epoch``. ``alloc``: given
        every field's ``(shape, dtype)``, the arrays to build it in (a worker's shared slot),
        or None (then this object's own). Every element of the arrays is written: real values
        or padding (zeros; ``stop_target`` 1.0 from the last real frame on)."""
        idx = np.asarray(indices, dtype=np.int64)  # [B]
        if not idx.size:
            raise ValueError("an empty batch: a batch needs at least one utterance")
        if idx.min() < 0 or idx.max() >= len(self._mel_len):
            raise IndexError(f"utterance index out of range for {len(self._mel_len)} utterances")
        mels, tokens = self._arrays()
        # the reference: picked by the hash, a random crop where longer than ref_frames
        hashes = mix64_many(self.seed, epoch, idx)  # uint64 [B]
        pick = (hashes % self._n_refs[idx].astype(np.uint64)).astype(np.int64)
        ref = self._refs[idx, pick].astype(np.int64)  # [B] chosen reference utterance
        ref_len = self._mel_len[ref]
        spare = np.maximum(ref_len - self.ref_frames, 0)  # crop start from the hash's upper half
        ref_off = self._mel_off[ref] + (
            (hashes >> np.uint64(32)) % (spare + 1).astype(np.uint64)).astype(np.int64)
        ref_len = np.minimum(ref_len, self.ref_frames)
        mel_off, mel_len = self._mel_off[idx], self._mel_len[idx]
        tok_off, tok_len = self._tok_off[idx], self._tok_len[idx]
        n_frames, n_tokens = self.padded_shape(int(mel_len.max()), int(tok_len.max()))
        shape = BatchShape(len(idx), n_tokens, n_frames, self.ref_frames, self.n_mels)
        out = alloc(self._specs(shape)) if alloc is not None else None
        pinned = None
        if out is None:
            pinned = allocate_pinned(shape) if self.pinned else None  # handed on, never pooled
            out = ({k: t.numpy() for k, t in pinned.items()} if pinned is not None else
                   self._pool.take((shape, self.transfer), lambda: empty(self._specs(shape))))
        # tokens: [B, L] gather, PAD_ID (0) after each utterance's length
        cols = np.arange(n_tokens)
        real = cols < tok_len[:, None]
        ids = tokens[np.where(real, tok_off[:, None] + cols, 0)]  # int32 [B, L]
        if self._token_map is not None:
            ids = self._token_map[ids]
        np.multiply(ids, real, out=out["tokens"], casting="unsafe")
        with warnings.catch_warnings():  # torch.from_numpy of the read-only memmap: only read
            warnings.simplefilter("ignore", UserWarning)
            fill_rows(out["mel"], mels, mel_off.tolist(), mel_len.tolist())
            fill_rows(out["ref_mel"], mels, ref_off.tolist(), ref_len.tolist())
        out["token_lengths"][:], out["mel_lengths"][:] = tok_len, mel_len
        out["ref_lengths"][:], out["indices"][:] = ref_len, idx
        out["speaker_ids"][:], out["language_ids"][:] = self._speaker[idx], self._language[idx]
        np.greater_equal(np.arange(n_frames), np.maximum(mel_len - 1, 0)[:, None],
                         out=out["stop_target"])  # = data.batch.stop_targets, in place
        if pinned is not None:
            return pinned  # type: ignore[return-value]
        return {k: torch.from_numpy(v) for k, v in out.items()}  # type: ignore[return-value]

    def __getitems__(self, tasks: list[tuple[int, list[int]]]) -> list[Batch | SlotRef | None]:
        """A loader worker's task (several ``(epoch, indices)``, ``stream.WorkerStream``'s
        group): each batch built straight into a free shared slot of ``slots``."""
        return [self.slots.write(functools.partial(self.batch, epoch, indices))
                for epoch, indices in tasks]
