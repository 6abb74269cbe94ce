"""Autoregressive mel decoder (r frames per step), its alignment signal, and the postnet.

Each decoder step s sees the previous group of r frames through a prenet, attends causally to
earlier steps and cross-attends to the memory [conditioning latents; text encodings], then
predicts the next r frames and one stop logit per frame. Why the alignment signal is computed
without attention weights: SDPA returns none, and materialising [B, H, S, L] per layer is what
the fused kernels avoid; one more SDPA in one layer yields the exact guided-attention penalty
(``Decoder._align_moments``). Explicit weights for images: ``Decoder.alignment_weights``
(no_grad, logging only).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from myxtts.model.layers import (
    CheckpointedBlock,
    CrossAttention,
    FeedForward,
    MaskedConv1d,
    RMSNorm,
    SelfAttention,
    sinusoids,
)

GUIDED_FOURIER_TERMS = 24  # K; supports guided_attn_sigma >= ~0.1
GUIDED_PERIOD = 2.0  # half-period P of the cosine basis: w_k = k*pi/P; |p - q| < 1 < P


def fourier_frequencies(device: torch.device | None = None) -> Tensor:
    """w_k = k*pi/P for k = 1..K -> [K] float32."""
    k = torch.arange(1, GUIDED_FOURIER_TERMS + 1, device=device, dtype=torch.float32)
    return k * (math.pi / GUIDED_PERIOD)


def fourier_features(positions: Tensor) -> Tensor:
    """Normalised positions [*] in [0, 1] -> [*, 2K] = [cos(w_k p), sin(w_k p)]."""
    angles = positions.float()[..., None] * fourier_frequencies(positions.device)  # [*, K]
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


def normalised_positions(lengths: Tensor, max_len: int) -> Tensor:
    """Centre of element n of an utterance of length N, (n + 0.5) / N -> [B, max_len] float."""
    n = torch.arange(max_len, device=lengths.device, dtype=torch.float32)
    return (n[None, :] + 0.5) / lengths.clamp(min=1)[:, None].float()


class Prenet(nn.Module):
    """Bottleneck MLP on the previous frame group. Its dropout is the Tacotron trick: kept on at
    inference (by default) so the decoder never learns to trust its input too much and free
    running looks like training."""

    def __init__(self, in_dim: int, prenet_dim: int, d_model: int, dropout: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_dim, prenet_dim)
        self.fc2 = nn.Linear(prenet_dim, prenet_dim)
        self.proj = nn.Linear(prenet_dim, d_model)
        self.p = dropout

    def forward(self, x: Tensor, dropout: bool) -> Tensor:  # [B, S, r*n_mels] -> [B, S, d]
        x = F.dropout(F.relu(self.fc1(x)), self.p, training=dropout)
        x = F.dropout(F.relu(self.fc2(x)), self.p, training=dropout)
        return self.proj(x)


class DecoderLayer(CheckpointedBlock):
    """Pre-norm: causal self-attention -> cross-attention to memory -> MLP.

    ``forward`` (teacher forcing, training) may be checkpointed; ``step`` (KV-cache decoding,
    inference) never is."""

    def __init__(self, d_model: int, n_heads: int, ff_mult: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = RMSNorm(d_model)
        self.self_attn = SelfAttention(d_model, n_heads, dropout)
        self.norm2 = RMSNorm(d_model)
        self.cross_attn = CrossAttention(d_model, n_heads, dropout)
        self.norm3 = RMSNorm(d_model)
        self.ff = FeedForward(d_model, ff_mult, dropout)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, mem_k: Tensor, mem_v: Tensor, mem_mask: Tensor
                ) -> tuple[Tensor, Tensor]:
        """x [B, S, d], mem_k/v [B, H, M, hd], mem_mask [B,1,1,M] -> (x [B,S,d], q [B,H,S,hd])."""
        return self.checkpointed(self._block, x, mem_k, mem_v, mem_mask)

    def _block(self, x: Tensor, mem_k: Tensor, mem_v: Tensor, mem_mask: Tensor
               ) -> tuple[Tensor, Tensor]:
        x = x + self.drop(self.self_attn(self.norm1(x), causal=True))
        q = self.cross_attn.queries(self.norm2(x))  # [B, H, S, hd]
        x = x + self.drop(self.cross_attn.attend(q, mem_k, mem_v, mem_mask))
        return x + self.drop(self.ff(self.norm3(x))), q

    def step(self, x: Tensor, cache: dict[str, Tensor], pos: int) -> Tensor:
        """One step: x [B, 1, d] -> [B, 1, d], appending to the self-attention cache."""
        x = x + self.self_attn.step(self.norm1(x), cache["k"], cache["v"], pos)
        q = self.cross_attn.queries(self.norm2(x))
        x = x + self.cross_attn.attend(q, cache["mem_k"], cache["mem_v"], cache["mem_mask"])
        return x + self.ff(self.norm3(x))


class Decoder(nn.Module):
    """Prenet + positions + causal transformer + mel/stop heads (r = frames per step)."""

    def __init__(self, n_mels: int, frames_per_step: int, d_model: int, n_heads: int,
                 ff_mult: int, n_layers: int, prenet_dim: int, prenet_dropout: float,
                 dropout: float) -> None:
        super().__init__()
        self.n_mels, self.r, self.d_model, self.n_heads = n_mels, frames_per_step, d_model, n_heads
        self.prenet = Prenet(frames_per_step * n_mels, prenet_dim, d_model, prenet_dropout)
        # Global voice vector added to every step's input. Why: under teacher forcing the
        # previous frames already carry the voice, so a decoder that must *find* the voice by
        # cross-attending to the latents learns to ignore them, and free-running output (which
        # starts from silence) has no voice at all. A direct additive path is used from step 1.
        self.speaker_proj = nn.Linear(d_model, d_model)
        self.pos_scale = nn.Parameter(torch.tensor(1.0))
        self.layers = nn.ModuleList(
            DecoderLayer(d_model, n_heads, ff_mult, dropout) for _ in range(n_layers)
        )
        self.align_layer = (n_layers - 1) // 2  # middle layer carries the guided alignment
        self.norm_out = RMSNorm(d_model)
        self.mel_head = nn.Linear(d_model, frames_per_step * n_mels)
        self.stop_head = nn.Linear(d_model, frames_per_step)

    def _embed(self, prev: Tensor, start: int, prenet_dropout: bool, speaker: Tensor) -> Tensor:
        """prev [B, S, r*n_mels] (steps start..start+S-1), speaker [B, d] -> [B, S, d]."""
        x = self.prenet(prev, prenet_dropout)
        pos = sinusoids(torch.arange(start, start + prev.shape[1], device=prev.device), self.d_model)
        return x + self.pos_scale * pos.to(x.dtype) + self.speaker_proj(speaker)[:, None].to(x.dtype)

    def _heads(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x [B, S, d] -> (mel groups [B, S, r*n_mels], stop logits [B, S, r])."""
        x = self.norm_out(x)
        return self.mel_head(x), self.stop_head(x).float()

    def forward(self, prev: Tensor, memory: Tensor, mem_mask: Tensor, n_latents: int,
                text_features: Tensor, prenet_dropout: bool, speaker: Tensor,
                moments: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        """Teacher-forced pass over all steps.

        prev [B, S, r*n_mels]: step s holds frame group s-1 (zeros at s=0), normalised.
        memory [B, C+L, d] = [latents; text]; mem_mask [B, 1, 1, C+L]; n_latents = C.
        text_features [B, L, 2K]: ``fourier_features`` of the text positions.
        speaker [B, d]: the pooled conditioning latents (global voice vector).
        Returns mel groups [B, S, r*n_mels], stop logits [B, S, r] (float32) and the
        alignment moments [B, S, 2K] (float32, head-averaged) of ``align_layer``; with
        ``moments=False`` they are not computed (an empty tensor).
        """
        x = self._embed(prev, 0, prenet_dropout, speaker)  # [B, S, d]
        align = x.new_zeros(0)
        for i, layer in enumerate(self.layers):
            k, v = layer.cross_attn.memory_kv(memory)  # [B, H, C+L, hd]
            x, q = layer(x, k, v, mem_mask)
            if moments and i == self.align_layer:
                align = self._align_moments(q, k[:, :, n_latents:], mem_mask[..., n_latents:],
                                            text_features)
        mel, stop = self._heads(x)
        return mel, stop, align

    def _align_moments(self, q: Tensor, k_text: Tensor, text_mask: Tensor, feats: Tensor
                       ) -> Tensor:
        """q [B,H,S,hd], k_text [B,H,L,hd], text_mask [B,1,1,L], feats [B,L,2K] -> [B,S,2K].

        The guided penalty ``E_A[1 - G(p - q)]`` (Tachibana et al. 2017) is linear in the
        attention A, and the Gaussian G is a short cosine series on [-1, 1], so SDPA over
        the text keys with values ``[cos(w_k p), sin(w_k p)]`` gives the moments the loss
        needs for any sigma (down to ~0.1): one fused attention, memory O(B*S*2K), no
        [B, H, S, L] weights. Text keys alone renormalise A, so latents cannot hide
        attention from the penalty.

        Values are padded to the head size when they fit so the same fused kernel applies.
        """
        b, h, _, hd = q.shape
        n_feat = feats.shape[-1]
        v = feats if n_feat >= hd else F.pad(feats, (0, hd - n_feat))  # [B, L, Ev]
        v = v[:, None].expand(b, h, -1, -1).to(q.dtype).contiguous()  # [B, H, L, Ev]
        m = F.scaled_dot_product_attention(q, k_text, v, attn_mask=text_mask)  # [B,H,S,Ev]
        return m[..., :n_feat].float().mean(dim=1)  # [B, S, 2K]

    @torch.no_grad()
    def alignment_weights(self, prev: Tensor, memory: Tensor, mem_mask: Tensor, n_latents: int,
                          speaker: Tensor) -> Tensor:
        """Explicit text attention of ``align_layer`` for images: -> [B, S, L] (rows sum to 1
        over real text, head-averaged). Materialises the weights: logging only."""
        x = self._embed(prev, 0, False, speaker)
        for i, layer in enumerate(self.layers):
            k, v = layer.cross_attn.memory_kv(memory)
            x, q = layer(x, k, v, mem_mask)
            if i == self.align_layer:
                k_text = k[:, :, n_latents:]  # [B, H, L, hd]
                logits = q.float() @ k_text.float().transpose(-1, -2) / math.sqrt(q.shape[-1])
                logits = logits.masked_fill(~mem_mask[..., n_latents:], float("-inf"))
                return logits.softmax(dim=-1).mean(dim=1)  # [B, S, L]
        raise AssertionError("unreachable: align_layer < n_layers")  # pragma: no cover

    # ------------------------------------------------------------- incremental decoding

    def init_cache(self, memory: Tensor, mem_mask: Tensor, max_steps: int, speaker: Tensor
                   ) -> list[dict[str, Tensor]]:
        """Per-layer state: cross-attention K/V projected once, self-attention K/V preallocated
        for ``max_steps`` (no per-step concatenation, so total cost is linear in length)."""
        b = memory.shape[0]
        hd = self.d_model // self.n_heads
        cache = []
        for layer in self.layers:
            mem_k, mem_v = layer.cross_attn.memory_kv(memory)
            shape = (b, self.n_heads, max_steps, hd)
            cache.append({"k": memory.new_zeros(shape), "v": memory.new_zeros(shape),
                          "mem_k": mem_k, "mem_v": mem_v, "mem_mask": mem_mask})
        cache[0]["speaker"] = speaker  # [B, d]
        return cache

    def step(self, prev: Tensor, cache: list[dict[str, Tensor]], pos: int, prenet_dropout: bool
             ) -> tuple[Tensor, Tensor]:
        """prev [B, r*n_mels] (group pos-1, normalised) -> (group [B, r*n_mels], stop [B, r])."""
        x = self._embed(prev[:, None], pos, prenet_dropout, cache[0]["speaker"])  # [B, 1, d]
        for layer, c in zip(self.layers, cache):
            x = layer.step(x, c, pos)
        mel, stop = self._heads(x)
        return mel[:, 0], stop[:, 0]


class Postnet(nn.Module):
    """Residual conv stack refining the whole predicted mel (non-causal, applied after decoding).

    Masked convs + per-frame norms keep it independent of batch padding; the last conv starts
    at zero so training begins with the postnet as the identity.
    """

    def __init__(self, n_mels: int, channels: int, n_layers: int, kernel: int, dropout: float,
                 d_model: int) -> None:
        super().__init__()
        dims = [n_mels] + [channels] * (n_layers - 1) + [n_mels]
        self.convs = nn.ModuleList(MaskedConv1d(a, b, kernel) for a, b in zip(dims[:-1], dims[1:]))
        # The postnet restores harmonic detail, whose spacing *is* the voice's pitch: it gets
        # the global voice vector too instead of guessing the pitch from a smooth mel.
        self.speaker_proj = nn.Linear(d_model, channels)
        self.norms = nn.ModuleList(RMSNorm(channels) for _ in range(n_layers - 1))
        self.drop = nn.Dropout(dropout)
        nn.init.zeros_(self.convs[-1].weight)
        nn.init.zeros_(self.convs[-1].bias)

    def forward(self, mel: Tensor, mask: Tensor, speaker: Tensor) -> Tensor:
        """mel [B, T, n_mels] (normalised), mask [B, T] bool, speaker [B, d]
        -> refined mel [B, T, n_mels]."""
        x = mel
        for i, (conv, norm) in enumerate(zip(self.convs[:-1], self.norms)):
            h = conv(x, mask)  # [B, T, C]
            if i == 0:
                h = h + self.speaker_proj(speaker)[:, None].to(h.dtype)
            x = self.drop(torch.tanh(norm(h)))  # [B, T, C]
        return mel + self.convs[-1](x, mask)
