"""Griffin-Lim vocoder: pitch survives mel -> wav, lengths and padding behave."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from myxtts.audio.griffin_lim import GriffinLim
from myxtts.audio.mel import MelSpectrogram
from myxtts.config import AudioConfig

CFG = AudioConfig()

pytestmark = pytest.mark.usefixtures("one_thread")


def tone(freq_hz: float, duration_s: float = 0.5) -> torch.Tensor:
    t = torch.arange(int(duration_s * CFG.sample_rate)) / CFG.sample_rate
    return 0.5 * torch.sin(2 * math.pi * freq_hz * t)


def peak_hz(wav: torch.Tensor) -> float:
    x = wav.numpy() * np.hanning(len(wav))
    spectrum = np.abs(np.fft.rfft(x, n=8 * len(x)))
    return float(np.fft.rfftfreq(8 * len(x), 1 / CFG.sample_rate)[spectrum.argmax()])


@pytest.mark.parametrize("freq_hz", [440.0, 1500.0])
def test_tone_pitch_is_reconstructed(freq_hz):
    log_mel, n_frames = MelSpectrogram(CFG)(tone(freq_hz))
    wav = GriffinLim(CFG, n_iter=16)(log_mel)
    assert wav.shape == (int(n_frames) * CFG.hop_length,)
    assert abs(peak_hz(wav) - freq_hz) < 0.03 * freq_hz
    # and it sounds like a tone again: its own mel is close to the input's (edges aside)
    again, _ = MelSpectrogram(CFG)(wav)
    n = log_mel.shape[0]  # wav has n * hop samples -> n + 1 frames
    assert (again[4 : n - 4] - log_mel[4 : n - 4]).abs().mean() < 0.5


def test_batch_lengths_and_padding_are_silence():
    a, _ = MelSpectrogram(CFG)(tone(440.0, 0.5))
    b, _ = MelSpectrogram(CFG)(tone(880.0, 0.3))
    batch = torch.zeros(2, a.shape[0], CFG.n_mels)  # zero-padded log-mel = loud if not masked
    batch[0], batch[1, : b.shape[0]] = a, b
    lengths = torch.tensor([a.shape[0], b.shape[0]])
    wav = GriffinLim(CFG, n_iter=8)(batch, lengths)
    assert wav.shape == (2, a.shape[0] * CFG.hop_length)
    n1 = b.shape[0] * CFG.hop_length
    assert wav[1, n1:].abs().max() == 0
    assert wav[1, :n1].abs().max() > 0.1
    assert abs(peak_hz(wav[1, :n1]) - 880.0) < 0.03 * 880.0


def test_mel_to_linear_is_non_negative_and_consistent():
    vocoder = GriffinLim(CFG)
    log_mel, _ = MelSpectrogram(CFG)(tone(1000.0) + 0.1 * torch.randn(int(0.5 * CFG.sample_rate)))
    mel = log_mel.exp()[None]
    linear = vocoder.mel_to_linear(mel)
    assert linear.shape == (1, log_mel.shape[0], CFG.n_fft // 2 + 1)
    assert linear.min() >= 0
    error = (linear @ vocoder.filterbank - mel).norm() / mel.norm()
    clamped_pinv = (mel @ vocoder.pinv).clamp(min=0)
    assert error < 0.05
    assert error < (clamped_pinv @ vocoder.filterbank - mel).norm() / mel.norm()


def test_wrong_mel_bands_is_a_clear_error():
    with pytest.raises(ValueError, match=r"expects log-mel \[B, frames, 80\]"):
        GriffinLim(CFG)(torch.zeros(1, 10, 64))
