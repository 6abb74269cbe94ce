"""Log-mel features in torch: the single feature definition for prepare, on-the-fly loading,
training targets, the vocoder and inference.

Why our own code (torch.stft + a Slaney filterbank) instead of librosa/torchaudio: it runs
batched on whichever device holds the audio (GPU in on-the-fly mode), has no extra
dependency, and matches ``librosa.feature.melspectrogram(..., power=1, htk=False,
norm='slaney')`` to float32 precision (tested), so features are interchangeable with the
common LJSpeech/XTTS recipes.

Conventions (binding for the whole project):
- time-major: a clip's mel is ``[n_frames, n_mels]``, a batch ``[B, frames, n_mels]``;
- ``n_frames = 1 + n_samples // hop_length`` (centered frames, even n_fft);
- ``log_mel = log(clamp(|STFT| @ mel_basis, min=log_floor))`` (magnitude, not power);
- in a padded batch, frames past a clip's own ``n_frames`` are exactly ``0.0`` (the same
  value collate pads with), so masks, not sentinel values, mark padding.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import torch
from torch import nn

from myxtts.config import AudioConfig

# Slaney's "auditory toolbox" mel scale: linear below 1 kHz (200/3 Hz per mel), logarithmic
# above (27 mels per factor 6.4). This is librosa's default (htk=False).
_F_SP = 200.0 / 3.0
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOGSTEP = math.log(6.4) / 27.0


def hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney mel value of each frequency (float64)."""
    hz = np.asarray(hz, dtype=np.float64)
    linear = hz / _F_SP
    log = _MIN_LOG_MEL + np.log(np.maximum(hz, _MIN_LOG_HZ) / _MIN_LOG_HZ) / _LOGSTEP
    return np.where(hz >= _MIN_LOG_HZ, log, linear)


def mel_to_hz(mel: np.ndarray) -> np.ndarray:
    """Inverse of ``hz_to_mel`` (float64)."""
    mel = np.asarray(mel, dtype=np.float64)
    linear = mel * _F_SP
    log = _MIN_LOG_HZ * np.exp(_LOGSTEP * (np.maximum(mel, _MIN_LOG_MEL) - _MIN_LOG_MEL))
    return np.where(mel >= _MIN_LOG_MEL, log, linear)


def mel_filterbank(cfg: AudioConfig) -> torch.Tensor:
    """Triangular mel filters, ``[n_freqs = n_fft // 2 + 1, n_mels]`` float32, so that
    ``magnitude[..., n_freqs] @ filterbank`` gives mels.

    Band edges are equally spaced on the Slaney mel scale between fmin and fmax; each
    triangle is divided by its width in Hz (Slaney norm: constant energy per band), as
    ``librosa.filters.mel(htk=False, norm='slaney')`` does. Built in float64, then cast.
    """
    n_freqs = cfg.n_fft // 2 + 1
    fft_hz = np.linspace(0.0, cfg.sample_rate / 2.0, n_freqs)  # [n_freqs]
    edges_hz = mel_to_hz(np.linspace(hz_to_mel(cfg.fmin), hz_to_mel(cfg.fmax), cfg.n_mels + 2))
    widths_hz = np.diff(edges_hz)  # [n_mels + 1]
    offsets = edges_hz[:, None] - fft_hz[None, :]  # [n_mels + 2, n_freqs]
    rising = -offsets[:-2] / widths_hz[:-1, None]  # [n_mels, n_freqs]
    falling = offsets[2:] / widths_hz[1:, None]  # [n_mels, n_freqs]
    weights = np.maximum(0.0, np.minimum(rising, falling))  # [n_mels, n_freqs]
    weights *= (2.0 / (edges_hz[2:] - edges_hz[:-2]))[:, None]
    return torch.from_numpy(np.ascontiguousarray(weights.T, dtype=np.float32))  # [n_freqs, n_mels]


def n_frames_for(n_samples: int, cfg: AudioConfig) -> int:
    """Frames ``MelSpectrogram`` gives a clip of ``n_samples`` (no audio needed: for budgets)."""
    pad = cfg.n_fft // 2
    return 1 + (n_samples + 2 * pad - cfg.n_fft) // cfg.hop_length


