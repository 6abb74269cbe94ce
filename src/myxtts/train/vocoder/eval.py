"""Re-synthesis quality of a vocoder: whole utterances of a store, mel in -> audio out,
compared with the recorded audio.

Why whole utterances (not training segments): that is what synthesis does, and it is
where Griffin-Lim -- the vocoder used when no neural one is given -- is measured on equal
terms (its phase estimate needs the whole clip). Two distances, both lower = closer:
``mel_l1`` (mean |log-mel difference|, the project's one mel definition) and
``stft_distance`` (multi-resolution spectral convergence + log-magnitude L1: sees the
harmonic detail and noise that a smooth mel hides).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from myxtts.audio.io import PCM16_SCALE
from myxtts.audio.mel import MelSpectrogram
from myxtts.config import AudioConfig
from myxtts.data.store import FeatureStore
from myxtts.model.vocoder.losses import MultiResolutionSTFTLoss

Vocode = Callable[[torch.Tensor], torch.Tensor]  # log-mel [1, F, n_mels] -> wav [1, F * hop]


def pick_utterances(store: FeatureStore, count: int, max_frames: int = 1000) -> list[int]:
    """``count`` utterances spread over the split (the same every time), none too long."""
    ok = np.flatnonzero(store.mel_lengths <= max_frames)
    if len(ok) == 0:
        ok = np.arange(len(store))
    picks = np.linspace(0, len(ok) - 1, num=min(count, len(ok))).round().astype(int)
    return [int(ok[p]) for p in picks]


@torch.no_grad()
def resynthesis_quality(vocode: Vocode, store: FeatureStore, indices: Sequence[int],
                        audio: AudioConfig, device: torch.device) -> dict[str, float]:
    """Mean ``mel_l1`` and ``stft_distance`` of ``vocode`` over utterances ``indices``."""
    mel_fn = MelSpectrogram(audio).to(device)
    stft = MultiResolutionSTFTLoss(audio).to(device)
    mel_l1, dist = [], []
    for i in indices:
        mel = torch.from_numpy(np.asarray(store.mel(i), np.float32))[None].to(device)
        n = mel.shape[1] * audio.hop_length
        real = torch.zeros(1, n, device=device)
        clip = torch.from_numpy(store.audio(i)[:n].astype(np.float32) * (1.0 / PCM16_SCALE))
        real[0, : clip.shape[0]] = clip.to(device)
        fake = vocode(mel).float()[:, :n]  # [1, n]
        mel_l1.append(float((mel_fn(fake)[0] - mel_fn(real)[0]).abs().mean()))
        dist.append(float(stft(fake, real)))
    return {"mel_l1": float(np.mean(mel_l1)), "stft_distance": float(np.mean(dist))}
