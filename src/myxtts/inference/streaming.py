"""Streaming synthesis: audio chunks while the decoder is still producing frames.

Why chunks are exact: a frame's final log-mel depends on decoder frames up to
``postnet_context`` away, and a sample on log-mels up to ``receptive_field_frames`` away, so
once that much context past ``ready`` is decoded, the postnet and the vocoder run on a window
with context on both sides and its centre equals the whole-utterance output: no clicks, and
the chunks concatenate to the non-streaming audio up to float rounding. The first chunk is
small (``first_frames``) for a short time to first audio. Griffin-Lim estimates phase over a
whole window, so its chunks overlap by ``CROSSFADE_FRAMES`` and are cross-faded (a no-op for
the neural vocoder). Sentences of a long text stream one after another (``inference.longform``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from myxtts.config import Config
from myxtts.inference import longform
from myxtts.text import Tokenizer

log = logging.getLogger(__name__)
CROSSFADE_FRAMES = 2
GRIFFIN_LIM_CONTEXT = 6  # frames of context on each side of a Griffin-Lim window


class SynthesizerLike(Protocol):
    """What streaming reads of an ``inference.synthesizer.Synthesizer`` (which calls in here
    with itself, so this module needs no import of it)."""

    model: Any  # the XTTS model: encode, decode_steps, postnet_mel, decode_limits
    cfg: Config
    tokenizer: Tokenizer
    device: torch.device
    vocoder: Any  # mel [B, F, n_mels] -> wav [B, F * hop]
    neural: bool  # a neural vocoder (exact chunks), else Griffin-Lim (cross-faded chunks)
    max_frames: int

    def voice(self, audio_paths: Sequence[str | Path]) -> torch.Tensor: ...

    def encode(self, texts: Sequence[str], language: str, check: bool = True
               ) -> tuple[torch.Tensor, torch.Tensor]: ...


def vocoder_context(synth: SynthesizerLike) -> int:
    return synth.vocoder.receptive_field_frames if synth.neural else GRIFFIN_LIM_CONTEXT


def stream_speech(synth: SynthesizerLike, text: str, reference: Sequence[str | Path] | torch.Tensor,
                  language: str, seed: int | None, first_frames: int = 8,
                  chunk_frames: int = 32) -> Iterator[np.ndarray]:
    """float32 audio chunks of ``text`` in ``language`` with the voice of ``reference``."""
    if first_frames < 1 or chunk_frames < 1:
        raise ValueError(f"first_frames and chunk_frames must be >= 1, got {first_frames}, "
                         f"{chunk_frames}")
    latents = reference if isinstance(reference, torch.Tensor) else synth.voice(reference)
    synth.encode([text], language)  # user errors first
    sr = synth.cfg.audio.sample_rate
    for piece in longform.plan_pieces([text], language):
        yield from _stream_sentence(synth, piece.text, latents, language, seed, first_frames,
                                    chunk_frames)
        if piece.pause_s > 0:
            yield np.zeros(int(round(piece.pause_s * sr)), np.float32)


@torch.inference_mode()
def _stream_sentence(synth: SynthesizerLike, text: str, latents: torch.Tensor, language: str,
                     seed: int | None, first_frames: int, chunk_frames: int
                     ) -> Iterator[np.ndarray]:
    model, dev, hop = synth.model, synth.device, synth.cfg.audio.hop_length
    tokens, token_lengths = synth.encode([text], language, check=False)  # checked whole
    if seed is not None:
        torch.manual_seed(seed)  # the same prenet noise as synthesize()
    lang = torch.full((1,), synth.tokenizer.language_id(language), device=dev)
    max_frames, threshold = model.decode_limits(synth.max_frames, None)
    memory, mem_mask, _, speaker = model.encode(tokens, token_lengths, lang, None, None, latents)
    ctx_post, ctx_voc = model.postnet_context, vocoder_context(synth)
    xfade = 0 if synth.neural else CROSSFADE_FRAMES * hop
    frames: list[torch.Tensor] = []  # decoded groups, normalised [1, r, n_mels]
    emitted = 0  # frames whose audio has been handed out
    tail = np.zeros(0, np.float32)  # audio held back for the cross-fade
    for group, _, lengths in model.decode_steps(memory, mem_mask, speaker, max_frames,
                                                threshold, prenet_dropout=True):
        frames.append(group)
        n_avail = len(frames) * group.shape[1]
        length = int(lengths[0])  # a host read per step: decoding syncs per step anyway
        done = length < max_frames or n_avail >= max_frames
        ready = min(length, n_avail) if done else n_avail - ctx_post - ctx_voc
        want = first_frames if emitted == 0 else chunk_frames
        if ready - emitted < want and not done:
            continue
        if ready > emitted:
            pre = torch.cat(frames, dim=1)[:, : min(length, n_avail)]
            audio = _window_audio(synth, pre, speaker, emitted, ready, ctx_post, ctx_voc, xfade)
            audio, tail = _crossfade(tail, audio, xfade, last=done)
            if audio.size:
                yield audio
            emitted = ready
        if done:
            if length >= max_frames:
                log.warning("%r reached model.max_decoder_frames = %d without stopping and was "
                            "cut there (streamed audio cannot be taken back); split it into "
                            "shorter sentences", text, max_frames)
            break
    if tail.size:
        yield tail


def _window_audio(synth: SynthesizerLike, pre: torch.Tensor, speaker: torch.Tensor, start: int,
                  end: int, ctx_post: int, ctx_voc: int, xfade: int) -> np.ndarray:
    """Audio of frames ``[start, end)`` (plus ``xfade`` samples before ``start`` when
    cross-fading), computed on a window with full context."""
    model, hop = synth.model, synth.cfg.audio.hop_length
    n = pre.shape[1]
    lead = xfade // hop if start > 0 else 0
    v0, v1 = max(0, start - lead - ctx_voc), min(n, end + ctx_voc)  # vocoder window
    p0, p1 = max(0, v0 - ctx_post), min(n, v1 + ctx_post)  # postnet window
    window = pre[:, p0:p1]
    mel = model.postnet_mel(window, torch.tensor([p1 - p0], device=pre.device), speaker)
    mel = mel[:, v0 - p0: v1 - p0]  # [1, v1 - v0, n_mels] raw log-mel
    wav = synth.vocoder(mel.float())[0]  # [(v1 - v0) * hop]
    a = (start - lead - v0) * hop
    return wav[a: (end - v0) * hop].float().cpu().numpy()


def _crossfade(tail: np.ndarray, audio: np.ndarray, xfade: int, last: bool
               ) -> tuple[np.ndarray, np.ndarray]:
    """Blend the held-back ``tail`` into the start of ``audio``; hold back this chunk's
    last ``xfade`` samples unless it is the last. Returns (chunk to emit, new tail)."""
    if xfade == 0:
        return audio, np.zeros(0, np.float32)
    if tail.size:
        k = min(tail.size, audio.size)
        ramp = np.linspace(0.0, 1.0, k, dtype=np.float32)
        audio = audio.copy()
        audio[:k] = tail[:k] * (1.0 - ramp) + audio[:k] * ramp
    if last or audio.size <= xfade:
        return audio, np.zeros(0, np.float32)
    return audio[:-xfade], audio[-xfade:]
