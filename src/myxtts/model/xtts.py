"""XTTS-style voice-cloning acoustic model: reference audio + text -> log-mel.

Wiring: ``ConditioningEncoder`` (reference mel -> C latents) and ``TextEncoder`` (tokens ->
L encodings) form the memory [latents; text] that the autoregressive ``Decoder`` attends to
while predicting r = ``frames_per_step`` frames per step; a residual ``Postnet`` refines the
result.

Mel domains: the batch carries raw log-mels; the model normalises them with its buffers
``mel_mean`` / ``mel_std`` [n_mels] (set from the store's statistics at build time, saved in
every checkpoint). ``forward`` returns predictions and target in the *normalised* domain (the
losses work there so every mel band weighs the same); ``generate`` returns *raw log-mel*
(``denormalize`` converts).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor, nn

from myxtts.config import Config, ModelConfig
from myxtts.data.batch import Batch
from myxtts.model.conditioning import ConditioningEncoder
from myxtts.model.decoder import Decoder, Postnet, fourier_features, normalised_positions
from myxtts.model.layers import (
    init_weights,
    key_mask,
    lengths_to_mask,
    set_activation_checkpointing,
)
from myxtts.model.text_encoder import TextEncoder

ASSUMED_VOCAB_SIZE = 100  # for count_parameters before a tokenizer exists


class XTTS(nn.Module):
    """See the module docstring. Batches follow ``myxtts.data.batch`` (fields, shapes, padding)."""

    def __init__(self, cfg: ModelConfig, n_mels: int, n_tokens: int, n_languages: int,
                 mel_mean: Tensor | None = None, mel_std: Tensor | None = None) -> None:
        super().__init__()
        self.cfg, self.n_mels, self.r = cfg, n_mels, cfg.frames_per_step
        d, h, ff, p = cfg.d_model, cfg.n_heads, cfg.ff_mult, cfg.dropout
        self.cond_encoder = ConditioningEncoder(n_mels, d, h, ff, cfg.cond_layers,
                                                cfg.cond_latents, p)
        self.text_encoder = TextEncoder(n_tokens, n_languages, d, h, ff, cfg.text_layers, p)
        self.decoder = Decoder(n_mels, self.r, d, h, ff, cfg.decoder_layers, cfg.prenet_dim,
                               cfg.prenet_dropout, p)
        self.postnet = Postnet(n_mels, cfg.postnet_channels, cfg.postnet_layers,
                               cfg.postnet_kernel, p, d)
        mean = torch.zeros(n_mels) if mel_mean is None else torch.as_tensor(mel_mean).float()
        std = torch.ones(n_mels) if mel_std is None else torch.as_tensor(mel_std).float()
        if mean.shape != (n_mels,) or std.shape != (n_mels,):
            raise ValueError(f"mel_mean/mel_std must have shape [{n_mels}] (audio.n_mels), got "
                             f"{tuple(mean.shape)} / {tuple(std.shape)}; recompute the store stats")
        self.register_buffer("mel_mean", mean.clone())
        self.register_buffer("mel_std", std.clamp(min=1e-3).clone())
        for module, depth in ((self.cond_encoder, cfg.cond_layers), (self.text_encoder, cfg.text_layers),
                              (self.decoder, cfg.decoder_layers)):
            init_weights(module, depth)
        self._init_input_scales()
        nn.init.constant_(self.decoder.stop_head.bias, -3.0)  # stopping is rare: start "go on"

    @torch.no_grad()
    def _init_input_scales(self) -> None:
        """Inputs start at the sinusoids' scale (rms ~0.7), not at the 0.02 of the residual init:
        otherwise positions drown the tokens and previous frames for the first hundreds of
        steps, and alignment (which needs both) forms late."""
        nn.init.normal_(self.text_encoder.token_emb.weight, 0.0, 1.0)
        self.text_encoder.token_emb.weight[0].zero_()  # PAD
        nn.init.normal_(self.text_encoder.lang_emb.weight, 0.0, 0.5)
        for lin in (self.decoder.prenet.fc1, self.decoder.prenet.fc2, self.decoder.prenet.proj,
                    self.decoder.speaker_proj):
            nn.init.normal_(lin.weight, 0.0, lin.in_features**-0.5)  # unit gain

    # ------------------------------------------------------------- helpers

    def normalize(self, mel: Tensor) -> Tensor:
        """Raw log-mel [..., n_mels] -> normalised."""
        return (mel - self.mel_mean) / self.mel_std

    def denormalize(self, mel: Tensor) -> Tensor:
        """Normalised [..., n_mels] -> raw log-mel."""
        return mel * self.mel_std + self.mel_mean

    def condition(self, ref_mel: Tensor, ref_lengths: Tensor) -> Tensor:
        """Raw reference log-mel [B, R, n_mels] + lengths [B] -> conditioning latents [B, C, d].

        Public so that inference can condition once per reference clip and average the latents
        of several clips into one voice (what ``encode(..., latents=)`` then takes)."""
        ref = self.normalize(ref_mel) * lengths_to_mask(ref_lengths, ref_mel.shape[1])[..., None]
        return self.cond_encoder(ref, ref_lengths)  # [B, C, d]

    def encode(self, tokens: Tensor, token_lengths: Tensor, language_ids: Tensor,
               ref_mel: Tensor | None, ref_lengths: Tensor | None,
               latents: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """-> memory [B, C+L, d], mem_mask [B, 1, 1, C+L] bool, text Fourier features [B, L, 2K],
        speaker [B, d] (the latents' mean: the decoder's global voice vector).

        tokens [B, L], token_lengths [B], language_ids [B], ref_mel [B, R, n_mels] raw,
        ref_lengths [B]; or, instead of the reference, ready ``latents`` [B, C, d]."""
        if latents is None:
            latents = self.condition(ref_mel, ref_lengths)  # [B, C, d]
        text = self.text_encoder(tokens, token_lengths, language_ids)  # [B, L, d]
        memory = torch.cat([latents, text.to(latents.dtype)], dim=1)  # [B, C+L, d]
        b, n_latents = latents.shape[:2]
        latent_mask = torch.ones(b, 1, 1, n_latents, dtype=torch.bool, device=tokens.device)
        mem_mask = torch.cat([latent_mask, key_mask(token_lengths, tokens.shape[1])],
                             dim=-1)  # [B, 1, 1, C+L]: latents always real, text by length
        feats = fourier_features(normalised_positions(token_lengths, tokens.shape[1]))  # [B,L,2K]
        return memory, mem_mask, feats, latents.mean(dim=1)

    def _teacher_inputs(self, mel: Tensor, mel_lengths: Tensor) -> tuple[Tensor, Tensor, int]:
        """raw mel [B, T, n] -> (target [B, T', n] normalised & zero-padded, prev groups
        [B, S, r*n], S) with T' = S*r the length padded up to a multiple of r."""
        b, t, n = mel.shape
        steps = -(-t // self.r)
        real = lengths_to_mask(mel_lengths, t)[..., None]  # [B, T, 1]
        target = self.normalize(mel) * real.to(mel.dtype)  # [B, T, n]
        target = nn.functional.pad(target, (0, 0, 0, steps * self.r - t))  # [B, T', n]
        groups = target.reshape(b, steps, self.r * n)  # [B, S, r*n]
        prev = nn.functional.pad(groups, (0, 0, 1, 0))[:, :steps]  # shift right by one step
        return target, prev, steps

    # ------------------------------------------------------------- training

    def set_activation_checkpointing(self, enabled: bool) -> None:
        """``train.activation_checkpointing``: every transformer block (text and reference
        encoder layers, resampler layers, decoder layers) recomputes its activations in the
        backward pass instead of keeping them from the forward -- activation memory down to
        the blocks' inputs, for a second forward of the blocks (see
        ``layers.CheckpointedBlock``). Training passes only: evaluation, no-grad passes and
        generation are unaffected. Call before or after ``train.compile`` compiles the blocks."""
        set_activation_checkpointing(self, enabled)

    def forward(self, batch: Batch, prenet_dropout: bool | None = None,
                self_feed: Tensor | None = None) -> dict[str, Tensor]:
        """Teacher-forced pass. ``prenet_dropout`` defaults to ``self.training``.

        ``self_feed`` (0-d tensor, a probability): each decoder step's input is, with this
        probability, the model's own prediction of the previous frame group instead of the
        ground truth (see ``_self_fed_inputs``). None: pure teacher forcing.

        Returns (normalised domain, T = batch mel length):
          mel_pre [B, T, n_mels]   decoder output;  mel_post [B, T, n_mels] after the postnet
          mel_target [B, T, n_mels] normalised target (zeros on padding)
          stop_logits [B, T] float32
          align_moments [B, S, 2K] float32, S = ceil(T / r): guided-attention moments
          step_lengths [B] long = ceil(mel_lengths / r): real decoder steps
        """
        dropout = self.training if prenet_dropout is None else prenet_dropout
        mel, mel_lengths = batch["mel"], batch["mel_lengths"]
        b, t, n = mel.shape
        memory, mem_mask, feats, speaker = self.encode(batch["tokens"], batch["token_lengths"],
                                                       batch["language_ids"], batch["ref_mel"],
                                                       batch["ref_lengths"])
        target, prev, steps = self._teacher_inputs(mel, mel_lengths)
        n_latents = self.cfg.cond_latents
        if self_feed is not None:
            prev = self._self_fed_inputs(prev, memory, mem_mask, feats, dropout, speaker, self_feed)
        if self.training and self.cfg.frame_dropout > 0:
            # whole input groups -> 0 (the mean frame in the normalised domain): the decoder
            # cannot just continue its input and must take the content from the text
            keep = torch.rand(prev.shape[:2], device=prev.device) >= self.cfg.frame_dropout
            prev = prev * keep[..., None].to(prev.dtype)
        groups, stop, align = self.decoder(prev, memory, mem_mask, n_latents, feats, dropout,
                                           speaker)
        mel_pre = groups.reshape(b, steps * self.r, n)  # [B, T', n]
        frame_mask = lengths_to_mask(mel_lengths, steps * self.r)  # [B, T']
        mel_post = self.postnet(mel_pre, frame_mask, speaker)  # [B, T', n]
        return {
            "mel_pre": mel_pre[:, :t],
            "mel_post": mel_post[:, :t],
            "mel_target": target[:, :t],
            "stop_logits": stop.reshape(b, steps * self.r)[:, :t],
            "align_moments": align,
            "step_lengths": (mel_lengths + self.r - 1) // self.r,
        }

    def _self_fed_inputs(self, prev: Tensor, memory: Tensor, mem_mask: Tensor, feats: Tensor,
                         dropout: bool, speaker: Tensor, prob: Tensor) -> Tensor:
        """Parallel scheduled sampling (Duckworth et al., 2019): prev [B, S, r*n] -> the same
        with each step's input replaced, with probability ``prob``, by the model's own
        teacher-forced prediction of that group (no gradient through the first pass).

        Why: under pure teacher forcing the decoder learns to continue its exact input frames;
        fed its own, smoother predictions it lost the content (measured on the tiny model: L1
        0.33 with true inputs, 0.54 with its own one-step predictions, free-running output a
        blurred mean spectrum). Training on a mix of its own outputs makes the inputs it sees
        at inference familiar. Costs one extra (no-grad) decoder forward.
        """
        with torch.no_grad():
            own, _, _ = self.decoder(prev, memory, mem_mask, self.cfg.cond_latents, feats,
                                     dropout, speaker, moments=False)  # [B, S, r*n]
        own = nn.functional.pad(own, (0, 0, 1, 0))[:, :-1]  # step s gets prediction of group s-1
        use = torch.rand(prev.shape[:2], device=prev.device) < prob  # [B, S]
        return torch.where(use[..., None], own.to(prev.dtype), prev)

    @torch.no_grad()
    def alignment(self, batch: Batch) -> Tensor:
        """Explicit text attention of the guided layer, [B, S, L] (teacher forced, no dropout),
        for alignment images. Materialises weights: call outside the training step."""
        memory, mem_mask, _, speaker = self.encode(batch["tokens"], batch["token_lengths"],
                                                   batch["language_ids"], batch["ref_mel"],
                                                   batch["ref_lengths"])
        _, prev, _ = self._teacher_inputs(batch["mel"], batch["mel_lengths"])
        return self.decoder.alignment_weights(prev, memory, mem_mask, self.cfg.cond_latents,
                                              speaker)

    # ------------------------------------------------------------- inference

    def decode_steps(self, memory: Tensor, mem_mask: Tensor, speaker: Tensor, max_frames: int,
                     threshold: float, prenet_dropout: bool) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        """The autoregressive loop with the KV cache, one decoder step per iteration: yields
        ``(group [B, r, n_mels] normalised, stop_logits [B, r], lengths [B])`` where
        ``lengths`` is each utterance's stop length so far (``max_frames`` until it stops).
        Ends when every utterance stopped or ``max_frames`` are decoded. Streaming synthesis
        consumes it directly; ``generate_frames`` collects it. Call under inference mode."""
        b = memory.shape[0]
        max_steps = -(-max_frames // self.r)
        cache = self.decoder.init_cache(memory, mem_mask, max_steps, speaker)
        prev = memory.new_zeros(b, self.r * self.n_mels)  # the "go" frame group
        lengths = torch.full((b,), max_frames, dtype=torch.long, device=memory.device)
        done = torch.zeros(b, dtype=torch.bool, device=memory.device)
        offsets = torch.arange(self.r, device=memory.device)  # [r]
        for step in range(max_steps):
            prev, stop = self.decoder.step(prev, cache, step, prenet_dropout)  # [B, r*n], [B, r]
            fired = torch.sigmoid(stop) > threshold  # [B, r]
            # first firing frame in this group (r if none) -> absolute stop length
            first = torch.where(fired, offsets, self.r).amin(dim=1)  # [B]
            newly = ~done & (first < self.r)
            lengths = torch.where(newly, step * self.r + first + 1, lengths)
            done = done | newly
            yield prev.reshape(b, self.r, self.n_mels), stop, lengths.clamp(max=max_frames)
            if bool(done.all()):  # one host sync per step; decoding is sequential anyway
                return

    @torch.inference_mode()
    def generate_frames(self, tokens: Tensor, token_lengths: Tensor, language_ids: Tensor,
                        ref_mel: Tensor | None, ref_lengths: Tensor | None,
                        max_frames: int | None = None, stop_threshold: float | None = None,
                        prenet_dropout: bool = True, latents: Tensor | None = None
                        ) -> dict[str, Tensor]:
        """Free-running decoding (no postnet), batched; each utterance stops on its own.

        Returns ``mel_pre`` [B, F, n_mels] normalised decoder frames (F = frames decoded),
        ``stop_logits`` [B, F], ``lengths`` [B] long: the first frame whose stop
        probability exceeds the threshold, inclusive, else ``max_frames``, and ``speaker``
        [B, d], the voice vector (the postnet needs it). ``latents`` replaces the reference.
        """
        max_frames, threshold = self.decode_limits(max_frames, stop_threshold)
        was_training = self.training
        self.eval()  # attention/FF dropout off; the prenet's is governed by prenet_dropout
        try:
            memory, mem_mask, _, speaker = self.encode(tokens, token_lengths, language_ids,
                                                       ref_mel, ref_lengths, latents)
            b = tokens.shape[0]
            groups, stops, lengths = [], [], None
            for group, stop, so_far in self.decode_steps(memory, mem_mask, speaker, max_frames,
                                                         threshold, prenet_dropout):
                groups.append(group)
                stops.append(stop)
                lengths = so_far
            n_frames = len(groups) * self.r
            mel = torch.cat(groups, 1)[:, :max_frames]  # [B, F, n_mels]
            stop_logits = torch.stack(stops, 1).reshape(b, n_frames)[:, :max_frames]
        finally:
            self.train(was_training)
        return {"mel_pre": mel, "stop_logits": stop_logits, "lengths": lengths, "speaker": speaker}

    def decode_limits(self, max_frames: int | None, stop_threshold: float | None
                      ) -> tuple[int, float]:
        """``max_frames`` / ``stop_threshold`` with the config's defaults, checked."""
        max_frames = self.cfg.max_decoder_frames if max_frames is None else int(max_frames)
        threshold = self.cfg.stop_threshold if stop_threshold is None else float(stop_threshold)
        if max_frames < 1:
            raise ValueError(f"max_frames must be >= 1, got {max_frames}")
        return max_frames, threshold

    def postnet_mel(self, mel_pre: Tensor, lengths: Tensor, speaker: Tensor) -> Tensor:
        """Normalised decoder frames [B, F, n_mels] -> raw log-mel after the postnet, zero past
        each utterance's length (the postnet sees a frame's neighbours up to
        ``postnet_context`` frames away, which streaming relies on)."""
        mask = lengths_to_mask(lengths, mel_pre.shape[1])  # [B, F]
        post = self.postnet(mel_pre, mask, speaker)  # [B, F, n]
        return self.denormalize(post) * mask[..., None].to(post.dtype)

    @property
    def postnet_context(self) -> int:
        """Frames on each side that one postnet output frame depends on."""
        return self.cfg.postnet_layers * (self.cfg.postnet_kernel // 2)

    @torch.inference_mode()
    def generate(self, tokens: Tensor, token_lengths: Tensor, language_ids: Tensor,
                 ref_mel: Tensor | None, ref_lengths: Tensor | None,
                 max_frames: int | None = None, stop_threshold: float | None = None,
                 prenet_dropout: bool = True, latents: Tensor | None = None
                 ) -> tuple[Tensor, Tensor]:
        """Synthesize log-mels: -> (mel [B, F, n_mels] raw log-mel, zero beyond each length;
        mel_lengths [B] long). F = max(mel_lengths).

        tokens [B, L] (PAD=0), token_lengths [B], language_ids [B], ref_mel [B, R, n_mels] raw
        log-mel, ref_lengths [B] (or ``latents`` [B, C, d] from ``condition``, e.g. averaged
        over several clips). ``max_frames`` defaults to model.max_decoder_frames,
        ``stop_threshold`` to model.stop_threshold; ``prenet_dropout`` (default on, the Tacotron
        trick) can be switched off for deterministic output.
        """
        out = self.generate_frames(tokens, token_lengths, language_ids, ref_mel, ref_lengths,
                                   max_frames, stop_threshold, prenet_dropout, latents)
        lengths = out["lengths"]
        n_frames = int(lengths.max())
        was_training = self.training
        self.eval()
        try:
            mel = self.postnet_mel(out["mel_pre"][:, :n_frames], lengths, out["speaker"])
        finally:
            self.train(was_training)
        return mel, lengths


def build_model(cfg: Config, n_tokens: int, n_languages: int, mel_mean: Tensor | None,
                mel_std: Tensor | None) -> XTTS:
    """The model of ``cfg`` for a vocabulary of ``n_tokens`` ids and ``n_languages`` languages;
    ``mel_mean``/``mel_std`` [n_mels] are the store's log-mel statistics (None: 0 / 1)."""
    return XTTS(cfg.model, cfg.audio.n_mels, n_tokens, n_languages, mel_mean, mel_std)


def count_parameters(cfg: Config, n_tokens: int = ASSUMED_VOCAB_SIZE) -> int:
    """Trainable parameters of ``cfg``'s model, built on the meta device (no memory, ~ms)."""
    with torch.device("meta"):
        model = build_model(cfg, n_tokens, len(cfg.text.languages), None, None)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# Weights of each part ``train.freeze`` names (config.sections.FreezePart), by parameter
# name prefix; the text encoder's embeddings are a part of their own, so a fine-tuning run
# can keep the encoder's layers and still learn the rows of new letters (or the reverse).
TEXT_EMBEDDINGS = ("text_encoder.token_emb.", "text_encoder.lang_emb.")
_TOP_PARTS = {"cond_encoder": "conditioning", "text_encoder": "text_encoder",
              "decoder": "decoder", "postnet": "postnet"}


def part_of(param_name: str) -> str:
    """The ``train.freeze`` part that holds the parameter ``param_name`` of an :class:`XTTS`."""
    if param_name.startswith(TEXT_EMBEDDINGS):
        return "text_embeddings"
    return _TOP_PARTS[param_name.split(".", 1)[0]]
