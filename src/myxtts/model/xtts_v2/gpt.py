"""XTTS-v2's GPT: an autoregressive transformer over DVAE audio codes, conditioned on a
voice (32 latents from the cloning mel) and the text.

One sequence per utterance, embedded piece by piece and run through GPT-2 blocks::

    [32 voice latents] [START] text [STOP] [start_audio] code_1 ... code_n [stop_audio]

Text and audio have their own token tables and learned position tables (each counted from
0 at its own start); the voice latents carry no position. ``final_norm`` follows the
stack's own ``ln_f``; ``text_head`` and ``mel_head`` read its output. Attribute names are
the reference's, so the state dict's keys are the released ``gpt.*`` keys minus the
``gpt.`` prefix.

Three uses, one set of weights:

- training (:meth:`XttsGpt.forward`): teacher-forced, both cross-entropies;
- the HiFi-GAN decoder's input (:meth:`XttsGpt.latents`): the hidden states that predicted
  each code;
- decoding (:meth:`XttsGpt.prefill`, :meth:`XttsGpt.step`): one code at a time over a
  :class:`~myxtts.model.xtts_v2.blocks.StaticKVCache` (the loops live in
  ``myxtts.inference.xtts_v2.decode``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pad_sequence

from myxtts.model.xtts_v2.blocks import GptStack, StaticKVCache
from myxtts.model.xtts_v2.conditioning import MelStyleEncoder, PackedRows, PerceiverResampler
from myxtts.model.xtts_v2.config import XttsV2Config

# Training's conditioning-segment indices (audio samples) are divided by this (the
# reference's ``perceiver_cond_length_compression``, the cloning mel's hop) and then used as
# code positions, although a code spans 1024 samples: kept, so that losses equal.
_PERCEIVER_COMPRESSION = 256


class LearnedPositions(nn.Module):
    """A learned position table (``emb``), read from position 0."""

    def __init__(self, length: int, dim: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(length, dim)
        nn.init.normal_(self.emb.weight, std=0.02)

    def forward(self, length: int) -> Tensor:
        return self.emb.weight[:length]


class TeacherForced(NamedTuple):
    """Training's outputs: the mean cross-entropies and the audio logits ``[B, codes, T]``."""

    text_loss: Tensor
    code_loss: Tensor
    code_logits: Tensor