def _mirror(pos: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
    """Index that numpy's 'reflect' padding reads for position ``pos`` of a clip of ``length``
    samples (edge not repeated). A triangle wave of period ``2 * (length - 1)``, so it is also
    right when the pad exceeds the clip (repeated reflection, as numpy does).
    """
    period = (2 * (length - 1)).clamp(min=1)
    phase = pos.remainder(period)  # in [0, period)
    return torch.where(phase < length, phase, period - phase)


def reflect_pad(wav: torch.Tensor, lengths: torch.Tensor, pad: int) -> torch.Tensor:
    """Give every clip of a padded batch its OWN reflect padding: ``wav [B, T] -> [B, T + 2*pad]``.

    Row b holds ``pad`` mirrored samples, then ``wav[b]``, with positions ``lengths[b] ..
    lengths[b] + pad - 1`` overwritten by the mirror of the clip's end (reflected about the
    clip's last real sample, not about the batch's padded length). Only the 2 * pad border
    samples per clip go through index maps (gather + scatter), so memory stays O(B * T).
    Anything further right is left as is: only frames past the clip's n_frames read it.

    lengths: long [B], each in 1..T.
    """
    batch = wav.shape[0]
    length = lengths[:, None]  # [B, 1]
    offsets = torch.arange(pad, device=wav.device).expand(batch, pad)  # [B, pad]
    left = wav.gather(1, _mirror(offsets - pad, length))  # [B, pad]: positions -pad..-1
    right_pos = length + offsets  # [B, pad]: positions L..L+pad-1
    right = wav.gather(1, _mirror(right_pos, length))  # [B, pad]
    padded = torch.cat([left, wav, wav.new_zeros(batch, pad)], dim=1)  # [B, T + 2*pad]
    return padded.scatter(1, right_pos + pad, right)


class MelSpectrogram(nn.Module):
    """Batched log-mel: ``forward(wav [B, T], lengths [B] | None) -> (log_mel [B, F, n_mels],
    n_frames [B])``; a 1-D wav gives ``([F, n_mels], n_frames 0-d)``.

    Per-clip reflect padding (index maps over the borders only) and one STFT call per batch,
    no Python loop over clips and no host sync, so it can run on the GPU inside a data pipeline. The window and
    filterbank are non-persistent buffers: ``.to(device)`` moves them, checkpoints skip them.
    Always computes in float32 (autocast is switched off inside) because features must not
    depend on the caller's precision. Padding frames (index >= n_frames[b]) are 0.0.
    ``lengths`` must lie in 1..T (not checked: a check would need a host sync).
    """

    window: torch.Tensor
    mel_basis: torch.Tensor

    def __init__(self, cfg: AudioConfig):
        super().__init__()
        self.n_fft, self.hop_length, self.win_length = cfg.n_fft, cfg.hop_length, cfg.win_length
        self.n_mels, self.log_floor = cfg.n_mels, float(cfg.log_floor)
        self.register_buffer("window", torch.hann_window(cfg.win_length, periodic=True),
                             persistent=False)  # [win_length]
        self.register_buffer("mel_basis", mel_filterbank(cfg), persistent=False)  # [n_freqs, n_mels]

    def magnitude(self, wav: torch.Tensor, lengths: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """Linear mel magnitude (before clamp and log): wav [B, T] -> ([B, F, n_mels], n_frames [B]).

        Frames past a clip's n_frames are NOT masked here (``forward`` masks after the log).
        """
        if wav.dim() != 2 or wav.shape[1] == 0:
            raise ValueError(f"MelSpectrogram expects wav [B, T] or [T] with T > 0, got {tuple(wav.shape)}")
        batch, n_samples = wav.shape
        if lengths is None:
            lengths = torch.full((batch,), n_samples, dtype=torch.long, device=wav.device)
        else:
            lengths = lengths.to(device=wav.device, dtype=torch.long)  # [B]
        pad = self.n_fft // 2
        with torch.autocast(device_type=wav.device.type, enabled=False):
            padded = reflect_pad(wav.float(), lengths, pad)  # [B, T + 2*pad]
            spec = torch.stft(padded, self.n_fft, self.hop_length, self.win_length, self.window,
                              center=False, return_complex=True)  # [B, n_freqs, F]
            mel = spec.abs().transpose(1, 2) @ self.mel_basis  # [B, F, n_mels]
        n_frames = 1 + (lengths + 2 * pad - self.n_fft) // self.hop_length  # [B]
        return mel, n_frames

    def forward(self, wav: torch.Tensor, lengths: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        single = wav.dim() == 1
        mel, n_frames = self.magnitude(wav[None] if single else wav, lengths)  # [B, F, n_mels]
        log_mel = mel.clamp(min=self.log_floor).log()  # [B, F, n_mels]
        frame = torch.arange(log_mel.shape[1], device=log_mel.device)  # [F]
        log_mel = log_mel.masked_fill((frame[None, :] >= n_frames[:, None])[..., None], 0.0)
        if single:
            return log_mel[0], n_frames[0]
        return log_mel, n_frames


@functools.lru_cache(maxsize=8)
def _cpu_module(cfg_key: tuple) -> MelSpectrogram:
    return MelSpectrogram(AudioConfig(*cfg_key))


def compute_mel(wav: np.ndarray, cfg: AudioConfig) -> np.ndarray:
    """One clip's log-mel on the CPU: float32 [T] numpy -> float32 [n_frames, n_mels] numpy."""
    wav = np.require(wav, dtype=np.float32, requirements=["C", "W"])  # from_numpy needs writable
    if wav.ndim != 1:
        raise ValueError(f"compute_mel expects mono audio [T], got shape {wav.shape}")
    module = _cpu_module(dataclasses.astuple(cfg))
    with torch.no_grad():
        log_mel, _ = module(torch.from_numpy(wav))
    return log_mel.numpy()
