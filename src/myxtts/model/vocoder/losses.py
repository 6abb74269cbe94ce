"""Losses of the neural vocoder's GAN training, and its spectral quality metric.

Why these: least-squares GAN (Mao et al. 2017, as HiFi-GAN and Vocos): gradients do not
vanish when the discriminator is confident, and logits of any shape are just averaged.
Feature matching (MelGAN): L1 between hidden activations tells the generator *what* differs.
Mel L1 on the project's own ``MelSpectrogram``: the vocoder learns to invert exactly the
feature the TTS model predicts. Multi-resolution STFT loss (Parallel WaveGAN): spectral
convergence + log-magnitude error at three resolutions; fast early training, and the metric
``stft_distance``. Everything spectral runs in float32 with autocast off, so losses do not
depend on the training precision; every function averages, so scales do not change with
the number of periods or layers.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from myxtts.audio.mel import MelSpectrogram
from myxtts.config import AudioConfig

_POWER_FLOOR = 1e-10  # |X|^2 floor: magnitude >= 1e-5, sqrt/log gradients stay finite
_SC_FLOOR = 1e-7  # spectral convergence denominator floor (an all-silent real clip)


def discriminator_loss(real_logits: list[Tensor], fake_logits: list[Tensor]) -> Tensor:
    """Least-squares discriminator loss: mean over sub-discriminators of
    ``mean((1 - D(real))^2) + mean(D(fake)^2)``. Pass fakes detached from the generator."""
    terms = [(1.0 - real.float()).square().mean() + fake.float().square().mean()
             for real, fake in zip(real_logits, fake_logits, strict=True)]
    return torch.stack(terms).mean()


def generator_adv_loss(fake_logits: list[Tensor]) -> Tensor:
    """Least-squares generator loss: mean over sub-discriminators of ``mean((1 - D(fake))^2)``."""
    return torch.stack([(1.0 - fake.float()).square().mean() for fake in fake_logits]).mean()


def feature_matching_loss(real_feats: list[list[Tensor]], fake_feats: list[list[Tensor]]) -> Tensor:
    """Mean over every feature map of every sub-discriminator of ``mean|real - fake|``;
    the real maps are detached (targets, not trained through this loss)."""
    terms = [(real.detach().float() - fake.float()).abs().mean()
             for reals, fakes in zip(real_feats, fake_feats, strict=True)
             for real, fake in zip(reals, fakes, strict=True)]
    return torch.stack(terms).mean()


def _resolutions(audio: AudioConfig) -> list[tuple[int, int]]:
    """(n_fft, hop): half, equal to and twice the feature STFT, the same three resolutions
    the multi-resolution discriminator uses (restated here so that this module depends only
    on the config and the mel)."""
    n_fft, hop = audio.n_fft, audio.hop_length
    return [(n_fft // 2, max(hop // 2, 1)), (n_fft, hop), (2 * n_fft, 2 * hop)]


def _magnitude(wav: Tensor, n_fft: int, hop: int, window: Tensor) -> Tensor:
    """Centred |STFT| (float32, floored at 1e-5): wav [B, T] -> [B, freqs, frames]."""
    pad_mode = "reflect" if wav.shape[-1] > n_fft // 2 else "constant"
    spec = torch.stft(wav.float(), n_fft, hop, window=window, center=True, pad_mode=pad_mode,
                      return_complex=True)  # [B, freqs, frames]
    return torch.view_as_real(spec).square().sum(-1).clamp(min=_POWER_FLOOR).sqrt()


class MultiResolutionSTFTLoss(nn.Module):
    """``forward(wav_fake [B, T], wav_real [B, T]) -> scalar``: spectral convergence +
    mean |log magnitude difference|, averaged over three resolutions.

    Spectral convergence is ``||real| - |fake||_F / ||real||_F`` per utterance, then averaged
    over the batch (so a loud clip does not outweigh a quiet one). Gradients flow to
    ``wav_fake``; ``wav_real`` is a target.
    """

    def __init__(self, audio: AudioConfig) -> None:
        super().__init__()
        self.resolutions = _resolutions(audio)
        for i, (n_fft, _) in enumerate(self.resolutions):
            self.register_buffer(f"window{i}", torch.hann_window(n_fft, periodic=True),
                                 persistent=False)  # [n_fft]

    def forward(self, wav_fake: Tensor, wav_real: Tensor) -> Tensor:
        if wav_fake.shape != wav_real.shape:
            raise ValueError(f"MultiResolutionSTFTLoss needs equal shapes, got "
                             f"{tuple(wav_fake.shape)} and {tuple(wav_real.shape)}")
        if wav_fake.dim() == 1:
            wav_fake, wav_real = wav_fake[None], wav_real[None]
        total = wav_fake.new_zeros((), dtype=torch.float32)
        with torch.autocast(device_type=wav_fake.device.type, enabled=False):
            for i, (n_fft, hop) in enumerate(self.resolutions):
                window = getattr(self, f"window{i}")
                fake = _magnitude(wav_fake, n_fft, hop, window)  # [B, freqs, frames]
                real = _magnitude(wav_real.detach(), n_fft, hop, window)  # [B, freqs, frames]
                diff_norm = (real - fake).flatten(1).norm(dim=1)  # [B]
                real_norm = real.flatten(1).norm(dim=1).clamp(min=_SC_FLOOR)  # [B]
                convergence = (diff_norm / real_norm).mean()
                log_distance = (real.log() - fake.log()).abs().mean()
                total = total + convergence + log_distance
        return total / len(self.resolutions)


def mel_l1(mel_module: MelSpectrogram, wav_fake: Tensor, wav_real: Tensor) -> Tensor:
    """Mean |log-mel(fake) - log-mel(real)| with the project's one feature definition
    (``MelSpectrogram``, float32, differentiable for the fake side): wav [B, T] each."""
    if wav_fake.shape != wav_real.shape:
        raise ValueError(f"mel_l1 needs equal shapes, got {tuple(wav_fake.shape)} and "
                         f"{tuple(wav_real.shape)}")
    fake, _ = mel_module(wav_fake)  # [B, F, n_mels]
    with torch.no_grad():
        real, _ = mel_module(wav_real)  # [B, F, n_mels]
    return (fake - real).abs().mean()