class XttsGpt(nn.Module):
    """The GPT of XTTS-v2, built from :class:`XttsV2Config` (see the module docstring).

    ``dropout``: GPT-2's (on the stack's input, the attention probabilities and both
    residual branches; training mode only), 0.1 as released.
    """

    def __init__(self, config: XttsV2Config, dropout: float = 0.1) -> None:
        super().__init__()
        a = config.args
        dim = a.gpt_n_model_channels
        self.dim = dim
        self.start_text_token = config.start_text_token
        self.stop_text_token = config.stop_text_token
        self.start_audio_token = a.gpt_start_audio_token
        self.stop_audio_token = a.gpt_stop_audio_token
        self.code_stride = a.gpt_code_stride_len
        # one conditioning input: the audio table has room for it and start/stop
        self.max_gen_mel_tokens = a.gpt_max_audio_tokens - 1 - 2
        self.conditioning_encoder = MelStyleEncoder(80, dim, a.gpt_n_heads)
        self.conditioning_perceiver = PerceiverResampler(dim)
        self.text_embedding = nn.Embedding(config.number_text_tokens, dim)
        self.mel_embedding = nn.Embedding(a.gpt_num_audio_tokens, dim)
        self.gpt = GptStack(dim, a.gpt_n_heads, a.gpt_layers, dropout)
        self.mel_pos_embedding = LearnedPositions(a.gpt_max_audio_tokens + 2 + 1, dim)
        self.text_pos_embedding = LearnedPositions(a.gpt_max_text_tokens + 2, dim)
        self.final_norm = nn.LayerNorm(dim)
        self.text_head = nn.Linear(dim, config.number_text_tokens)
        self.mel_head = nn.Linear(dim, a.gpt_num_audio_tokens)

    # -- conditioning ---------------------------------------------------------------------

    def conditioning_latents(self, mel: Tensor, packed: PackedRows | None = None) -> Tensor:
        """The voice prefix from a cloning mel: ``[B, 80, S]`` (or ``[B, 1, 80, S]``) ->
        ``[B, 32, D]`` (the reference's ``get_style_emb(mel).transpose(1, 2)``). With
        ``packed``, ``mel`` is ``[N, 80]``: the frames of the rows of ``packed`` end to end,
        weighted (``conditioning``'s module docstring)."""
        if mel.ndim == 4:
            mel = mel.squeeze(1)
        frames = self.conditioning_encoder(mel, packed)  # [B, D, S] (or [N, D])
        if packed is None:
            return self.conditioning_perceiver(frames.transpose(1, 2))
        rows = frames.split(packed.lengths)
        weights = pad_sequence(packed.weights.split(packed.lengths), batch_first=True)
        return self.conditioning_perceiver(pad_sequence(rows, batch_first=True), weights)

    # -- teacher forcing ------------------------------------------------------------------

    def _sequences(self, text_tokens: Tensor, text_lengths: Tensor, codes: Tensor,
                   wav_lengths: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Inputs and targets as the reference lays them out for a padded batch.

        Each code sequence is cut (or zero-padded) to ``ceil(wav / stride) + 3`` and gets one
        more stop token; every position from the real code count on becomes the stop token,
        so a row ends in at least four stops. Inputs are then shifted right behind the start
        token, targets end with a stop token: ``text_in [B, Tt]``, ``text_tgt``,
        ``mel_in [B, Tm]``, ``mel_tgt``, and ``code_lengths`` (``ceil(wav / stride) + 3``).
        """
        code_lengths = torch.ceil(wav_lengths / self.code_stride).long() + 3
        max_text = int(text_lengths.max())
        max_mel = int(code_lengths.max())
        if max_mel > codes.shape[-1]:
            codes = F.pad(codes, (0, max_mel - codes.shape[-1]))
        text = F.pad(text_tokens[:, :max_text], (0, 1), value=self.stop_text_token)
        codes = F.pad(codes[:, :max_mel], (0, 1), value=self.stop_audio_token)
        beyond = torch.arange(codes.shape[1], device=codes.device) >= (code_lengths - 3)[:, None]
        codes = codes.masked_fill(beyond, self.stop_audio_token)
        text_in = F.pad(text, (1, 0), value=self.start_text_token)
        text_tgt = F.pad(text, (0, 1), value=self.stop_text_token)
        mel_in = F.pad(codes, (1, 0), value=self.start_audio_token)
        mel_tgt = F.pad(codes, (0, 1), value=self.stop_audio_token)
        return text_in, text_tgt, mel_in, mel_tgt, code_lengths

    def _run(self, cond_latents: Tensor, text_in: Tensor, mel_in: Tensor,
             keep: Tensor | None) -> tuple[Tensor, Tensor]:
        """The whole sequence through the stack; ``keep`` ``[B, Tt + Tm]`` (True = a key
        others may attend to) hides padding. Returns the ``final_norm`` states of the text
        and the audio positions."""
        text_emb = self.text_embedding(text_in) + self.text_pos_embedding(text_in.shape[1])
        mel_emb = self.mel_embedding(mel_in) + self.mel_pos_embedding(mel_in.shape[1])
        x = torch.cat([cond_latents.to(text_emb.dtype), text_emb, mel_emb], dim=1)
        mask = None
        if keep is not None:
            b, t = x.shape[:2]
            keys = torch.cat([keep.new_ones(b, cond_latents.shape[1]), keep], dim=1)
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            mask = (causal[None] & keys[:, None, :])[:, None]  # [B, 1, T, T]
        h = self.final_norm(self.gpt(x, mask)[:, cond_latents.shape[1]:])
        return h[:, :text_in.shape[1]], h[:, text_in.shape[1]:]

    def _cond(self, cond_latents: Tensor | None, cond_mels: Tensor | None) -> Tensor:
        if cond_latents is not None:
            return cond_latents
        if cond_mels is None:
            raise ValueError("XttsGpt needs the voice: pass cond_latents [B, 32, D] or cond_mels [B, 80, S]")
        return self.conditioning_latents(cond_mels)

    def forward(self, text_tokens: Tensor, text_lengths: Tensor, codes: Tensor,
                wav_lengths: Tensor, *, cond_latents: Tensor | None = None,
                cond_mels: Tensor | None = None, cond_idxs: Tensor | None = None) -> TeacherForced:
        """Teacher-forced losses (the reference's ``GPT.forward``).

        ``text_tokens [B, Tt]`` right-padded, ``text_lengths [B]``; ``codes [B, Tc]`` the
        DVAE codes, ``wav_lengths [B]`` the audio samples they cover; the voice as
        ``cond_latents [B, 32, D]`` or ``cond_mels [B, (1,) 80, S]``. Keys after a row's text
        length (its own stop token included) and after its ``code_lengths`` are hidden from
        attention; their targets are -1 and ignored. ``cond_idxs [B, 2]`` (audio samples of
        the clip the voice was cut from, as the reference's trainer passes them) are divided
        by 256 and ignore those targets; as the reference does, only the *last* row's
        segment is ignored (its loop variable carries over from the previous loop), which
        is kept so that losses equal the reference's. The reference's ``cond_lens`` builds a
        mask that it then replaces by an all-ones one, so it has no counterpart here.
        """
        cond = self._cond(cond_latents, cond_mels)
        text_in, text_tgt, mel_in, mel_tgt, code_lengths = self._sequences(
            text_tokens, text_lengths, codes, wav_lengths)
        text_pos = torch.arange(text_in.shape[1], device=text_in.device)[None]
        mel_pos = torch.arange(mel_in.shape[1], device=mel_in.device)[None]
        text_pad = text_pos > text_lengths[:, None]
        mel_pad = mel_pos > code_lengths[:, None]
        keep = torch.cat([~text_pad, ~mel_pad], dim=1)
        text_h, mel_h = self._run(cond, text_in, mel_in, keep)
        text_logits = self.text_head(text_h).transpose(1, 2)
        code_logits = self.mel_head(mel_h).transpose(1, 2)
        text_tgt = text_tgt.long().masked_fill(text_pad, -1)
        mel_tgt = mel_tgt.long().masked_fill(mel_pad, -1)
        if cond_idxs is not None:
            start, end = (int(i) for i in cond_idxs[-1] // _PERCEIVER_COMPRESSION)
            mel_tgt[-1, start:end] = -1
        text_loss = F.cross_entropy(text_logits, text_tgt, ignore_index=-1)
        code_loss = F.cross_entropy(code_logits, mel_tgt, ignore_index=-1)
        return TeacherForced(text_loss, code_loss, code_logits)

    def latents(self, text_tokens: Tensor, text_lengths: Tensor, codes: Tensor,
                wav_lengths: Tensor, cond_latents: Tensor) -> Tensor:
        """The HiFi-GAN decoder's input: ``[B, n, D]`` ``final_norm`` states (the
        reference's ``GPT.forward(..., return_latent=True)``; no padding mask, so meant for
        rows of equal lengths, as inference has them).

        The audio input is ``[start] c_1 .. c_n`` followed by the four stop tokens of
        :meth:`_sequences` (with ``wav_lengths = n * stride``): ``n + 5`` positions. The
        state at input position ``i`` is the one that predicted ``c_{i+1}``, so dropping the
        last five (the reference's ``sub = -5``) leaves exactly one latent per code, aligned
        with the code it produced, the same states decoding sees. (The streaming path yields
        the same states one by one.) In training mode the reference drops only the last one.
        """
        text_in, _, mel_in, _, _ = self._sequences(text_tokens, text_lengths, codes, wav_lengths)
        _, mel_h = self._run(cond_latents, text_in, mel_in, None)
        return mel_h[:, :(-1 if self.training else -5)]

    def latents_for_codes(self, cond_latents: Tensor, text_tokens: Tensor, codes: Tensor) -> Tensor:
        """:meth:`latents` wired as the reference's ``inference`` does after decoding: the
        whole text of every row, ``wav_lengths = codes.shape[-1] * stride`` (so a trailing
        stop token, if decoding emitted one, is one of the codes)."""
        b, n = codes.shape
        text_lengths = torch.full((b,), text_tokens.shape[1], device=codes.device)
        wav_lengths = torch.full((b,), n * self.code_stride, device=codes.device)
        return self.latents(text_tokens, text_lengths, codes, wav_lengths, cond_latents)

    # -- decoding -------------------------------------------------------------------------

    def prefix_length(self, text_length: int) -> int:
        """Cache positions the prefix fills: voice latents, ``[START] text [STOP]`` and the
        start-of-audio token."""
        return self.conditioning_perceiver.latents.shape[0] + text_length + 2 + 1

    def prefill(self, cond_latents: Tensor, text_tokens: Tensor, cache: StaticKVCache,
                text_lengths: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Run the prefix ``cond_latents [B|1, 32, D]``, ``[START] text_tokens [B, T]
        [STOP]``, ``[start_audio]`` into ``cache`` (from its position 0). Returns the logits
        for the first code ``[B, codes]`` and the state after ``final_norm`` ``[B, D]``.

        ``text_lengths [B]``: rows right-padded to ``T`` (what follows a row's length is
        ignored). Rows of different lengths go into the cache left-padded (see
        :meth:`_padded_prefix`), so each row's every later step sees what its own unbatched
        run sees."""
        b, t = text_tokens.shape
        if text_lengths is not None and bool((text_lengths != t).any()):
            return self._padded_prefill(cond_latents, text_tokens, text_lengths, cache)
        text = F.pad(text_tokens, (0, 1), value=self.stop_text_token)
        text = F.pad(text, (1, 0), value=self.start_text_token)
        text_emb = self.text_embedding(text) + self.text_pos_embedding(text.shape[1])
        start = torch.full((b, 1), self.start_audio_token, device=text.device)
        mel_emb = self.mel_embedding(start) + self.mel_pos_embedding(1)
        cond = cond_latents.to(text_emb.dtype).expand(b, -1, -1)
        x = torch.cat([cond, text_emb, mel_emb], dim=1)
        cache.keep = None
        h = self.final_norm(self.gpt(x, cache=cache)[:, -1])
        cache.mel_start = x.shape[1] - 1
        return self.mel_head(h), h

    def _padded_prefill(self, cond_latents: Tensor, text_tokens: Tensor, text_lengths: Tensor,
                        cache: StaticKVCache) -> tuple[Tensor, Tensor]:
        """The prefill of rows of different text lengths: each row's prefix embedded as its
        own (text positions from 0 at its own ``[START]``) and left-padded with zeros to the
        longest, so every row's start-of-audio token sits at the same slot and the audio
        positions of later steps are the same for all rows. ``cache.keep`` hides the padding
        from every real query; a padding query sees only itself (a query that sees nothing
        would give NaN, which the hidden padding keys would carry into real rows)."""
        b = text_tokens.shape[0]
        lengths = [int(n) for n in text_lengths]
        cond = cond_latents.expand(b, -1, -1)
        start = self.mel_embedding.weight[self.start_audio_token] + self.mel_pos_embedding.emb.weight[0]
        rows = []
        for i, n in enumerate(lengths):
            ids = F.pad(F.pad(text_tokens[i, :n], (0, 1), value=self.stop_text_token),
                        (1, 0), value=self.start_text_token)
            text_emb = self.text_embedding(ids) + self.text_pos_embedding(n + 2)
            rows.append(torch.cat([cond[i].to(text_emb.dtype), text_emb, start[None]], dim=0))
        width = max(r.shape[0] for r in rows)
        x = torch.stack([F.pad(r, (0, 0, width - r.shape[0], 0)) for r in rows])
        slots = torch.arange(width, device=x.device)
        pads = torch.tensor([width - r.shape[0] for r in rows], device=x.device)
        real = slots[None] >= pads[:, None]  # [B, width]
        causal = torch.ones(width, width, dtype=torch.bool, device=x.device).tril()
        mask = causal[None] & (real[:, None, :] | torch.eye(width, dtype=torch.bool, device=x.device))
        h = self.final_norm(self.gpt(x, mask[:, None], cache=cache)[:, -1])
        keep = torch.ones(b, cache.capacity, dtype=torch.bool, device=x.device)
        keep[:, :width] = real
        cache.keep = keep
        cache.mel_start = width - 1
        return self.mel_head(h), h

    def step(self, codes: Tensor, cache: StaticKVCache,
             static: bool = False) -> tuple[Tensor, Tensor]:
        """One code per row ``codes [B]`` -> logits for the next ``[B, codes]`` and the state
        after ``final_norm`` ``[B, D]`` (the latent the streaming path decodes). ``static``:
        read the position from the device and keep every shape fixed (capturable, see
        :mod:`~myxtts.model.xtts_v2.blocks`)."""
        pos = cache.position - cache.mel_start  # the audio position of ``codes``
        x = self.mel_embedding(codes)[:, None] + self.mel_pos_embedding.emb(pos)[None]
        h = self.final_norm(self.gpt(x, cache=cache, static=static)[:, -1])
        return self.mel_head(h), h
