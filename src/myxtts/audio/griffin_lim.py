"""Griffin-Lim: log-mel -> waveform by signal processing alone, the inverse of ``audio.mel``.

A vocoder that needs no training: it inverts the one mel definition with its own filterbank
and framing, so it voices any mel the TTS model predicts. Synthesis and training samples use
it when no neural vocoder is given, vocoder validation measures against it, and it shares
the neural vocoder's ``forward`` / ``waveforms`` contract. Steps: exp; mel -> linear by a
non-negative pseudo-inverse refined by multiplicative NNLS updates (Lee & Seung); fast
Griffin-Lim with momentum (Perraudin et al. 2013) on ``MelSpectrogram``'s frame grid. Cost:
``n_iter`` (32) STFT pairs plus ``nnls_iter`` (20) filterbank updates, about 25x faster than
real time on one CPU core at 22.05 kHz, no weights. Quality: the phase is estimated, so
speech is intelligible but robotic; a trained neural vocoder sounds closer to the recording.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor, nn

from myxtts.audio.mel import mel_filterbank
from myxtts.config import AudioConfig


class GriffinLim(nn.Module):
    """``forward(log_mel [B, F, n_mels], lengths [B] | None) -> wav [B, F * hop_length]``;
    a 2-D ``[F, n_mels]`` input gives ``wav [F * hop_length]``.

    Utterance b gets ``lengths[b] * hop_length`` samples (a clip that long has
    ``1 + n_samples // hop_length = lengths[b] + 1`` mel frames: the frame count to within
    one); samples past it are zero, so ``wav[b, : lengths[b] * hop_length]`` is the clip.
    Padding frames (>= lengths[b]) are treated as silence, whatever their values.
    """

    window: Tensor
    filterbank: Tensor
    pinv: Tensor

    def __init__(self, audio_cfg: AudioConfig, n_iter: int = 32, momentum: float = 0.99,
                 nnls_iter: int = 20, seed: int = 0) -> None:
        super().__init__()
        if n_iter < 1 or not 0.0 <= momentum < 1.0:
            raise ValueError(f"GriffinLim needs n_iter >= 1 and momentum in [0, 1), got "
                             f"n_iter={n_iter}, momentum={momentum}")
        self.n_fft, self.hop_length = audio_cfg.n_fft, audio_cfg.hop_length
        self.win_length = audio_cfg.win_length
        self.n_iter, self.momentum, self.nnls_iter, self.seed = n_iter, momentum, nnls_iter, seed
        fb = mel_filterbank(audio_cfg)  # [n_freqs, n_mels]
        self.register_buffer("window", torch.hann_window(self.win_length, periodic=True),
                             persistent=False)
        self.register_buffer("filterbank", fb, persistent=False)
        self.register_buffer("pinv", torch.linalg.pinv(fb.double()).float(),
                             persistent=False)  # [n_mels, n_freqs]

    def mel_to_linear(self, mel: Tensor) -> Tensor:
        """Mel magnitude [B, F, n_mels] -> linear magnitude [B, F, n_freqs], all >= 0."""
        linear = (mel @ self.pinv).clamp(min=0.0) + 1e-8  # [B, F, n_freqs]
        fb = self.filterbank  # [n_freqs, n_mels]
        numer = (mel @ fb.T).clamp(min=0.0)  # [B, F, n_freqs], fixed
        for _ in range(self.nnls_iter):  # multiplicative NNLS: stays >= 0, error never rises
            linear = linear * numer / ((linear @ fb) @ fb.T + 1e-10)  # via mel space: cheap
        return linear

    def _stft(self, wav: Tensor) -> Tensor:  # [B, S] -> [B, n_freqs, F] complex
        return torch.stft(wav, self.n_fft, self.hop_length, self.win_length, self.window,
                          center=True, pad_mode="reflect", return_complex=True)

    def _istft(self, spec: Tensor, n_samples: int) -> Tensor:  # [B, n_freqs, F] -> [B, S]
        return torch.istft(spec, self.n_fft, self.hop_length, self.win_length, self.window,
                           center=True, length=n_samples)

    @torch.no_grad()
    def forward(self, log_mel: Tensor, lengths: Tensor | None = None) -> Tensor:
        single = log_mel.dim() == 2
        if single:
            log_mel = log_mel[None]
        if log_mel.dim() != 3 or log_mel.shape[-1] != self.filterbank.shape[1]:
            raise ValueError(f"GriffinLim expects log-mel [B, frames, {self.filterbank.shape[1]}] "
                             f"(audio.n_mels), got {tuple(log_mel.shape)}")
        b, n_frames, _ = log_mel.shape
        if lengths is None:
            lengths = torch.full((b,), n_frames, dtype=torch.long, device=log_mel.device)
        lengths = lengths.to(log_mel.device)
        frame_mask = torch.arange(n_frames, device=log_mel.device)[None] < lengths[:, None]
        with torch.autocast(device_type=log_mel.device.type, enabled=False):
            mel = log_mel.float().exp() * frame_mask[..., None]  # [B, F, n_mels]; padding silent
            mag = self.mel_to_linear(mel).transpose(1, 2)  # [B, n_freqs, F]
            wav = self._griffin_lim(mag)  # [B, F * hop]
        n_samples = lengths * self.hop_length  # [B]
        wav = wav * (torch.arange(wav.shape[1], device=wav.device)[None] < n_samples[:, None])
        return wav[0] if single else wav

    def _griffin_lim(self, mag: Tensor) -> Tensor:
        """Fast Griffin-Lim: mag [B, n_freqs, F] -> wav [B, F * hop_length].

        Iterates on (F - 1) * hop samples, whose centred STFT has exactly F frames; the final
        inverse also fills the last hop, which the last frame's window still covers.
        """
        n_frames = mag.shape[-1]
        n_samples = (n_frames - 1) * self.hop_length
        gen = torch.Generator(device="cpu").manual_seed(self.seed)
        phase = torch.rand(mag.shape, generator=gen).to(mag.device) * (2 * math.pi)
        estimate = torch.polar(torch.ones_like(mag), phase)  # unit phasors [B, n_freqs, F]
        previous = None
        for _ in range(self.n_iter):
            unit = estimate / estimate.abs().clamp(min=1e-8)
            consistent = self._stft(self._istft(mag * unit, n_samples))  # projection onto STFTs
            if previous is None:
                estimate = consistent
            else:  # momentum: extrapolate along the last step (Perraudin et al.)
                estimate = consistent + self.momentum * (consistent - previous)
            previous = consistent
        unit = estimate / estimate.abs().clamp(min=1e-8)
        return self._istft(mag * unit, n_frames * self.hop_length)

    def waveforms(self, log_mel: Tensor, lengths: Tensor) -> list[np.ndarray]:
        """float32 numpy clips, one per utterance, each cut to its own ``lengths[b] *
        hop_length`` samples: what synthesis and validation samples save and listen to."""
        wav = self(log_mel.float(), lengths)  # [B, F * hop]
        return [wav[b, : int(lengths[b]) * self.hop_length].float().cpu().numpy()
                for b in range(wav.shape[0])]
