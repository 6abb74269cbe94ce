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

Frames can also be weighted: frame ``f`` of a row stands for ``w_f`` identical frames.
Every operation over frames is then weighted exactly as the repeated frames would be
(GroupNorm's statistics as weighted means; attention as a ``log(w)`` bias on each key, since
``n`` equal keys take ``n`` times one key's share; a weight of 0 hides a frame), so a
segment's silent zero-padded tail, whose frames are all the same, runs as one frame instead
of hundreds with the same result up to float rounding and the same gradients
(``features.silent_tail_weights`` makes the weights). What it saves: fine-tuning pads every
voice segment to the longest (6 s), and the encoder's cost grows with the frames (its
attention with their square). The encoder then takes the rows, each cut to its own frames,
packed end to end (:class:`PackedRows`): no row is padded to another's length, and each
projection is one matrix product over all of them; the Perceiver takes them padded again
(``weights [B, S]``, 0 on the padding), its attention being 32 queries only.
"""

from __future__ import annotations

from typing import NamedTuple

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


class PackedRows(NamedTuple):
    """Rows of frames of different lengths laid end to end in one sequence, frames first
    (``[N, C]`` features, ``N = sum(lengths)``), each frame weighted (module docstring).

    ``weights [N]``: how many identical frames each frame stands for; ``columns [B, N]``:
    row ``b`` holds the weights of row ``b``'s frames, 0 elsewhere (the weighted sums per
    row as one matrix product); ``spread [N, B]``: 1 where a frame belongs to a row (a
    value per row to its frames as one matrix product, a cheaper backward than indexing);
    ``lengths``: frames per row (host ints); ``biases``: per row, the attention's
    ``log(weight)`` bias on its keys ``[1, 1, 1, L]``, or None where every weight is 1."""

    weights: Tensor
    columns: Tensor
    spread: Tensor
    lengths: tuple[int, ...]
    biases: tuple[Tensor | None, ...]

    @classmethod
    def of(cls, weights: list[Tensor]) -> PackedRows:
        """The packing of rows whose frames have these ``weights`` (one ``[L_b]`` per row)."""
        lengths = tuple(int(w.shape[0]) for w in weights)
        flat = torch.cat(weights).float()
        rows = torch.arange(len(lengths), device=flat.device)
        spread = (torch.repeat_interleave(rows, torch.tensor(lengths, device=flat.device))[:, None]
                  == rows[None]).float()
        biases = tuple(None if bool((w == 1).all()) else w.float().log()[None, None, None, :]
                       for w in weights)
        return cls(flat, spread.t() * flat[None], spread, lengths, biases)


def packed_group_norm(x: Tensor, norm: nn.GroupNorm, packed: PackedRows) -> Tensor:
    """``norm`` of each row of the packed ``x`` ``[N, C]`` with its frames weighted, in
    float32 (as ``F.group_norm``'s here). The weighted sums over each row's frames run as one
    matrix product with ``packed.columns``, the per-row values go back to the frames as one
    with ``packed.spread``, the affine is one ``addcmul``; the variance is taken of the
    centred values, as robust as the fused kernel's."""
    c, g, rows = x.shape[1], norm.num_groups, packed.columns.shape[0]
    per_group = c // g
    xf = x.float()
    count = packed.columns.sum(dim=1, keepdim=True) * per_group  # [B, 1]
    mean = (packed.columns @ xf).view(rows, g, per_group).sum(-1) / count  # [B, G]
    centred = torch.addmm(xf, packed.spread, mean.repeat_interleave(per_group, dim=1), alpha=-1)
    var = (packed.columns @ centred.square()).view(rows, g, per_group).sum(-1) / count
    scale = torch.rsqrt(var + norm.eps).repeat_interleave(per_group, dim=1) * norm.weight.float()
    return torch.addcmul(norm.bias.float(), centred, packed.spread @ scale)


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

    def forward(self, x: Tensor) -> Tensor:
        b, c, s = x.shape
        # the norm runs in float32 whatever the model's dtype (as the reference's GroupNorm32)
        x_norm = F.group_norm(x.float(), self.norm.num_groups, self.norm.weight.float(),
                              self.norm.bias.float(), self.norm.eps).to(x.dtype)
        frames = x_norm.transpose(1, 2)  # [B, S, C]
        qkv = F.linear(frames, self.qkv.weight[..., 0], self.qkv.bias)
        qkv = qkv.view(b, s, self.heads, 3, c // self.heads)
        q, k, v = qkv.permute(3, 0, 2, 1, 4).contiguous().unbind(0)  # [B, H, S, ch] each
        out = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, c)
        return x_norm + F.linear(out, self.proj_out.weight[..., 0], self.proj_out.bias).transpose(1, 2)

    def packed(self, x: Tensor, packed: PackedRows) -> Tensor:
        """The block over the rows of ``packed``, ``x`` ``[N, C]`` frames first: the norm per
        row, the projections over every frame at once (one matrix product each, weight
        gradients included), the attention per row on strided views of the projection (no
        copy; SDPA's CPU kernel takes any strides but the last). What it saves against a
        pass per row: fewer, larger matrix products (their kernels faster on taller inputs)
        and each parameter's gradient made once instead of summed over the rows."""
        n, c = x.shape
        x_norm = packed_group_norm(x, self.norm, packed).to(x.dtype)
        qkv = F.linear(x_norm, self.qkv.weight[..., 0], self.qkv.bias)
        qkv = qkv.view(n, self.heads, 3, c // self.heads)
        outs = []  # [1, H, L, ch] per row
        for part, bias in zip(qkv.split(packed.lengths), packed.biases):
            q, k, v = part.permute(2, 1, 0, 3)[:, None].unbind(0)
            outs.append(F.scaled_dot_product_attention(
                q, k, v, attn_mask=None if bias is None else bias.to(q.dtype)))
        out = torch.cat(outs, dim=2)[0].transpose(0, 1).reshape(n, c)
        return x_norm + F.linear(out, self.proj_out.weight[..., 0], self.proj_out.bias)


class MelStyleEncoder(nn.Module):
    """The cloning mel ``[B, 80, S]`` -> frame features ``[B, D, S]`` (``conditioning_encoder``)."""

    def __init__(self, mel_bins: int, dim: int, heads: int, blocks: int = 6) -> None:
        super().__init__()
        self.init = nn.Conv1d(mel_bins, dim, 1)
        self.attn = nn.Sequential(*(CondAttentionBlock(dim, heads) for _ in range(blocks)))

    def forward(self, mel: Tensor, packed: PackedRows | None = None) -> Tensor:
        """``mel`` ``[B, 80, S]`` -> ``[B, D, S]``; with ``packed``, ``mel`` ``[N, 80]``
        (the rows of ``packed`` end to end, frames first) -> ``[N, D]``."""
        if packed is not None:
            x = F.linear(mel, self.init.weight[..., 0], self.init.bias)
            for block in self.attn:
                x = block.packed(x, packed)
            return x
        x = self.init(mel)
        for block in self.attn:
            x = block(x)
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
        """``frames [B, S, D]``; ``weights [B, S]`` (module docstring) or None (all 1)."""
        latents = self.latents.expand(frames.shape[0], -1, -1)
        bias = None
        if weights is not None:  # the latents' keys count once
            bias = F.pad(weights.log(), (latents.shape[1], 0)).to(frames.dtype)[:, None, None, :]
        for attn, ff in self.layers:
            latents = attn(latents, frames, bias) + latents
            latents = ff(latents) + latents
        return self.norm(latents)
