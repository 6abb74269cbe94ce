"""The on-the-fly loader's worker side: raw clips -> padded wav batches (``data.feed.onthefly``).

:class:`RawSplit` (one split of a raw dataset: tokens, header lengths, references),
:class:`RawAudioDataset` (index -> wav, tokens, reference crop; clips that fail to load are
reported once and skipped, across workers) and :class:`WavCollator` (pads a batch to its
bucket's shape and, for a CPU data role, computes its features there). Reference crops are
cut by ``audio.frames.crop_window``, so their STFT frames equal the full clip's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from myxtts.audio.frames import crop_window, n_frames_for
from myxtts.audio.io import AudioError, load_audio_span, read_span
from myxtts.config import AudioConfig
from myxtts.data.batch import Batch, RawBatch
from myxtts.data.feed.buckets import BucketPlan
from myxtts.data.feed.dataset import mix64
from myxtts.data.feed.features import Featurizer

log = logging.getLogger(__name__)

@dataclass
class RawSplit:
    """One split of a raw dataset, tokenized, with header lengths and references, and what
    loading its clips found out (``failed``, ``spans``): in shared memory, so every loader
    of the split (the statistics pass, the train loader) and each of its workers, forked or
    spawned, see one map."""

    ids: list[str]
    paths: list[str]
    tokens: list[np.ndarray]  # int32 [L] each
    speaker_ids: np.ndarray  # int64 [N]
    language_ids: np.ndarray  # int64 [N]
    est_frames: np.ndarray  # int64 [N], upper bound of the mel frames (header, untrimmed)
    refs: np.ndarray  # int32 [N, refs_per_utterance], -1 = unused
    # uint8 [N]: 1 = the clip failed to load once: reported then, skipped from then on
    failed: torch.Tensor = field(init=False, repr=False, compare=False)
    # int64 [N, 2]: [start, stop) of each loaded clip in its file where the clip is a plain
    # slice of it (``audio.io.load_audio_span``), -1 before: a reference crop of such a clip
    # is then read alone (``read_span``: a seek and ~3 s of samples) instead of decoding,
    # checking and trimming the whole clip for it, ~15 % of an utterance's cost on the CPU
    # data role.
    spans: torch.Tensor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.failed = torch.zeros(len(self.paths), dtype=torch.uint8).share_memory_()
        self.spans = torch.full((len(self.paths), 2), -1, dtype=torch.int64).share_memory_()


class RawAudioDataset(Dataset):
    """Worker side: utterance index -> wav, tokens, reference wav crop (no features)."""

    def __init__(self, split: RawSplit, audio: AudioConfig, ref_frames: int, seed: int) -> None:
        self.split = split
        self.audio = audio
        self.ref_frames = int(ref_frames)
        self.seed = int(seed)
        self.failed, self.spans = split.failed, split.spans  # the split's, shared (RawSplit)
        self._views: tuple[np.ndarray, np.ndarray] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_views": None}  # numpy views do not travel as shared memory

    def _maps(self) -> tuple[np.ndarray, np.ndarray]:
        """numpy views of ``failed`` and ``spans`` (a torch index costs ~5x a numpy one)."""
        if self._views is None:
            self._views = (self.failed.numpy(), self.spans.numpy())
        return self._views

    def __len__(self) -> int:
        return len(self.split.paths)

    def _failed(self, i: int, e: Exception) -> None:
        failed, _ = self._maps()
        if not failed[i]:
            failed[i] = 1
            log.warning("on-the-fly: leaving out a clip that cannot be used (its batch "
                        "repeats another of its clips instead): %s", e)

    def _load(self, i: int) -> np.ndarray | None:
        """The clip, or None when it cannot be used (said once per clip, across workers
        and epochs; a clip that failed is not read again)."""
        failed, spans = self._maps()
        if failed[i]:
            return None
        try:
            wav, span = load_audio_span(self.split.paths[i], self.audio)  # float32 [samples]
        except AudioError as e:
            self._failed(i, e)
            return None
        if span is not None:
            spans[i] = span
        return wav

    def _ref_crop(self, r: int, h: int) -> tuple[np.ndarray, int, int] | None:
        """Reference clip ``r``'s crop for hash ``h``: ``(wav[a:b], first, frames)`` (the
        module doc's crop), or None when ``r`` cannot be used. Read alone where its span is
        known; the same samples as cutting the loaded clip."""
        failed, spans = self._maps()
        if failed[r]:
            return None
        start, stop = (int(x) for x in spans[r])
        if start < 0:
            ref_wav = self._load(r)
            return None if ref_wav is None else self._crop(ref_wav, h)
        a, b, first, want = self._window(stop - start, h)
        try:
            return read_span(self.split.paths[r], start + a, start + b), first, want
        except AudioError as e:
            self._failed(r, e)
            return None

    def _window(self, n_samples: int, h: int) -> tuple[int, int, int, int]:
        """``(a, b, first, frames)`` of the reference crop of a clip of ``n_samples``."""
        n_ref = n_frames_for(n_samples, self.audio)
        want = min(self.ref_frames, n_ref)
        start = (h >> 32) % (n_ref - want + 1)
        a, b, first = crop_window(n_samples, start, want, self.audio)
        return a, b, first, want

    def _crop(self, wav: np.ndarray, h: int) -> tuple[np.ndarray, int, int]:
        a, b, first, want = self._window(len(wav), h)
        return wav[a:b], first, want

    def item(self, i: int, epoch: int) -> dict[str, Any]:
        """The clip's fields; ``{"index": i}`` alone when it cannot be used."""
        wav = self._load(i)
        if wav is None:
            return {"index": i}
        h = mix64(self.seed, epoch, i)
        row = self.split.refs[i]
        refs = row[row >= 0]
        r = int(refs[h % len(refs)])
        crop = self._crop(wav, h) if r == i else self._ref_crop(r, h)
        if crop is None:
            crop = self._crop(wav, h)  # a broken reference clip: clone from the utterance itself
        ref_wav, first, want = crop
        return {"wav": wav, "tokens": self.split.tokens[i], "ref_wav": ref_wav,
                "ref_first": first, "ref_frames": want, "speaker_id": int(self.split.speaker_ids[i]),
                "language_id": int(self.split.language_ids[i]), "index": i}

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.item(int(i), 0)

    def __getitems__(self, task: tuple[int, list[int]]) -> list[dict[str, Any]]:
        """The items of one batch, ``(epoch, indices)`` as the sampler yields it."""
        epoch, indices = task
        return [self.item(int(i), epoch) for i in indices]


