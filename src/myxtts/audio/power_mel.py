"""Mel spectrograms as torchaudio's ``MelSpectrogram`` computes them: the features of models
trained with it (XTTS-v2's conditioning encoder, its DVAE and its speaker encoder).

They differ from the project's own mel (``audio.mel``: magnitude, Slaney scale, frames
time-major) in every convention, so they are a definition of their own rather than options
of that one: power (|STFT|^2 by default), the HTK mel scale, an optional Slaney area
normalisation, frames channel-major ``[..., n_mels, n_frames]``. The filterbank is built in
float32 in the same order of operations as torchaudio's, so a model sees the features it
was trained on to the last bit the STFT allows.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def _hz_to_htk(hz: float) -> float:
    return 2595.0 * math.log10(1.0 + hz / 700.0)


def htk_filterbank(sample_rate: int, n_fft: int, n_mels: int, f_min: float = 0.0,
                   f_max: float | None = None, slaney_norm: bool = True) -> torch.Tensor:
    """Triangular filters on the HTK mel scale, ``[n_fft // 2 + 1, n_mels]`` float32; with
    ``slaney_norm`` each triangle is divided by half its width in Hz (constant energy)."""
    n_freqs = n_fft // 2 + 1
    f_max = float(sample_rate // 2) if f_max is None else f_max
    freqs = torch.linspace(0, sample_rate // 2, n_freqs)
    mels = torch.linspace(_hz_to_htk(f_min), _hz_to_htk(f_max), n_mels + 2)
    edges = 700.0 * (10.0 ** (mels / 2595.0) - 1.0)
    widths = edges[1:] - edges[:-1]
    slopes = edges.unsqueeze(0) - freqs.unsqueeze(1)  # [n_freqs, n_mels + 2]
    down = -slopes[:, :-2] / widths[:-1]
    up = slopes[:, 2:] / widths[1:]
    bank = torch.clamp(torch.min(down, up), min=0.0)
    if slaney_norm:
        bank = bank * (2.0 / (edges[2:n_mels + 2] - edges[:n_mels])).unsqueeze(0)
    return bank


class PowerMel(nn.Module):
    """``[..., n_samples]`` audio -> ``[..., n_mels, n_frames]`` mel power (``power`` 2) or
    magnitude (1), with centred, reflect-padded frames: ``n_frames = 1 + n_samples // hop``.
    ``window`` names the torch window function (``hann``, ``hamming``) of ``win_length``
    samples, centred in ``n_fft``. The window and filterbank are non-persistent buffers:
    they follow the module's device and never enter a checkpoint."""

    def __init__(self, sample_rate: int, n_fft: int, win_length: int, hop_length: int,
                 n_mels: int, f_min: float = 0.0, f_max: float | None = None,
                 power: float = 2.0, slaney_norm: bool = True, window: str = "hann"):
        super().__init__()
        self.n_fft, self.win_length, self.hop_length, self.power = n_fft, win_length, hop_length, power
        make = {"hann": torch.hann_window, "hamming": torch.hamming_window}[window]
        self.register_buffer("window", make(win_length), persistent=False)
        self.register_buffer("filterbank", htk_filterbank(sample_rate, n_fft, n_mels, f_min, f_max,
                                                          slaney_norm), persistent=False)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        shape = audio.shape
        flat = audio.reshape(-1, shape[-1])
        spec = torch.stft(flat, self.n_fft, self.hop_length, self.win_length, self.window,
                          center=True, pad_mode="reflect", normalized=False, onesided=True,
                          return_complex=True).abs()
        if self.power != 1.0:
            spec = spec.pow(self.power)
        mel = torch.matmul(spec.transpose(-1, -2), self.filterbank).transpose(-1, -2)
        return mel.reshape(*shape[:-1], *mel.shape[-2:])
