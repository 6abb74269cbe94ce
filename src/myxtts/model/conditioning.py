"""Conditioning encoder: reference audio -> a fixed number of voice latents.

Why a Perceiver-style resampler: references have any length (R frames, padded), but the decoder
wants a small, fixed-size summary it can attend to cheaply at every step. ``cond_latents``
learned queries cross-attend to an encoding of the reference frames (padding masked), so the
result is [B, cond_latents, d] whatever R is, and the voice is cloned from audio alone — the
model never sees a speaker id, which is what lets it clone unseen speakers.

The frame encoder is two masked convolutions (local spectral context) and ``cond_layers``
transformer layers without positions: voice identity is a property of the set of frames, not
of their order, so an order-free encoder generalises across reference crops.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from myxtts.model.layers import (
    CheckpointedBlock,
    CrossAttention,
    EncoderLayer,
    FeedForward,
    MaskedConv1d,
    RMSNorm,
    key_mask,
    lengths_to_mask,
)

RESAMPLER_LAYERS = 2  # latent cross-attention rounds; 2 lets latents refine what they gathered


class ResamplerLayer(CheckpointedBlock):
    """Latents attend to [frames; latents] (Perceiver resampler), then an MLP."""

    def __init__(self, d_model: int, n_heads: int, ff_mult: int, dropout: float) -> None:
        super().__init__()
        self.norm_q = RMSNorm(d_model)
        self.norm_kv = RMSNorm(d_model)
        self.attn = CrossAttention(d_model, n_heads, dropout)
        self.norm_ff = RMSNorm(d_model)
        self.ff = FeedForward(d_model, ff_mult, dropout)

    def forward(self, latents: Tensor, frames: Tensor, mask: Tensor) -> Tensor:
        """latents [B, C, d], frames [B, R, d], mask [B, 1, 1, R + C] -> [B, C, d]."""
        return self.checkpointed(self._block, latents, frames, mask)

    def _block(self, latents: Tensor, frames: Tensor, mask: Tensor) -> Tensor:
        q = self.norm_q(latents)
        memory = torch.cat([self.norm_kv(frames), q], dim=1)  # [B, R + C, d]
        latents = latents + self.attn(q, memory, mask)
        return latents + self.ff(self.norm_ff(latents))


class ConditioningEncoder(nn.Module):
    """Reference log-mel (normalised) [B, R, n_mels] + lengths -> latents [B, C, d]."""

    def __init__(self, n_mels: int, d_model: int, n_heads: int, ff_mult: int, n_layers: int,
                 n_latents: int, dropout: float) -> None:
        super().__init__()
        self.conv1 = MaskedConv1d(n_mels, d_model, 3)
        self.conv2 = MaskedConv1d(d_model, d_model, 3)
        self.layers = nn.ModuleList(
            EncoderLayer(d_model, n_heads, ff_mult, dropout) for _ in range(n_layers)
        )
        self.latents = nn.Parameter(torch.randn(n_latents, d_model) * 0.02)
        self.resampler = nn.ModuleList(
            ResamplerLayer(d_model, n_heads, ff_mult, dropout) for _ in range(RESAMPLER_LAYERS)
        )
        self.norm_out = RMSNorm(d_model)

    def forward(self, ref_mel: Tensor, ref_lengths: Tensor) -> Tensor:
        """ref_mel [B, R, n_mels] (normalised), ref_lengths [B] -> latents [B, C, d]."""
        b, r, _ = ref_mel.shape
        frame_mask = lengths_to_mask(ref_lengths.clamp(min=1), r)  # [B, R]
        x = torch.nn.functional.gelu(self.conv1(ref_mel, frame_mask))  # [B, R, d]
        # contiguous: the conv hands back a transposed view, and the text encoder's blocks
        # get contiguous input; one memory layout lets a compiled block serve both
        x = torch.nn.functional.gelu(self.conv2(x, frame_mask)).contiguous()  # [B, R, d]
        attn_mask = key_mask(ref_lengths, r)  # [B, 1, 1, R]
        for layer in self.layers:
            x = layer(x, attn_mask)  # [B, R, d]
        n_latents = self.latents.shape[0]
        latents = self.latents[None].expand(b, -1, -1).contiguous()  # [B, C, d], real strides
        # like the later resampler layers' input (one compiled graph for all of them)
        # Keys are [frames; latents]: latents are always real, frames masked by length.
        full_mask = torch.cat(
            [attn_mask, attn_mask.new_ones(b, 1, 1, n_latents)], dim=-1
        )  # [B, 1, 1, R + C]
        for layer in self.resampler:
            latents = layer(latents, x, full_mask)  # [B, C, d]
        return self.norm_out(latents)  # [B, C, d]
