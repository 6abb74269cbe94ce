"""XTTS-v2's voice conditioning for the GPT: a mel of the cloning clip becomes 32 latent
vectors that the GPT reads as a prefix.

Two stages, parameter names equal to the released ``gpt.conditioning_encoder.*`` and
``gpt.conditioning_perceiver.*`` keys:

- :class:`MelStyleEncoder`: a 1x1 convolution from the 80 mel bins to the model width, then
  six self-attention blocks over the frames (channels-first, as tortoise wrote them).
- :class:`PerceiverResampler`: 32 learned latents that cross-attend (twice) to the frames,
  so that a clip of any length gives the same 32 vectors.

Attention runs through SDPA; its single scaling of the scores differs from the reference's
split ``q * s, k * s`` scaling only by float rounding (~1e-7 relative). The self-attention
blocks run their 1x1 convolutions as matrix products over frames-last features and hand
SDPA contiguous queries, keys and values: on the CPU a 1x1 ``Conv1d`` goes through the
generic convolution (im2col, then a product) and strided inputs send SDPA to its unfused
path, which together made the encoder the costliest part of a fine-tuning step (measured on
2 CPU cores: the block's forward and backward about twice as fast this way).

Both stages also take ``weights`` ``[B, S]``: frame ``f`` of row ``b`` stands for
``weights[b, f]`` identical frames. Every operation over frames is then weighted exactly as
the repeated frames would be (GroupNorm's statistics as weighted means; attention as a
``log(weight)`` bias on each key, since ``n`` equal keys take ``n`` times one key's share),
so a segment's silent zero-padded tail, whose frames are all the same, runs as a few
frames instead of hundreds with the same result up to float rounding and the same gradients
(``features.silent_tail_weights`` makes the weights). What it saves: fine-tuning pads every
voice segment to the longest (6 s), and the encoder's cost grows with the frames (its
attention with their square).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _group_count(channels: int) -> int:
    """The number of GroupNorm groups tortoise picks for ``channels`` (32 at any width the
    GPT uses; fewer for narrow layers, halved until it divides)."""
    groups = 8 if channels <= 16 else 16 if channels <= 64 else 32
    while channels % groups:
        groups //= 2
    if groups <= 2:
        raise ValueError(f"{channels} channels give {groups} norm groups; use a width divisible by 4")
    return groups


def weighted_group_norm(x: Tensor, norm: nn.GroupNorm, weights: Tensor) -> Tensor:
    """``norm(x)`` of ``x`` ``[B, C, S]`` whose frame ``f`` counts ``weights[:, f]`` times, in
    float32 (as ``F.group_norm``'s here). The weighted sums over frames run as matrix-vector
    products and the affine as one ``addcmul``: fewer passes over ``x`` than elementwise
    weighting (a reduced-size fine-tuning step ~5% faster on a CPU core); the variance is
    taken of the centred values, as robust as the fused kernel's."""
    b, c, _ = x.shape
    g, per_group = norm.num_groups, c // norm.num_groups
    xf = x.float()
    w = weights.float()[:, :, None]  # [B, S, 1]
    count = w.sum(dim=1) * per_group  # [B, 1]
    mean = torch.bmm(xf, w).view(b, g, per_group).sum(-1) / count  # [B, G]
    centred = xf - mean.repeat_interleave(per_group, dim=1)[:, :, None]
    var = torch.bmm(centred.square(), w).view(b, g, per_group).sum(-1) / count
    scale = torch.rsqrt(var + norm.eps).repeat_interleave(per_group, dim=1) * norm.weight.float()
    return torch.addcmul(norm.bias.float()[:, None], centred, scale[:, :, None])


class CondAttentionBlock(nn.Module):
    """Self-attention over mel frames, channels-first ``[B, C, S]``.

    The residual adds the *normalised* input, not the input (tortoise's block without its
    ``tortoise_norm`` switch, as XTTS builds it): ``out = norm(x) + proj_out(attn(norm(x)))``.
    The fused ``qkv`` convolution's output channels are laid out head by head, and inside a
    head as q, k, v (split heads before q/k/v), which the reshape below follows.
    """

    def __init__(self, channels: int, heads: int) -> None:
        super().__init__()
        if channels % heads:
            raise ValueError(f"{channels} channels do not split into {heads} heads")
        self.heads = heads
        self.norm = nn.GroupNorm(_group_count(channels), channels)
        self.qkv = nn.Conv1d(channels, channels * 3, 1)
        self.proj_out = nn.Conv1d(channels, channels, 1)

    def forward(self, x: Tensor, weights: Tensor | None = None) -> Tensor:
        b, c, s = x.shape
        # the norm runs in float32 whatever the model's dtype (as the reference's GroupNorm32)
        if weights is None:
            x_norm = F.group_norm(x.float(), self.norm.num_groups, self.norm.weight.float(),
                                  self.norm.bias.float(), self.norm.eps).to(x.dtype)
        else:
            x_norm = weighted_group_norm(x, self.norm, weights).to(x.dtype)
        frames = x_norm.transpose(1, 2)  # [B, S, C]
        qkv = F.linear(frames, self.qkv.weight[..., 0], self.qkv.bias)
        qkv = qkv.view(b, s, self.heads, 3, c // self.heads)
        q, k, v = (qkv[:, :, :, i].transpose(1, 2).contiguous() for i in range(3))  # [B, H, S, ch]
        bias = None if weights is None else weights.log().to(q.dtype)[:, None, None, :]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias).transpose(1, 2).reshape(b, s, c)
        return x_norm + F.linear(out, self.proj_out.weight[..., 0], self.proj_out.bias).transpose(1, 2)


class MelStyleEncoder(nn.Module):
    """The cloning mel ``[B, 80, S]`` -> frame features ``[B, D, S]`` (``conditioning_encoder``)."""

    def __init__(self, mel_bins: int, dim: int, heads: int, blocks: int = 6) -> None:
        super().__init__()
        self.init = nn.Conv1d(mel_bins, dim, 1)
        self.attn = nn.Sequential(*(CondAttentionBlock(dim, heads) for _ in range(blocks)))

    def forward(self, mel: Tensor, weights: Tensor | None = None) -> Tensor:
        x = self.init(mel)
        for block in self.attn:
            x = block(x, weights)
        return x


class PerceiverRMSNorm(nn.Module):
    """``x / ||x|| * sqrt(dim) * gamma``: an RMS norm written through the L2 norm, whose
    1e-12 floor is the only epsilon."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = dim ** 0.5
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.normalize(x, dim=-1) * self.scale * self.gamma


class GatedGelu(nn.Module):
    """GEGLU: the second half of the features, through an exact GELU, gates the first."""

    def forward(self, x: Tensor) -> Tensor:
        x, gate = x.chunk(2, dim=-1)
        return x * F.gelu(gate)


def _perceiver_feed_forward(dim: int, mult: int) -> nn.Sequential:
    """Linear -> GEGLU -> Linear; inner width ``int(dim * mult * 2 / 3)`` keeps the
    parameter count of a plain ``mult`` MLP. A ``Sequential`` so that the keys are
    ``.0.weight`` and ``.2.weight`` as released."""
    inner = int(dim * mult * 2 / 3)
    return nn.Sequential(nn.Linear(dim, inner * 2), GatedGelu(), nn.Linear(inner, dim))


class PerceiverAttention(nn.Module):
    """Latents attend to themselves and the frames together: the keys and values are read
    from ``cat(latents, frames)``; queries from the latents alone. No biases."""

    def __init__(self, dim: int, heads: int, dim_head: int) -> None:
        super().__init__()
        self.heads = heads
        inner = heads * dim_head
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_kv = nn.Linear(dim, inner * 2, bias=False)
        self.to_out = nn.Linear(inner, dim, bias=False)

    def forward(self, latents: Tensor, frames: Tensor, bias: Tensor | None = None) -> Tensor:
        """``bias``: ``[B, 1, 1, n + S]`` added to the scores of each key (or None)."""
        b, n, _ = latents.shape
        context = torch.cat([latents, frames], dim=1)
        q = self.to_q(latents)
        k, v = self.to_kv(context).chunk(2, dim=-1)
        q, k, v = (t.view(b, t.shape[1], self.heads, -1).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)  # [B, H, n, dim_head]
        return self.to_out(out.transpose(1, 2).reshape(b, n, -1))


class PerceiverResampler(nn.Module):
    """Frame features ``[B, S, D]`` -> ``[B, num_latents, D]`` (``conditioning_perceiver``).

    Each layer is ``latents += attn(latents, frames); latents += ff(latents)``, then one
    RMS norm. The frames are not projected (the context width equals the model width).
    """

    def __init__(self, dim: int, depth: int = 2, num_latents: int = 32, dim_head: int = 64,
                 heads: int = 8, ff_mult: int = 4) -> None:
        super().__init__()
        self.latents = nn.Parameter(torch.randn(num_latents, dim) * 0.02)
        self.layers = nn.ModuleList(
            nn.ModuleList([PerceiverAttention(dim, heads, dim_head),
                           _perceiver_feed_forward(dim, ff_mult)])
            for _ in range(depth))
        self.norm = PerceiverRMSNorm(dim)

    def forward(self, frames: Tensor, weights: Tensor | None = None) -> Tensor:
        latents = self.latents.expand(frames.shape[0], -1, -1)
        bias = None
        if weights is not None:  # the latents' keys count once
            bias = F.pad(weights.log(), (latents.shape[1], 0)).to(frames.dtype)[:, None, None, :]
        for attn, ff in self.layers:
            latents = attn(latents, frames, bias) + latents
            latents = ff(latents) + latents
        return self.norm(latents)
