"""Transformer building blocks shared by the text encoder, the conditioning encoder and the decoder.

Every attention goes through SDPA (``scaled_dot_product_attention``) so the fused kernels run
on CUDA; masks are boolean, ``True`` = "this key takes part". Blocks are pre-norm, which
trains stably without warm-up tricks. Positions are sinusoids computed on the fly, added with
a learned scale (as in Transformer-TTS): nothing in the weights depends on a maximum length.
Every transformer block (``EncoderLayer`` here, ``ResamplerLayer``, ``DecoderLayer``) is a
:class:`CheckpointedBlock` (``train.activation_checkpointing``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint


def lengths_to_mask(lengths: Tensor, max_len: int) -> Tensor:
    """Boolean mask [B, max_len], True for real elements (index < length).

    ``max_len`` is a Python int taken from a tensor *shape*, so this never syncs with the host.
    """
    positions = torch.arange(max_len, device=lengths.device)  # [max_len]
    return positions[None, :] < lengths[:, None]  # [B, max_len]


def key_mask(lengths: Tensor, max_len: int) -> Tensor:
    """Key-padding mask for SDPA, broadcastable to [B, H, Tq, Tk]: [B, 1, 1, max_len].

    Lengths are clamped to >= 1: a row with every key masked would make SDPA return NaN, and
    one garbage key is better than a NaN that poisons a whole batch.
    """
    return lengths_to_mask(lengths.clamp(min=1), max_len)[:, None, None, :]


def sinusoids(positions: Tensor, dim: int) -> Tensor:
    """Sinusoidal position codes: positions [*] (any int/float) -> [*, dim] float32."""
    half = dim // 2
    freqs = torch.exp(
        -math.log(10000.0) * torch.arange(half, device=positions.device, dtype=torch.float32) / half
    )  # [half]
    angles = positions.to(torch.float32)[..., None] * freqs  # [*, half]
    codes = torch.cat([angles.sin(), angles.cos()], dim=-1)  # [*, 2*half]
    if dim % 2:
        codes = F.pad(codes, (0, 1))
    return codes


class RMSNorm(nn.Module):
    """Root-mean-square norm (no mean subtraction): per-vector, so padding can never leak."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:  # [..., dim] -> [..., dim]
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * self.weight


