"""Vocoder training data: random fixed-length (mel, waveform) segments from a store.

Why segments: a GAN vocoder learns a local mapping, so whole utterances waste memory and
padding, and one segment shape means one compiled graph (``vocoder.segment_frames``). Why
batch k is a pure function of (seed, k): resume is exact with nothing saved but the step.
Utterances are drawn in proportion to their length (every frame equally likely), with a
uniform offset. Frames ``k .. k+N-1`` go with samples ``k*hop .. (k+N)*hop - 1`` (frame j is
centred on sample j * hop); a short clip is padded with silence and the log floor. The mels
are the store's, or for fine-tuning any array of the same layout (``mel_source``, see
``train.vocoder.finetune``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch

from myxtts.audio.io import PCM16_SCALE
from myxtts.data.batch import Batch
from myxtts.data.feed.prefetch import CopyFeed
from myxtts.data.store import FeatureStore


class SegmentBatches:
    """``batch(k) -> {"mel": float32 [B, N, n_mels], "wav": float32 [B, N * hop]}``.

    ``mel_source``: ``[total_frames, n_mels]`` array indexed like ``store.mel_array``
    (default: the store's own float16 memmap).
    """

    def __init__(self, store: FeatureStore, segment_frames: int, batch_size: int, hop: int,
                 log_floor: float, seed: int, mel_source: np.ndarray | None = None) -> None:
        store.require_audio()
        self.store, self.n, self.batch_size, self.hop = store, segment_frames, batch_size, hop
        self.seed = seed
        self.pad_value = math.log(log_floor)
        self.mel_source = store.mel_array if mel_source is None else mel_source
        lengths = store.mel_lengths.astype(np.float64)
        self.weights = lengths / lengths.sum()

    def segment(self, i: int, start: int) -> tuple[np.ndarray, np.ndarray]:
        """Frames ``start .. start+N-1`` of utterance ``i`` and their samples (padded)."""
        n, hop = self.n, self.hop
        length = int(self.store.mel_lengths[i])
        offset = int(self.store.mel_offsets[i])
        mel = np.full((n, self.mel_source.shape[1]), self.pad_value, np.float32)
        take = max(0, min(n, length - start))
        mel[:take] = self.mel_source[offset + start: offset + start + take]
        audio = self.store.audio(i)
        wav = np.zeros(n * hop, np.float32)
        piece = audio[start * hop: (start + n) * hop]
        wav[: piece.shape[0]] = piece * (1.0 / PCM16_SCALE)  # int16 -> float
        return mel, wav

    def batch(self, k: int) -> dict[str, torch.Tensor]:
        rng = np.random.default_rng([self.seed, k])
        utts = rng.choice(len(self.weights), size=self.batch_size, p=self.weights)
        mels, wavs = [], []
        for i in utts:
            room = max(0, int(self.store.mel_lengths[i]) - self.n)
            mel, wav = self.segment(int(i), int(rng.integers(0, room + 1)))
            mels.append(mel)
            wavs.append(wav)
        return {"mel": torch.from_numpy(np.stack(mels)), "wav": torch.from_numpy(np.stack(wavs))}

    def stream(self, start: int) -> Iterator[dict[str, torch.Tensor]]:
        """Batches ``start, start+1, ...`` (endless); pinned on CUDA-capable hosts so the
        feed's copies are asynchronous."""
        pin = torch.cuda.is_available()
        k = start
        while True:
            b = self.batch(k)
            yield {key: v.pin_memory() for key, v in b.items()} if pin else b
            k += 1

    def real_frames(self, batch: Batch) -> int:
        """Mel frames of one of these batches: every segment is full length."""
        return self.batch_size * self.n

    def device_feed(self, device: torch.device, start: int, num_batches: int,
                    copy_log: list | None = None) -> CopyFeed:
        """The trainer's ``data.feed.protocol.DeviceFeed``: batches ``start, start+1, ...``
        on ``device``, copied ``num_batches`` ahead on a side stream (one endless pass)."""
        return CopyFeed(self.stream(start), device, num_batches, copy_log, frames=self.real_frames)
