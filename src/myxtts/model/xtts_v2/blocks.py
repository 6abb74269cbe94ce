"""GPT-2's transformer blocks as XTTS-v2 uses them, with a preallocated key/value cache.

Numerically GPT-2 (pre-norm blocks, LayerNorm eps 1e-5, GELU with the tanh approximation
(``gelu_new``), scores scaled by ``1/sqrt(head_dim)``, dropout 0.1 on the input, the
attention probabilities and both residual branches while training; on the CPU its masks
come from :func:`dropout`, and the attention it drops runs written out, as SDPA's own math
path would). The projections keep
GPT-2's ``Conv1D`` layout, weights ``[in, out]``, so the released ``gpt.gpt.h.N.*`` keys load
unchanged; they run as the same ``addmm`` as transformers'.

Decoding writes keys and values into :class:`StaticKVCache`, allocated once per request at
its longest length, in place. A step can read the write position from a device tensor and
attend over the whole buffer under a mask (``static=True``): no host sync, no shape that
changes from step to step, so a step can be captured as a CUDA graph or compiled once. In
eager mode it attends only over the filled part instead (the length is the decode loop's own
host counter, not read from the device), which on a CPU spares the reads of empty slots.
transformers' ``DynamicCache`` instead concatenates every layer's keys and values at every
step: a copy of the whole cache per token.

Rows of different prefix lengths share one cache left-padded: each row's prefix ends at the
same slot, so every step writes one slot for all rows; the cache's ``keep`` mask hides the
padding slots from every query (the step's attention then takes a mask, a little slower
than the unmasked eager step, which rows of one length keep).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class StaticKVCache:
    """Keys and values of every layer, ``[layers, B, heads, capacity, head_dim]`` each.

    ``length`` (host int) is how many positions are filled; ``position`` (device long [1])
    holds the same count for steps that must not read host state (``static=True``; under a
    replayed CUDA graph only ``position`` advances, so a capturing caller keeps its own
    count). ``mel_start`` is the cache index of the first audio position (the start-of-audio
    token), from which the audio position embedding of a step is counted. ``keep`` (None, or
    boolean ``[B, capacity]``, True = a real key) hides the left padding of rows whose
    prefixes are shorter than the longest (set by the batched prefill).
    """

    def __init__(self, layers: int, batch: int, heads: int, head_dim: int, capacity: int,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        shape = (layers, batch, heads, capacity, head_dim)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.position = torch.zeros(1, dtype=torch.long, device=device)
        self.slots = torch.arange(capacity, device=device)  # for the static step's mask
        self.capacity = capacity
        self.length = 0
        self.mel_start = 0
        self.keep: Tensor | None = None

    def reset(self, length: int) -> None:
        """Mark the first ``length`` positions as filled (after a prefill wrote them)."""
        if length > self.capacity:
            raise ValueError(f"{length} positions do not fit a cache of {self.capacity}")
        self.length = length
        self.position.fill_(length)

    def advance(self) -> None:
        """One more position filled (after a step wrote it)."""
        self.length += 1
        self.position.add_(1)


class GptLinear(nn.Module):
    """``x @ weight + bias`` with ``weight`` ``[in, out]`` (GPT-2's ``Conv1D``), as the state
    dict holds it; in memory it is the transpose of a contiguous ``[out, in]`` matrix, and
    the product runs as ``linear(x, weight.T)``. Why: for the few rows of a decode step the
    CPU's matrix kernels stream an ``[out, in]`` matrix once for all rows, but an ``[in, out]``
    one once per row (measured on 2 cores at the released size, per layer: 1 row 2.9 ms
    either way, 2 rows 6.6 ms against 2.6, 4 rows 7.3 against 5.6), which is what decoding
    several pieces together pays for. A state dict loads into it by copy, which keeps the
    layout, and ``.to()`` keeps it too."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter((torch.randn(n_out, n_in) * 0.02).t())
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight.t(), self.bias)


# random_ on int32 draws from [0, 2**31)
_RANDOM_RANGE = 2 ** 31


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """GPT-2's dropout, ``F.dropout``'s contract (each element zeroed with probability ``p``
    while training, the rest scaled by ``1 / (1 - p)``). On the CPU the mask is 31 random
    bits per element compared with ``p * 2**31`` (``p`` exact to 5e-10) instead of
    ``bernoulli_``: about twice as fast on a CPU core, where drawing masks took ~5% of a
    reduced-size fine-tuning step. Elsewhere ``F.dropout`` (fused on CUDA)."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, True)
    keep = torch.empty(x.shape, dtype=torch.int32).random_() >= round(p * _RANDOM_RANGE)
    return x * keep.to(x.dtype).mul_(1.0 / (1.0 - p))


class GptDropout(nn.Module):
    """:func:`dropout` as a module (no parameters: the state dict is unchanged)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = float(p)

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)