class WavCollator:
    """Worker side: pad wavs / reference wavs / tokens of a batch into a ``RawBatch``
    (``data.batch.RAW_FIELDS``; picklable); with a ``featurizer``, also compute the batch's
    features there (on the CPU) and return the ``Batch``."""

    def __init__(self, plan: BucketPlan, est_frames: np.ndarray,
                 featurizer: Featurizer | None = None) -> None:
        self.plan = plan
        self.est_frames = est_frames
        self.featurizer = featurizer

    def __call__(self, items: list[dict[str, Any]]) -> RawBatch | Batch | None:
        raw = self.pad(items)
        if raw is None or self.featurizer is None:
            return raw
        return self.featurizer(raw, torch.device("cpu"))

    def pad(self, items: list[dict[str, Any]]) -> RawBatch | None:
        """The padded batch of ``items``, always of the bucket the sampler drew them from:
        a clip that could not be used (``{"index": i}`` alone) is replaced by the next
        usable clip of the same batch, the way the sampler fills a bucket's last batch (a
        repeat counts like any utterance in loss and metrics). A batch of fewer utterances
        would have a shape no CUDA graph was captured for, and would run uncaptured beside
        the graphs' memory pool. None if no clip of the batch is usable."""
        # the bucket from every clip drawn, failed ones included: it is the sampler's shape
        n_frames, n_tokens = self.plan.shape_for(
            int(self.est_frames[[it["index"] for it in items]].max()))
        usable = [it for it in items if "wav" in it]
        if not usable:
            return None
        items = [it if "wav" in it else usable[k % len(usable)]
                 for k, it in enumerate(items)]
        index = np.array([it["index"] for it in items], np.int64)
        batch = len(items)
        wav_lens = np.array([len(it["wav"]) for it in items], np.int64)
        ref_lens = np.array([len(it["ref_wav"]) for it in items], np.int64)
        tok_lens = np.array([len(it["tokens"]) for it in items], np.int64)
        wav = np.zeros((batch, int(wav_lens.max())), np.float32)
        ref = np.zeros((batch, int(ref_lens.max())), np.float32)
        tokens = np.zeros((batch, max(n_tokens, int(tok_lens.max()))), np.int64)
        for i, it in enumerate(items):
            wav[i, :wav_lens[i]] = it["wav"]
            ref[i, :ref_lens[i]] = it["ref_wav"]
            tokens[i, :tok_lens[i]] = it["tokens"]
        as_long = lambda key: torch.tensor([it[key] for it in items], dtype=torch.long)  # noqa: E731
        return {"wav": torch.from_numpy(wav), "wav_lengths": torch.from_numpy(wav_lens),
                "ref_wav": torch.from_numpy(ref), "ref_wav_lengths": torch.from_numpy(ref_lens),
                "ref_first": as_long("ref_first"), "ref_frames": as_long("ref_frames"),
                "tokens": torch.from_numpy(tokens), "token_lengths": torch.from_numpy(tok_lens),
                "speaker_ids": as_long("speaker_id"), "language_ids": as_long("language_id"),
                "indices": torch.from_numpy(index), "n_frames": torch.tensor(n_frames)}
