"""Text encoder: token ids + language -> contextual text encodings for the decoder to attend.

Token embedding + a per-utterance language embedding (so shared characters can be read
differently per language) + scaled sinusoidal positions computed on the fly (no maximum text
length in the weights), then pre-norm transformer layers with key-padding masks.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from myxtts.model.layers import EncoderLayer, RMSNorm, key_mask, lengths_to_mask, sinusoids


class TextEncoder(nn.Module):
    """tokens [B, L] (PAD=0), lengths [B], language ids [B] -> encodings [B, L, d]."""

    def __init__(self, n_tokens: int, n_languages: int, d_model: int, n_heads: int, ff_mult: int,
                 n_layers: int, dropout: float) -> None:
        super().__init__()
        self.d_model = d_model
        self.token_emb = nn.Embedding(n_tokens, d_model, padding_idx=0)
        self.lang_emb = nn.Embedding(n_languages, d_model)
        # Learned loudness of the position code relative to the embeddings (Transformer-TTS).
        self.pos_scale = nn.Parameter(torch.tensor(1.0))
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            EncoderLayer(d_model, n_heads, ff_mult, dropout) for _ in range(n_layers)
        )
        self.norm_out = RMSNorm(d_model)

    def forward(self, tokens: Tensor, lengths: Tensor, language_ids: Tensor) -> Tensor:
        """tokens [B, L] long, lengths [B] long, language_ids [B] long -> [B, L, d].

        Padded positions come out as exact zeros (they are masked as keys downstream anyway).
        """
        b, n_text = tokens.shape
        pos = sinusoids(torch.arange(n_text, device=tokens.device), self.d_model)  # [L, d]
        x = self.token_emb(tokens) + self.lang_emb(language_ids)[:, None, :]  # [B, L, d]
        x = self.drop(x + self.pos_scale * pos.to(x.dtype))
        mask = key_mask(lengths, n_text)  # [B, 1, 1, L]
        for layer in self.layers:
            x = layer(x, mask)  # [B, L, d]
        real = lengths_to_mask(lengths, n_text)[..., None]  # [B, L, 1]
        return self.norm_out(x) * real.to(x.dtype)  # [B, L, d]
