"""Streaming synthesis: audio chunks of a text as its sentences are decoded.

Why this shape: streamed audio must be the whole output, and no piece may be cut at
``model.max_decoder_frames``. A sentence that reaches that limit without stopping is split
and decoded again (``inference.longform``), which is only possible while none of its audio
has been handed out; so a piece's audio is released once the piece has stopped. Streaming
runs the very schedule of whole synthesis (``Synthesizer.speak``: the first sentence alone,
then windows of sentences, each batch seeded the same way), so the chunks concatenate to
``Synthesizer.synthesize([text])[0]`` exactly. The first audio comes after the first
sentence's decode; each piece is handed out in chunks of ``first_frames`` then
``chunk_frames`` frames for players that want small buffers.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from myxtts.config import Config


class SynthesizerLike(Protocol):
    """What streaming reads of an ``inference.synthesizer.Synthesizer`` (which calls in here
    with itself, so this module needs no import of it)."""

    cfg: Config

    def voice(self, audio_paths: Sequence[str | Path]) -> torch.Tensor: ...

    def speak(self, texts: Sequence[str], reference: Sequence[str | Path] | torch.Tensor,
              language: str | None = None, seed: int | None = 0, progress: Any = None
              ) -> Iterator[tuple[int, np.ndarray]]: ...


def stream_speech(synth: SynthesizerLike, text: str, reference: Sequence[str | Path] | torch.Tensor,
                  language: str | None, seed: int | None, first_frames: int = 8,
                  chunk_frames: int = 32) -> Iterator[np.ndarray]:
    """float32 audio chunks of ``text`` in ``language`` (None: each sentence in its own) with
    the voice of ``reference``."""
    if first_frames < 1 or chunk_frames < 1:
        raise ValueError(f"first_frames and chunk_frames must be >= 1, got {first_frames}, "
                         f"{chunk_frames}")
    hop = synth.cfg.audio.hop_length
    size = first_frames * hop
    for _, audio in synth.speak([text], reference, language, seed):
        start = 0
        while start < audio.size:
            yield audio[start:start + size]
            start += size
            size = chunk_frames * hop
