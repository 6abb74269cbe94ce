"""A store held in memory, of utterances chosen by a test: what ``StoreBatches`` reads of a
``FeatureStore`` (its index arrays and the mel and token arrays), without preparing one."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np


def tiny_store(utterances: list[tuple[int, int]], n_mels: int, mels: np.ndarray | None = None,
               seed: int = 0) -> SimpleNamespace:
    """Utterance i has ``utterances[i] = (mel frames, tokens)``, random float16 mels (or the
    rows of ``mels``, e.g. a memmap, laid out one utterance after another) and random tokens;
    speaker ``i % 3``, language ``i % 2``, and itself as its only reference."""
    rng = np.random.default_rng(seed)
    frames = np.array([n for n, _ in utterances], np.int64)
    tokens = np.array([t for _, t in utterances], np.int64)
    if mels is None:
        mels = rng.normal(size=(int(frames.sum()), n_mels)).astype(np.float16)
    n = len(utterances)
    return SimpleNamespace(
        n_mels=n_mels, mel_lengths=frames, token_lengths=tokens,
        mel_offsets=np.concatenate([[0], np.cumsum(frames)[:-1]]).astype(np.int64),
        token_offsets=np.concatenate([[0], np.cumsum(tokens)[:-1]]).astype(np.int64),
        speaker_ids=np.arange(n, dtype=np.int64) % 3, language_ids=np.arange(n, dtype=np.int64) % 2,
        ref_table=np.arange(n, dtype=np.int32)[:, None], mel_array=mels,
        token_array=rng.integers(1, 50, int(tokens.sum())).astype(np.int32))


def mel(store: SimpleNamespace, i: int) -> np.ndarray:
    """Utterance ``i``'s frames."""
    start = int(store.mel_offsets[i])
    return store.mel_array[start:start + int(store.mel_lengths[i])]


def tokens(store: SimpleNamespace, i: int) -> np.ndarray:
    """Utterance ``i``'s token ids."""
    start = int(store.token_offsets[i])
    return store.token_array[start:start + int(store.token_lengths[i])]
