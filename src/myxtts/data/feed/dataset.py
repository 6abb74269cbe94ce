"""Map-style dataset over a prepared store: utterance index -> per-utterance item dict.

Why it is this thin: all decoding and feature work happened in ``prepare``; an item is a few
slices of the memmapped store (O(1) look-ups, no file opened) plus a reference crop. Crops
are deterministic: the reference and the crop start come from a hash of ``(seed, epoch,
index)``, so a resumed run sees the same crops, whatever the worker count and fetch order.
The epoch arrives with the indices (``EpochBatches`` tags every batch), because
``set_epoch`` in the main process never reaches persistent workers.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from torch.utils.data import Dataset

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


class StoreBatch:
    """One batch as columns (what ``StoreDataset.__getitems__`` hands the collator): per
    utterance the offsets and lengths of its frames, reference crop and tokens in the store's
    arrays, and its ids; ``Collator`` reads the columns directly (per-utterance dicts and
    views cost more than its copies). Still a sequence of item dicts (``batch[j]``, ``len``,
    iteration) for any other consumer."""

    __slots__ = ("index", "mel_off", "mel_len", "ref_off", "ref_len", "tok_off", "tok_len",
                 "speaker", "language", "mels", "tokens", "token_map")

    def __init__(self, index: np.ndarray, mel_off: np.ndarray, mel_len: np.ndarray,
                 ref_off: np.ndarray, ref_len: np.ndarray, tok_off: np.ndarray,
                 tok_len: np.ndarray, speaker: np.ndarray, language: np.ndarray,
                 mels: np.ndarray, tokens: np.ndarray, token_map: np.ndarray | None) -> None:
        self.index = index  # int64 [B] utterance indices
        self.mel_off, self.mel_len = mel_off, mel_len  # int64 [B]: frames in ``mels``
        self.ref_off, self.ref_len = ref_off, ref_len  # int64 [B]: the reference crop's
        self.tok_off, self.tok_len = tok_off, tok_len  # int64 [B]: ids in ``tokens``
        self.speaker, self.language = speaker, language  # [B] ids
        self.mels = mels  # float16 [total_frames, n_mels]: the split's mels (memmap view)
        self.tokens = tokens  # int32 [total_tokens]: the split's token ids (memmap view)
        self.token_map = token_map  # int32 [vocab]: store id -> model id (None: as stored)

    def __len__(self) -> int:
        return len(self.index)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self[j] for j in range(len(self)))

    def __getitem__(self, j: int) -> dict[str, Any]:
        """Utterance ``j`` as an item dict (see ``StoreDataset``)."""
        off, n, t_off = int(self.mel_off[j]), int(self.mel_len[j]), int(self.tok_off[j])
        r_off, r_len = int(self.ref_off[j]), int(self.ref_len[j])
        text = self.tokens[t_off:t_off + int(self.tok_len[j])]  # int32 [L] view
        return {"tokens": text if self.token_map is None else self.token_map[text],
                "mel": self.mels[off:off + n],  # [T, n_mels]
                "ref_mel": self.mels[r_off:r_off + r_len],  # [R', n_mels]
                "speaker_id": int(self.speaker[j]), "language_id": int(self.language[j]),
                "index": int(self.index[j])}


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


class StoreDataset(Dataset):
    """Items of one split of a ``FeatureStore``; picklable (workers re-map the files).

    An item (numpy): ``tokens`` int32 [L], ``mel`` [T, n_mels], ``ref_mel`` [R' <=
    ref_frames, n_mels], ``speaker_id``, ``language_id``, ``index``. Mels are float16
    memmap views, read once by the collator: a GPU batch takes their bytes as they are (the
    GPU casts; widening here and narrowing there costs ~20x the copy), a CPU batch casts
    them into its float32 buffer in the same pass (``collate.Collator``; a float32 copy per
    item first was a second pass and ~40 allocations per batch).

    ``__getitems__`` fetches a whole batch in one call (torch's DataLoader uses it with a
    ``batch_sampler``), accepting either a list of indices or ``(epoch, indices)`` from
    :class:`EpochBatches`. ``epoch`` (default 0) is used for plain index lists.
    ``transfer``: the batches go to a GPU, so items carry float16 memmap views (see the
    module docstring); else float32 batches (the same float16 views: the collator casts).
    ``vocab_map``: token and language ids mapped
    into a model's vocabulary (None: the store's ids).
    """

    def __init__(self, store: FeatureStore | str | Path, ref_frames: int, seed: int = 0,
                 split: str = "train", transfer: bool = False,
                 vocab_map: VocabMap | None = None) -> None:
        if not isinstance(store, FeatureStore):
            store = FeatureStore.open(store, split)
        if ref_frames < 1:
            raise ValueError(f"ref_frames must be >= 1 (data.ref_frames), got {ref_frames}")
        self.store = store
        self.ref_frames = int(ref_frames)
        self.seed = int(seed)
        self.transfer = bool(transfer)
        self.vocab_map = vocab_map
        self.epoch = 0
        self._refresh()

    def _refresh(self) -> None:
        # Numpy arrays, gathered per BATCH (one fancy-index + tolist per field): per-item
        # numpy scalar access would be slow, and per-utterance Python lists would cost
        # ~250 bytes/utterance in every worker (refcount writes defeat fork's page sharing).
        st = self.store
        self._mel_off, self._mel_len = st.mel_offsets, st.mel_lengths
        self._tok_off, self._tok_len = st.token_offsets, st.token_lengths
        self._speaker, self._language = st.speaker_ids, st.language_ids
        self._token_map = None if self.vocab_map is None else self.vocab_map.tokens
        if self.vocab_map is not None:
            self._language = self.vocab_map.languages[self._language]
        self._refs = st.ref_table  # int32 [N, R], valid entries first, -1 after
        self._n_refs = (st.ref_table >= 0).sum(axis=1)  # [N]
        self._plain: tuple[np.ndarray, np.ndarray] | None = None  # mapped on first use

    def __getstate__(self) -> dict[str, Any]:  # no arrays, no memmaps, no tensors
        return {"store": self.store, "ref_frames": self.ref_frames, "seed": self.seed,
                "transfer": self.transfer, "epoch": self.epoch, "vocab_map": self.vocab_map}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._refresh()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self._mel_len)

    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(mels, tokens) of the store as plain ndarrays over its memmaps: slicing a
        ``np.memmap`` runs Python-level subclass hooks (~5 us a slice), a plain view not."""
        if self._plain is None:
            self._plain = (self.store.mel_array.view(np.ndarray),
                           self.store.token_array.view(np.ndarray))
        return self._plain

    def _batch(self, indices: Sequence[int], epoch: int) -> StoreBatch:
        idx = np.asarray(indices, dtype=np.int64)  # [B]
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"utterance index out of range for {len(self)} utterances")
        mels, tokens = self._arrays()
        hashes = mix64_many(self.seed, epoch, idx)  # uint64 [B]
        pick = (hashes % self._n_refs[idx].astype(np.uint64)).astype(np.int64)
        ref = self._refs[idx, pick].astype(np.int64)  # [B] chosen reference utterance
        ref_off, ref_len = self._mel_off[ref], self._mel_len[ref]
        # random crop of references longer than ref_frames, start from the hash's upper half
        spare = np.maximum(ref_len - self.ref_frames, 0)
        ref_off = ref_off + ((hashes >> np.uint64(32)) % (spare + 1).astype(np.uint64)).astype(np.int64)
        return StoreBatch(idx, self._mel_off[idx], self._mel_len[idx], ref_off,
                          np.minimum(ref_len, self.ref_frames), self._tok_off[idx],
                          self._tok_len[idx], self._speaker[idx], self._language[idx],
                          mels, tokens, self._token_map)

    def item(self, i: int, epoch: int) -> dict[str, Any]:
        """Utterance ``i`` as served in ``epoch`` (same crop as in a batch of that epoch)."""
        return self._batch([i], epoch)[0]

    def __getitem__(self, i: int) -> dict[str, Any]:
        i = int(i)
        return self.item(i + len(self) if i < 0 else i, self.epoch)

    def __getitems__(self, indices: Sequence[int] | tuple[int, Sequence[int]]) -> StoreBatch:
        epoch = self.epoch
        if isinstance(indices, tuple) and len(indices) == 2 and not np.isscalar(indices[1]):
            epoch, indices = indices
        return self._batch(indices, int(epoch))


class EpochBatches:
    """Wraps a batch sampler so every batch travels as ``(epoch, indices)``.

    The sampler's epoch is read when a pass starts (``iter``), which is when the
    BucketBatchSampler fixes the epoch it iterates. ``len`` and attribute access pass
    through, so code can treat this like the sampler.
    """

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler

    def __iter__(self) -> Iterator[tuple[int, list[int]]]:
        epoch = int(getattr(self.sampler, "epoch", 0))
        for batch in self.sampler:
            yield epoch, batch

    def __len__(self) -> int:
        return len(self.sampler)

    def __getattr__(self, name: str) -> Any:
        if name == "sampler":  # not set yet (unpickling): avoid infinite recursion
            raise AttributeError(name)
        return getattr(self.sampler, name)