def attention_with_dropout(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
                           p: float) -> Tensor:
    """Attention over ``[B, H, T, hd]`` whose probabilities go through :func:`dropout`:
    SDPA's math path written out (on the CPU, SDPA with dropout takes that path anyway: its
    fused kernel has none). ``mask``: boolean, True = may attend, or None (causal)."""
    scores = torch.matmul(q, k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    if mask is None:
        t = q.shape[-2]
        mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    probs = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    return torch.matmul(dropout(probs, p, True), v)


class GptAttention(nn.Module):
    """Causal multi-head self-attention (``attn``: ``c_attn`` -> q, k, v; ``c_proj``)."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"model width {dim} does not split into {heads} heads")
        self.heads = heads
        self.dropout = dropout
        self.c_attn = GptLinear(dim, 3 * dim)
        self.c_proj = GptLinear(dim, dim)
        self.resid_dropout = GptDropout(dropout)

    def forward(self, x: Tensor, mask: Tensor | None = None, cache: StaticKVCache | None = None,
                layer: int = 0, static: bool = False) -> Tensor:
        b, t, d = x.shape
        # [B, T, 3, H, hd] -> q, k, v [B, H, T, hd] each: one view, one permute (the same
        # strides as splitting first; fewer ops matter in a decode step of one position)
        q, k, v = self.c_attn(x).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        p = self.dropout if self.training else 0.0
        if cache is None and p > 0.0 and q.device.type == "cpu":
            out = attention_with_dropout(q, k, v, mask, p)
        elif cache is None:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                                 is_causal=mask is None)
        elif t > 1 or cache.length == 0:  # prefill: the sequence starts the cache
            cache.keys[layer, :, :, :t] = k
            cache.values[layer, :, :, :t] = v
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        else:  # one new position
            keys, values = cache.keys[layer], cache.values[layer]
            keys.index_copy_(2, cache.position, k)
            values.index_copy_(2, cache.position, v)
            keep = cache.keep
            if static:  # every slot, the unfilled ones masked: fixed shapes, no host state
                visible = (cache.slots <= cache.position)[None, None, None, :]
                if keep is not None:
                    visible = visible & keep[:, None, None, :]
                out = F.scaled_dot_product_attention(q, keys, values, attn_mask=visible)
            else:
                n = cache.length + 1
                visible = None if keep is None else keep[:, None, None, :n]
                out = F.scaled_dot_product_attention(q, keys[:, :, :n], values[:, :, :n],
                                                     attn_mask=visible)
        out = self.c_proj(out.transpose(1, 2).reshape(b, t, d))
        return self.resid_dropout(out) if self.training else out


class GptMlp(nn.Module):
    """``c_fc`` (4x wider) -> GELU (tanh approximation) -> ``c_proj``."""

    def __init__(self, dim: int, dropout: float) -> None:
        super().__init__()
        self.c_fc = GptLinear(dim, 4 * dim)
        self.c_proj = GptLinear(4 * dim, dim)
        self.dropout = GptDropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        out = self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))
        return self.dropout(out) if self.training else out


class GptBlock(nn.Module):
    """``x += attn(ln_1(x)); x += mlp(ln_2(x))`` (``h.N``)."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=1e-5)
        self.attn = GptAttention(dim, heads, dropout)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-5)
        self.mlp = GptMlp(dim, dropout)

    def forward(self, x: Tensor, mask: Tensor | None = None, cache: StaticKVCache | None = None,
                layer: int = 0, static: bool = False) -> Tensor:
        x = x + self.attn(self.ln_1(x), mask, cache, layer, static)
        return x + self.mlp(self.ln_2(x))


class GptStack(nn.Module):
    """The transformer (``gpt``): input dropout, ``h.0 .. h.{L-1}``, ``ln_f``.

    It has no token or position embeddings of its own (XTTS adds its own before it).
    ``mask`` (boolean, ``True`` = may attend, broadcastable to ``[B, H, T, T]``) replaces
    the plain causal mask where padding must be hidden; with ``cache`` the input is either
    the whole prefix (written from position 0) or one new position per row.
    """

    def __init__(self, dim: int, heads: int, layers: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.heads = heads
        self.drop = GptDropout(dropout)
        self.h = nn.ModuleList(GptBlock(dim, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim, eps=1e-5)

    def new_cache(self, batch: int, capacity: int, device: torch.device | str | None = None,
                  dtype: torch.dtype | None = None) -> StaticKVCache:
        """An empty cache for ``batch`` rows of up to ``capacity`` positions (keys and
        values: ``2 * layers * batch * capacity * width`` elements)."""
        dim = self.ln_f.normalized_shape[0]
        ref = self.ln_f.weight
        return StaticKVCache(len(self.h), batch, self.heads, dim // self.heads, capacity,
                             ref.device if device is None else device,
                             ref.dtype if dtype is None else dtype)

    def forward(self, x: Tensor, mask: Tensor | None = None, cache: StaticKVCache | None = None,
                static: bool = False) -> Tensor:
        x = self.drop(x) if self.training else x
        for i, block in enumerate(self.h):
            x = block(x, mask, cache, i, static)
        if cache is not None:
            if x.shape[1] > 1 or cache.length == 0:
                cache.reset(x.shape[1])
            else:
                cache.advance()
        return self.ln_f(x)
