"""GAN discriminators of the neural vocoder: multi-period (waveform) + multi-resolution
(spectrogram), as Vocos trains with.

Why two kinds: each sees a failure the other misses. ``MultiPeriodDiscriminator`` (HiFi-GAN)
folds the waveform into ``[T / p, p]`` for prime periods p and convolves along time only,
so pitch and phase coherence are judged on samples. ``MultiResolutionDiscriminator``
(UnivNet) judges log-magnitude spectrograms at three resolutions, where over-smoothed
harmonics and metallic artefacts show; its spectrograms run in float32 (a bf16 STFT is
noisier than the artefacts). Every conv is weight-normalised, a batch-independent way to
keep a least-squares discriminator's scale in check. Each sub-discriminator returns logits
``[B, N]`` and its hidden activations (the feature-matching loss's maps).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.parametrizations import weight_norm

from myxtts.config import AudioConfig, VocoderConfig

LEAKY_SLOPE = 0.1
_POWER_FLOOR = 1e-10  # |X|^2 floor: log magnitude >= log(1e-5), gradients stay finite at 0


def stft_resolutions(audio: AudioConfig) -> list[tuple[int, int]]:
    """(n_fft, hop) of the three spectrogram resolutions: half, equal to and twice the
    feature STFT (``audio.n_fft``, ``audio.hop_length``); Hann windows as long as n_fft."""
    n_fft, hop = audio.n_fft, audio.hop_length
    return [(n_fft // 2, max(hop // 2, 1)), (n_fft, hop), (2 * n_fft, 2 * hop)]


def log_magnitude(wav: Tensor, n_fft: int, hop: int, window: Tensor) -> Tensor:
    """Centred log |STFT| in float32: wav ``[B, T]`` -> ``[B, frames, n_fft // 2 + 1]``.

    Reflect padding where the clip is long enough for it, zeros otherwise (very short clips).
    """
    pad_mode = "reflect" if wav.shape[-1] > n_fft // 2 else "constant"
    with torch.autocast(device_type=wav.device.type, enabled=False):
        spec = torch.stft(wav.float(), n_fft, hop, window=window, center=True, pad_mode=pad_mode,
                          return_complex=True)  # [B, freqs, frames]
        power = torch.view_as_real(spec).square().sum(-1)  # [B, freqs, frames]
        return 0.5 * power.clamp(min=_POWER_FLOOR).log().transpose(1, 2)  # [B, frames, freqs]


class PeriodDiscriminator(nn.Module):
    """One period p: wav ``[B, T]`` -> (logits ``[B, N]``, 5 feature maps ``[B, C, H, p]``).

    Channels c, 4c, 16c, 32c with stride 3 along folded time, then a 32c stride-1 conv and a
    1-channel output conv (HiFi-GAN's layout with c = channels).
    """

    def __init__(self, period: int, channels: int) -> None:
        super().__init__()
        self.period = period
        top = 32 * channels
        widths = [1] + [min(channels * 4**i, top) for i in range(4)]  # 1, c, 4c, 16c, 32c
        convs = [nn.Conv2d(c_in, c_out, (5, 1), (3, 1), padding=(2, 0))
                 for c_in, c_out in zip(widths[:-1], widths[1:], strict=True)]
        convs.append(nn.Conv2d(top, top, (5, 1), 1, padding=(2, 0)))
        self.convs = nn.ModuleList(weight_norm(conv) for conv in convs)
        self.out = weight_norm(nn.Conv2d(top, 1, (3, 1), 1, padding=(1, 0)))

    def forward(self, wav: Tensor) -> tuple[Tensor, list[Tensor]]:  # wav [B, T]
        batch, n_samples = wav.shape
        extra = (-n_samples) % self.period
        x = wav[:, None]  # [B, 1, T]
        if extra:  # reflect-pad to a multiple of the period (extra < p <= T for any real clip)
            x = F.pad(x, (0, extra), mode="reflect" if extra < n_samples else "constant")
        x = x.reshape(batch, 1, -1, self.period)  # [B, 1, T' / p, p]
        features = []
        for conv in self.convs:
            x = F.leaky_relu(conv(x), LEAKY_SLOPE)  # [B, C, H, p]
            features.append(x)
        return self.out(x).flatten(1), features  # [B, H * p]


class MultiPeriodDiscriminator(nn.Module):
    """``forward(wav [B, T]) -> (logits: list[[B, N]], features: list[list[Tensor]])``, one
    entry per period."""

    def __init__(self, periods: list[int], channels: int) -> None:
        super().__init__()
        if not periods or any(p < 1 for p in periods):
            raise ValueError(f"vocoder.periods must be a non-empty list of periods >= 1, got {periods}")
        self.discriminators = nn.ModuleList(PeriodDiscriminator(p, channels) for p in periods)

    def forward(self, wav: Tensor) -> tuple[list[Tensor], list[list[Tensor]]]:
        outputs = [d(wav) for d in self.discriminators]
        return [logits for logits, _ in outputs], [features for _, features in outputs]


class ResolutionDiscriminator(nn.Module):
    """One STFT resolution: wav ``[B, T]`` -> (logits ``[B, N]``, 5 feature maps).

    Input ``[B, 1, frames, freqs]`` log magnitude; convs (3, 9) that halve the frequency axis
    three times (UnivNet), a (3, 3) conv, then a 1-channel (3, 3) output conv.
    """

    window: Tensor

    def __init__(self, n_fft: int, hop: int, channels: int) -> None:
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        self.register_buffer("window", torch.hann_window(n_fft, periodic=True), persistent=False)
        convs = [nn.Conv2d(1, channels, (3, 9), padding=(1, 4))]
        convs += [nn.Conv2d(channels, channels, (3, 9), stride=(1, 2), padding=(1, 4))
                  for _ in range(3)]
        convs.append(nn.Conv2d(channels, channels, (3, 3), padding=(1, 1)))
        self.convs = nn.ModuleList(weight_norm(conv) for conv in convs)
        self.out = weight_norm(nn.Conv2d(channels, 1, (3, 3), padding=(1, 1)))

    def forward(self, wav: Tensor) -> tuple[Tensor, list[Tensor]]:  # wav [B, T]
        x = log_magnitude(wav, self.n_fft, self.hop, self.window)[:, None]  # [B, 1, frames, freqs]
        features = []
        for conv in self.convs:
            x = F.leaky_relu(conv(x), LEAKY_SLOPE)  # [B, C, frames, freqs']
            features.append(x)
        return self.out(x).flatten(1), features  # [B, frames * freqs']


class MultiResolutionDiscriminator(nn.Module):
    """``forward(wav [B, T]) -> (logits, features)``, one entry per resolution of
    ``stft_resolutions(audio)``."""

    def __init__(self, audio: AudioConfig, channels: int) -> None:
        super().__init__()
        self.discriminators = nn.ModuleList(ResolutionDiscriminator(n_fft, hop, channels)
                                            for n_fft, hop in stft_resolutions(audio))

    def forward(self, wav: Tensor) -> tuple[list[Tensor], list[list[Tensor]]]:
        outputs = [d(wav) for d in self.discriminators]
        return [logits for logits, _ in outputs], [features for _, features in outputs]


class Discriminators(nn.Module):
    """Both discriminators: ``forward(wav [B, T]) -> (logits, features)`` with the
    multi-period entries first, then the multi-resolution ones
    (``len(cfg.periods) + 3`` sub-discriminators). Real and fake waves may be concatenated
    along the batch for one pass: every layer treats batch rows independently."""

    def __init__(self, audio: AudioConfig, cfg: VocoderConfig) -> None:
        super().__init__()
        self.mpd = MultiPeriodDiscriminator(list(cfg.periods), cfg.disc_channels)
        self.mrd = MultiResolutionDiscriminator(audio, cfg.disc_channels)

    def forward(self, wav: Tensor) -> tuple[list[Tensor], list[list[Tensor]]]:
        if wav.dim() != 2:
            raise ValueError(f"Discriminators expect wav [B, T], got {tuple(wav.shape)}")
        period_logits, period_features = self.mpd(wav)
        resolution_logits, resolution_features = self.mrd(wav)
        return period_logits + resolution_logits, period_features + resolution_features
