"""Log-mel features in torch: the single feature definition for prepare, on-the-fly loading,
training targets, the vocoder and inference.

Why our own code (torch.stft + a Slaney filterbank), not librosa/torchaudio: it runs batched
on whichever device holds the audio, needs no extra dependency, and matches
``librosa.feature.melspectrogram(..., power=1, htk=False, norm='slaney')`` to float32
precision (tested). Conventions binding the whole project: time-major ``[n_frames, n_mels]``;
``n_frames = 1 + n_samples // hop_length`` (centred frames, even n_fft; ``audio.frames``);
``log_mel = log(clamp(|STFT| @ mel_basis, min=log_floor))`` (magnitude, not power); frames
past a clip's ``n_frames`` in a padded batch are exactly 0.0, so masks mark padding.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import torch
from torch import nn

from myxtts.audio.frames import frames_for_samples
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


# Mel bands per block of the banded filterbank product (CPU). 16 output columns keep
# MKL's small-matrix kernels efficient; narrower blocks measure slower, wider ones
# multiply more zeros.
_BANDS_PER_BLOCK = 16


def _band_blocks(mel_basis: torch.Tensor, bands_per_block: int = _BANDS_PER_BLOCK
                 ) -> tuple[int, tuple[tuple[int, int, int, int], ...]]:
    """Where the filterbank ``[n_freqs, n_mels]`` is non-zero, for skipping its zeros.

    Returns ``(n_used_freqs, blocks)``: bins at or above ``n_used_freqs`` have no weight
    in any band (above fmax), and each block ``(mel_lo, mel_hi, freq_lo, freq_hi)`` says
    that bands ``mel_lo:mel_hi`` only weigh bins ``freq_lo:freq_hi``. The triangles are
    narrow (a band spans ~2 neighbours' spacing), so blocks of consecutive bands cut the
    product's work ~5x. Skipped terms are exact zeros: the result only changes by
    float32 summation order (~1e-7 relative).
    """
    nonzero = (mel_basis != 0).numpy()  # [n_freqs, n_mels]
    rows = np.flatnonzero(nonzero.any(axis=1))
    n_used = int(rows[-1]) + 1 if rows.size else 1
    n_mels = nonzero.shape[1]
    blocks = []
    for lo in range(0, n_mels, bands_per_block):
        hi = min(lo + bands_per_block, n_mels)
        bins = np.flatnonzero(nonzero[:, lo:hi].any(axis=1))
        f_lo, f_hi = (int(bins[0]), int(bins[-1]) + 1) if bins.size else (0, 1)
        blocks.append((lo, hi, f_lo, f_hi))
    return n_used, tuple(blocks)


def _stft_magnitude(spec: torch.Tensor, n_used: int) -> torch.Tensor:
    """|STFT| of the first ``n_used`` bins, time-major: complex [B, n_freqs, F] -> [B, F, n_used].

    torch's complex ``abs`` (a scalar hypot loop on CPU) measures ~3x slower than
    either path here. On CPU without autograd, numpy's SIMD complex abs (fastest, shares
    memory, no copy of the input); elsewhere ``sqrt(re^2 + im^2)`` on the real view
    (|STFT| of float32 audio is nowhere near float32's range limits). Both agree with
    ``abs`` to ~2e-7 relative. torch.stft's output is time-major in memory, so the
    transpose is free and every pass reads contiguous rows.
    """
    spec = spec.transpose(1, 2)[..., :n_used]  # [B, F, n_used] complex
    if spec.device.type == "cpu" and not spec.requires_grad:
        return torch.from_numpy(np.abs(spec.numpy()))  # [B, F, n_used] float32
    parts = torch.view_as_real(spec)  # [B, F, n_used, 2]
    power = parts.square()  # [B, F, n_used, 2]
    # The floor keeps the gradient finite where a bin is exactly 0 (sqrt'(0) is infinite:
    # one silent bin of a vocoder's output made every weight NaN); 1e-30 of power is far
    # below audio.log_floor, so features do not change.
    return (power[..., 0] + power[..., 1]).clamp(min=1e-30).sqrt()  # [B, F, n_used]


class MelSpectrogram(nn.Module):
    """Batched log-mel: ``forward(wav [B, T], lengths [B] | None) -> (log_mel [B, F, n_mels],
    n_frames [B])``; a 1-D wav gives ``([F, n_mels], n_frames 0-d)``.

    Per-clip reflect padding (index maps over the borders only) and one STFT call per batch,
    no Python loop over clips and no host sync, so it can run on the GPU inside a data pipeline. The window and
    filterbank are non-persistent buffers: ``.to(device)`` moves them, checkpoints skip them.
    Always computes in float32 (autocast is switched off inside) because features must not
    depend on the caller's precision. Padding frames (index >= n_frames[b]) are 0.0.
    ``lengths`` must lie in 1..T (not checked: a check would need a host sync).

    Speed (CPU prepare spends most of its time here): magnitudes only for bins below fmax
    (``_stft_magnitude``), a banded filterbank product on CPU (``_band_blocks``), and a
    plain mirror copy instead of the index maps when no ``lengths`` are given.
    """

    window: torch.Tensor
    mel_basis: torch.Tensor

    def __init__(self, cfg: AudioConfig):
        super().__init__()
        self.n_fft, self.hop_length, self.win_length = cfg.n_fft, cfg.hop_length, cfg.win_length
        self.n_mels, self.log_floor = cfg.n_mels, float(cfg.log_floor)
        self.register_buffer("window", torch.hann_window(cfg.win_length, periodic=True),
                             persistent=False)  # [win_length]
        basis = mel_filterbank(cfg)  # [n_freqs, n_mels]
        self.register_buffer("mel_basis", basis, persistent=False)
        self.n_used_freqs, self.band_blocks = _band_blocks(basis)

    def _filterbank(self, mag: torch.Tensor) -> torch.Tensor:
        """mag [B, F, n_used] -> mel [B, F, n_mels]. Banded on CPU (fewer flops); one dense
        product elsewhere (on a GPU the extra kernel launches would cost more than the zeros).
        Where float32 matrix products may run in TF32 (training turns it on for its own
        speed; the flag is process-wide), the product runs in float64: TF32's 10-bit mantissa
        would move GPU features ~1e-3 away from the store's and inference's."""
        basis = self.mel_basis[: self.n_used_freqs]  # [n_used, n_mels]
        if mag.device.type != "cpu":
            if mag.device.type == "cuda" and torch.get_float32_matmul_precision() != "highest":
                return (mag.double() @ basis.double()).float()
            return mag @ basis
        return torch.cat([mag[..., f_lo:f_hi] @ basis[f_lo:f_hi, lo:hi]
                          for lo, hi, f_lo, f_hi in self.band_blocks], dim=-1)

    def magnitude(self, wav: torch.Tensor, lengths: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """Linear mel magnitude (before clamp and log): wav [B, T] -> ([B, F, n_mels], n_frames [B]).

        Frames past a clip's n_frames are NOT masked here (``forward`` masks after the log).
        """
        if wav.dim() != 2 or wav.shape[1] == 0:
            raise ValueError(f"MelSpectrogram expects wav [B, T] or [T] with T > 0, got {tuple(wav.shape)}")
        batch, n_samples = wav.shape
        pad = self.n_fft // 2
        with torch.autocast(device_type=wav.device.type, enabled=False):
            wav = wav.float()
            if lengths is None and n_samples > pad:
                # Every clip fills its row: a plain mirror of each end is numpy's 'reflect'
                # (two small flips + one copy; ~2x faster than F.pad's reflect kernel).
                padded = torch.cat([wav[:, 1:pad + 1].flip(1), wav,
                                    wav[:, -pad - 1:-1].flip(1)], dim=1)  # [B, T + 2*pad]
            else:
                if lengths is None:  # shorter than the pad: needs repeated reflection
                    lengths = torch.full((batch,), n_samples, dtype=torch.long, device=wav.device)
                lengths = lengths.to(device=wav.device, dtype=torch.long)  # [B]
                padded = reflect_pad(wav, lengths, pad)  # [B, T + 2*pad]
            spec = torch.stft(padded, self.n_fft, self.hop_length, self.win_length, self.window,
                              center=False, return_complex=True)  # [B, n_freqs, F]
            mel = self._filterbank(_stft_magnitude(spec, self.n_used_freqs))  # [B, F, n_mels]
        if lengths is None:
            n_frames = torch.full((batch,), mel.shape[1], dtype=torch.long, device=wav.device)
        else:
            n_frames = frames_for_samples(lengths, self.n_fft, self.hop_length)  # [B]
        return mel, n_frames

    def forward(self, wav: torch.Tensor, lengths: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        single = wav.dim() == 1
        mel, n_frames = self.magnitude(wav[None] if single else wav, lengths)  # [B, F, n_mels]
        log_mel = mel.clamp(min=self.log_floor).log()  # [B, F, n_mels]
        if lengths is not None:  # without lengths every clip fills all frames: nothing to mask
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