class FeedForward(nn.Module):
    """Position-wise MLP d -> ff_mult*d -> d with GELU."""

    def __init__(self, d_model: int, ff_mult: int, dropout: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, ff_mult * d_model)
        self.fc2 = nn.Linear(ff_mult * d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:  # [B, T, d] -> [B, T, d]
        return self.fc2(self.dropout(F.gelu(self.fc1(x))))


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """[B, T, H*hd] -> [B, H, T, hd]."""
    b, t, d = x.shape
    return x.view(b, t, n_heads, d // n_heads).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """[B, H, T, hd] -> [B, T, H*hd]."""
    b, h, t, hd = x.shape
    return x.transpose(1, 2).reshape(b, t, h * hd)


class SelfAttention(nn.Module):
    """Multi-head self-attention, bidirectional with key padding or causal with a KV cache."""

    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def _qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # 3 x [B, T, d]
        return split_heads(q, self.n_heads), split_heads(k, self.n_heads), split_heads(v, self.n_heads)

    def forward(self, x: Tensor, mask: Tensor | None = None, causal: bool = False) -> Tensor:
        """x [B, T, d], mask [B, 1, 1, T] bool (keys) or None -> [B, T, d].

        Causal attention needs no padding mask: padding sits at the end, so a real query only
        ever sees earlier (real) keys.
        """
        q, k, v = self._qkv(x)  # [B, H, T, hd] each
        p = self.dropout if self.training else 0.0
        if causal:
            o = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        return self.out(merge_heads(o))  # [B, T, d]

    def step(self, x: Tensor, cache_k: Tensor, cache_v: Tensor, pos: int) -> Tensor:
        """One causal step with a preallocated cache.

        x [B, 1, d]; cache_k/cache_v [B, H, S_max, hd] are written in place at ``pos``; the
        query attends keys 0..pos. Cost per step is O(pos), never a recomputation of the past.
        """
        q, k, v = self._qkv(x)  # [B, H, 1, hd]
        cache_k[:, :, pos : pos + 1] = k
        cache_v[:, :, pos : pos + 1] = v
        o = F.scaled_dot_product_attention(
            q, cache_k[:, :, : pos + 1], cache_v[:, :, : pos + 1]
        )  # [B, H, 1, hd]
        return self.out(merge_heads(o))  # [B, 1, d]


class CrossAttention(nn.Module):
    """Multi-head attention from queries x to a memory whose K/V can be projected once."""

    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.dropout = dropout
        self.q = nn.Linear(d_model, d_model)
        self.kv = nn.Linear(d_model, 2 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """memory [B, M, d] -> (k, v) [B, H, M, hd]; done once per utterance at inference."""
        k, v = self.kv(memory).chunk(2, dim=-1)
        return split_heads(k, self.n_heads), split_heads(v, self.n_heads)

    def queries(self, x: Tensor) -> Tensor:
        """x [B, T, d] -> q [B, H, T, hd]."""
        return split_heads(self.q(x), self.n_heads)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """q [B, H, T, hd], k/v [B, H, M, hd], mask [B, 1, 1, M] -> [B, T, d]."""
        p = self.dropout if self.training else 0.0
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        return self.out(merge_heads(o))

    def forward(self, x: Tensor, memory: Tensor, mask: Tensor | None) -> Tensor:
        """x [B, T, d], memory [B, M, d], mask [B, 1, 1, M] -> [B, T, d]."""
        k, v = self.memory_kv(memory)
        return self.attend(self.queries(x), k, v, mask)


class CheckpointedBlock(nn.Module):
    """A transformer block that can trade compute for memory (activation checkpointing).

    Why: to compute a block's gradients autograd keeps what its forward made -- norm outputs,
    the q/k/v projections, attention outputs (on the math path even the attention weights),
    the MLP's hidden layer (ff_mult times the block's width), dropout masks -- many times the
    block's [B, T, d] input, for every block, from the forward until the backward reaches
    it. That, not the weights, bounds the batch (or the preset) a GPU can train. With
    ``activation_checkpointing`` on, a block keeps only its inputs and runs its forward once
    more in the backward pass, just before its gradients are computed: its activation
    memory shrinks to its inputs, for one more forward of every block (about a third more
    compute for the blocks; embeddings, postnet and losses are not recomputed). Measured with
    the tiny preset on the CPU (``benchmarks/activation_checkpointing.py``): a quarter of the
    bytes saved for the backward pass, for 1.2-1.4x the eager step's time. Worth it where memory
    limits the batch; a waste of compute where it does not (off by default).

    Subclasses run their ``forward`` body through :meth:`checkpointed`. Recomputation happens
    only in training mode with gradients enabled: evaluation, ``no_grad``/``inference_mode``
    passes (validation, the self-feed pass, generation) and the KV-cache ``step`` paths save
    nothing for a backward and run the block plainly.

    ``torch.utils.checkpoint`` non-reentrant (``use_reentrant=False``, torch's recommended
    mode): the random state is restored for the recomputation, so dropout draws the same masks
    and the gradients are those of the plain block, bit for bit on the CPU; autocast is
    replayed too. Under ``torch.compile`` (``train.compile`` compiles each block, this call
    included) dynamo traces the checkpoint as a region of the block's graph, whose backward
    graph recomputes it (random ops replayed from their saved RNG state); the flag is a
    guard of that graph (changing it compiles the block again, once). Inside CUDA graphs of
    the step, checkpointed blocks with dropout run uncompiled: eager blocks rewind the
    default CUDA generator, which a capture records (torch >= 2.10), while compiled ones
    draw from private generators it does not (``train.engine.mode.plan_step`` decides).
    """

    activation_checkpointing: bool = False  # per instance, set by set_activation_checkpointing

    def checkpointed(self, fn: Callable[..., Any], *args: Tensor) -> Any:
        """``fn(*args)``, recomputed in the backward pass when checkpointing applies."""
        if self.activation_checkpointing and self.training and torch.is_grad_enabled():
            return checkpoint(fn, *args, use_reentrant=False)
        return fn(*args)


def set_activation_checkpointing(module: nn.Module, enabled: bool) -> int:
    """Turn checkpointing on or off for every :class:`CheckpointedBlock` in ``module``;
    returns how many blocks there are."""
    blocks = [m for m in module.modules() if isinstance(m, CheckpointedBlock)]
    for block in blocks:
        block.activation_checkpointing = bool(enabled)
    return len(blocks)


class EncoderLayer(CheckpointedBlock):
    """Pre-norm bidirectional transformer layer with key padding (text and reference encoders)."""

    def __init__(self, d_model: int, n_heads: int, ff_mult: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = RMSNorm(d_model)
        self.attn = SelfAttention(d_model, n_heads, dropout)
        self.norm2 = RMSNorm(d_model)
        self.ff = FeedForward(d_model, ff_mult, dropout)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:  # [B, T, d], [B,1,1,T] -> [B, T, d]
        return self.checkpointed(self._block, x, mask)

    def _block(self, x: Tensor, mask: Tensor) -> Tensor:
        x = x + self.drop(self.attn(self.norm1(x), mask=mask))
        return x + self.drop(self.ff(self.norm2(x)))


class MaskedConv1d(nn.Conv1d):
    """'Same'-padded 1-D conv over time-major input that zeroes padded frames first.

    Zeroing the padding before the conv makes a batched utterance see exactly the zeros its
    own un-batched conv padding would give, so outputs are independent of batch padding.
    """

    def __init__(self, in_ch: int, out_ch: int, kernel_size: int) -> None:
        super().__init__(in_ch, out_ch, kernel_size, padding=kernel_size // 2)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:  # type: ignore[override]
        """x [B, T, C_in], mask [B, T] bool -> [B, T, C_out]."""
        x = x * mask[..., None].to(x.dtype)
        return super().forward(x.transpose(1, 2)).transpose(1, 2)


def init_weights(module: nn.Module, n_residual_layers: int) -> None:
    """GPT-style init: N(0, 0.02) linears/embeddings, zero biases, and residual output
    projections scaled by 1/sqrt(2 * layers) so the residual stream's variance does not grow
    with depth."""
    std = 0.02
    for name, m in module.named_modules():
        if isinstance(m, nn.Linear):
            s = std / math.sqrt(2 * max(1, n_residual_layers)) if name.endswith(("out", "fc2")) else std
            nn.init.normal_(m.weight, 0.0, s)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, std)
            if m.padding_idx is not None:
                with torch.no_grad():
                    m.weight[m.padding_idx].zero_()
