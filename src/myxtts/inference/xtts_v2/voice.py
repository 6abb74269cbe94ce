"""An XTTS-v2 voice: what the model conditions on, made from reference clips as the reference
implementation makes it, or taken from the released speakers file.

Each clip is read at its own rate (``audio.io.read_audio``: mono, checked), resampled to
22050 Hz with the sinc resampler the model was trained with (``audio.sinc_resample``),
clipped to [-1, 1] and cut to ``max_ref_len`` seconds. The speaker embedding is the mean of
the clips' (each at 16 kHz through the ResNet speaker encoder); the GPT's conditioning
latents come from the clips joined end to end, their first ``gpt_cond_len`` seconds in
chunks of ``gpt_cond_chunk_len`` seconds, averaged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from myxtts.audio.io import AudioError, read_audio
from myxtts.audio.sinc_resample import sinc_resample
from myxtts.inference.errors import SynthesisError
from myxtts.model.xtts_v2.config import XttsV2Voice

GPT_RATE = 22050  # the rate the GPT's conditioning and the DVAE hear


@dataclass(frozen=True)
class XttsVoice:
    """``latents``: the GPT's conditioning ``[1, 32, D]``; ``speaker``: the HiFi-GAN's speaker
    embedding ``[1, 512, 1]``."""

    latents: torch.Tensor
    speaker: torch.Tensor

    def to(self, device: torch.device) -> XttsVoice:
        return XttsVoice(self.latents.to(device), self.speaker.to(device))


def reference_clip(source: str | Path | np.ndarray, rate: int | None = None,
                   settings: XttsV2Voice | None = None) -> torch.Tensor:
    """One reference as the model hears it: ``[1, n]`` float32 at 22050 Hz, clipped to
    [-1, 1], at most ``max_ref_len`` seconds (loudness-normalised where
    ``sound_norm_refs``). ``source``: a file, or mono samples at ``rate``."""
    settings = settings or XttsV2Voice()
    if isinstance(source, np.ndarray):
        if rate is None:
            raise ValueError("samples given without their rate")
        wav = source
    else:
        try:
            wav, rate = read_audio(source)
        except AudioError as e:
            raise SynthesisError(f"reference {str(e).rsplit('; ', 1)[0]}; use another recording "
                                 f"of the voice (WAV, FLAC, OGG or MP3, 3-30 s)") from None
    audio = sinc_resample(torch.from_numpy(np.ascontiguousarray(wav, np.float32))[None],
                          int(rate), GPT_RATE)
    audio = audio.clamp_(-1.0, 1.0)[:, :GPT_RATE * settings.max_ref_len]
    if settings.sound_norm_refs:
        audio = audio / audio.abs().max().clamp(min=1e-9) * 0.75
    return audio


def speakers_voices(speakers: dict[str, dict[str, torch.Tensor]]) -> dict[str, XttsVoice]:
    """The released ``speakers_xtts.pth`` entries as voices."""
    return {name: XttsVoice(v["gpt_cond_latent"], v["speaker_embedding"])
            for name, v in speakers.items()}


def pick_speaker(voices: dict[str, XttsVoice], name: str, source: str) -> XttsVoice:
    """The stored voice ``name``; one line listing the stored voices when there is none."""
    if name in voices:
        return voices[name]
    if not voices:
        raise SynthesisError(f"{source} has no stored voices (no speakers_xtts.pth); clone a "
                             f"voice with --reference CLIP instead of --speaker")
    close = sorted(voices, key=lambda n: (name.lower() not in n.lower(), n))[:8]
    raise SynthesisError(f"--speaker {name!r} is not a voice of {source}; it has "
                         f"{len(voices)}, e.g. {', '.join(close)}")


def clips_of(references: Sequence[str | Path | np.ndarray], rate: int | None,
             settings: XttsV2Voice) -> list[torch.Tensor]:
    if not references:
        raise SynthesisError("no reference audio: give --reference CLIP (a few seconds of the "
                             "voice) or --speaker NAME")
    return [reference_clip(r, rate, settings) for r in references]
