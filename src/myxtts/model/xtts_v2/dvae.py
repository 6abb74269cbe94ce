"""XTTS-v2's discrete VAE (the released ``dvae.pth``): it turns an 80-band mel into the audio
codes the GPT is trained to predict, one code per 4 mel frames (1024 samples at 22.05 kHz).

Inference never needs it (the GPT makes codes, the HiFi-GAN decodes its latents); training
the GPT does, to make the target codes of each clip: :meth:`XttsDvae.codes`. The network is
the one XTTS's GPT trainer builds: two stride-2 convs (80 -> 512 -> 1024 channels), three
residual blocks, a 1x1 conv to the 512-d codebook space, nearest of 1024 codebook vectors.
The decoder (codes -> mel: three residual blocks, two nearest-neighbour x2 upsamplings) is
built for the file's keys and :meth:`XttsDvae.decode`; the codebook's moving-average
training update is not implemented (the DVAE is frozen when the GPT trains).

Parameter and buffer names are ``dvae.pth``'s, so the released file loads with
``strict=True``, the training-time statistics (``codebook.cluster_size/embed_avg``,
``discrete_loss.accumulator*``) included: they are kept, unused, so that the file round
trips.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

N_MELS = 80
NUM_TOKENS = 1024
CODEBOOK_DIM = 512
HIDDEN = 512
RESBLOCKS = 3
USAGE_STEPS = 100  # rows of the reference's code-usage history (discrete_loss.accumulator)


class XttsDvaeResBlock(nn.Module):
    """``x + f(x)`` with ``f`` = conv3, ReLU, conv3, ReLU, conv1 at constant width."""

    def __init__(self, channels: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv1d(channels, channels, 3, padding=1), nn.ReLU(),
            nn.Conv1d(channels, channels, 3, padding=1), nn.ReLU(),
            nn.Conv1d(channels, channels, 1))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x) + x


class XttsDvaeUpConv(nn.Module):
    """Nearest-neighbour x2 upsampling then a kernel-3 conv (the DVAE's decoder was trained
    without transposed convs). ``[B, C_in, T] -> [B, C_out, 2T]``."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.interpolate(x, scale_factor=2, mode="nearest"))


class XttsDvaeCodebook(nn.Module):
    """The vector quantiser: ``embed [dim, n]`` holds one code vector per column. The
    moving-average statistics of its training (``cluster_size``, ``embed_avg``) are kept
    for the file only."""

    def __init__(self, dim: int = CODEBOOK_DIM, n_codes: int = NUM_TOKENS):
        super().__init__()
        embed = torch.randn(dim, n_codes)
        self.register_buffer("embed", embed)
        self.register_buffer("cluster_size", torch.zeros(n_codes))
        self.register_buffer("embed_avg", embed.clone())

    def nearest(self, latents: Tensor) -> Tensor:
        """``[..., dim]`` -> ``[...]`` index of the nearest code vector (squared L2).

        The distance keeps the ``|x|^2`` term and the reference's order of operations
        although the argmin does not depend on it mathematically: in float32 it moves the
        rounding, and a near tie would otherwise pick another code."""
        flat = latents.reshape(-1, self.embed.shape[0])
        dist = (flat.pow(2).sum(1, keepdim=True) - 2 * flat @ self.embed
                + self.embed.pow(2).sum(0, keepdim=True))
        _, index = (-dist).max(1)
        return index.view(latents.shape[:-1])

    def lookup(self, codes: Tensor) -> Tensor:
        """``[...]`` codes -> ``[..., dim]`` code vectors."""
        return F.embedding(codes, self.embed.t())


class XttsDvaeUsage(nn.Module):
    """The reference's code-usage history (a training loss's state): buffers only, so that
    ``dvae.pth`` loads strictly and is written back unchanged."""

    def __init__(self, n_codes: int = NUM_TOKENS, steps: int = USAGE_STEPS):
        super().__init__()
        self.register_buffer("accumulator_index", torch.zeros(1, dtype=torch.long))
        self.register_buffer("accumulator_filled", torch.zeros(1, dtype=torch.long))
        self.register_buffer("accumulator", torch.zeros(steps, n_codes))


class XttsDvae(nn.Module):
    """Mel ``[B, 80, F]`` (:func:`myxtts.model.xtts_v2.features.dvae_mel`) <-> codes
    ``[B, ceil(F / 4)]`` in ``[0, 1024)``.

    Each stride-2 conv maps ``n`` frames to ``ceil(n / 2)`` (kernel 3, padding 1), so a mel
    of ``F`` frames gives ``ceil(ceil(F / 2) / 2)`` codes, the last ones seeing zero
    padding past the clip's end, as in the reference's training data. Cost: ~0.5 G
    multiply-adds per second of audio (the 1024-wide residual blocks at 1/4 frame rate)."""

    def __init__(self, n_codes: int = NUM_TOKENS):
        super().__init__()
        wide = 2 * HIDDEN
        self.encoder = nn.Sequential(
            nn.Sequential(nn.Conv1d(N_MELS, HIDDEN, 3, stride=2, padding=1), nn.ReLU()),
            nn.Sequential(nn.Conv1d(HIDDEN, wide, 3, stride=2, padding=1), nn.ReLU()),
            *(XttsDvaeResBlock(wide) for _ in range(RESBLOCKS)),
            nn.Conv1d(wide, CODEBOOK_DIM, 1))
        self.decoder = nn.Sequential(
            nn.Conv1d(CODEBOOK_DIM, wide, 1),
            *(XttsDvaeResBlock(wide) for _ in range(RESBLOCKS)),
            nn.Sequential(XttsDvaeUpConv(wide, wide), nn.ReLU()),
            nn.Sequential(XttsDvaeUpConv(wide, HIDDEN), nn.ReLU()),
            nn.Conv1d(HIDDEN, N_MELS, 1))
        self.codebook = XttsDvaeCodebook(CODEBOOK_DIM, n_codes)
        self.discrete_loss = XttsDvaeUsage(n_codes)

    @torch.no_grad()
    def codes(self, mel: Tensor) -> Tensor:
        """``[B, 80, F]`` normalised log mel -> ``[B, ceil(F / 4)]`` long codes. Nothing in
        the encoder depends on train/eval mode and nothing is updated, so this is the
        reference's ``get_codebook_indices`` in either mode."""
        latents = self.encoder(mel).transpose(1, 2)  # [B, F/4, 512]
        return self.codebook.nearest(latents)

    def decode(self, codes: Tensor) -> Tensor:
        """``[B, T]`` codes -> reconstructed mel ``[B, 80, 4T]``."""
        return self.decoder(self.codebook.lookup(codes).transpose(1, 2))
