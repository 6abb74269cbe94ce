"""What ``myxtts evaluate`` needs of a model (``SpeakingModel``), and the one place a model
path is opened as one (``open_speaking_model``).

The harness (``evaluate.harness``) picks utterances, loads their clips, times and scores
what comes back; everything that depends on how a family makes speech -- how a reference
becomes a voice, how decoding is cut at the length cap, whether a true clip can go through
the family's vocoder, how text is cleaned before CER/WER compare it -- sits behind this
protocol. Each family is one adapter: ``evaluate.mel_speaking`` is the family of ``myxtts train``
(a mel model and a vocoder), ``evaluate.xtts_speaking`` Coqui's XTTS-v2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from myxtts.artifacts.xtts_v2 import is_xtts_v2
from myxtts.config import Config
from myxtts.evaluate.mel_speaking import MelSpeakingModel
from myxtts.evaluate.xtts_speaking import XttsV2SpeakingModel


class SpeakingModel(Protocol):
    """A model the harness can score. Opening it reads what it is (``config``,
    ``languages``, ``sample_rate``, ``training_record``); ``load`` builds its networks, and
    the rest is valid after it (the harness checks its data first, so a data error is said
    before minutes of loading).

    ``sample_rate``: the rate of every clip passed in and out (``config.audio.sample_rate``
    is the same). ``languages``: the language codes it speaks. ``device``: where it runs.
    ``vocoder``: what makes its audio, as the report names it ("Griffin-Lim", "the
    bundle's", a --vocoder path). ``config``: the data settings the harness picks
    utterances and loads clips with (durations, split, trimming, the scorer's audio).
    ``length_limit``: the family's own cap on an utterance's length, as the note on
    utterances that did not stop names it ("model.max_decoder_frames (48)").
    ``training_record``: the run's last evaluation in training where the family keeps one
    (``evaluate.record``), else None."""

    sample_rate: int
    languages: list[str]
    config: Config
    training_record: dict[str, Any] | None

    @property
    def device(self) -> torch.device: ...

    @property
    def vocoder(self) -> str: ...

    @property
    def length_limit(self) -> str: ...

    def load(self) -> None:
        """Build the networks on ``device`` (a bad --device or --vocoder is said here)."""

    def voice_of(self, wav: np.ndarray, name: str) -> Any:
        """The voice of the reference clip ``wav`` (float32 at ``sample_rate``) named
        ``name`` in messages, as ``say`` takes it; AudioError or SynthesisError when the
        clip cannot condition the model (too short, silent), so the harness tries another
        clip of the speaker."""

    def warm_up(self, text: str, voice: Any, language: str, seed: int) -> None:
        """A short untimed synthesis before the timed ones, so first-call costs
        (allocations, kernel selection) stay out of the real-time factor."""

    def say(self, text: str, voice: Any, language: str, seed: int,
            truth_samples: int) -> tuple[np.ndarray, bool]:
        """``text`` in ``language`` spoken in ``voice`` (``seed`` fixes any sampling): float32
        audio at ``sample_rate`` on the host (the harness times this call, the device's work
        included), and whether decoding ran into its cap instead of stopping. The cap is
        ``metrics.truth.length_cap`` of the true clip's length (``truth_samples`` samples at
        ``sample_rate``) in the family's own decoding steps, or ``length_limit``, the smaller."""

    def vocoded_truth(self, truth: np.ndarray) -> np.ndarray | None:
        """The true clip through the family's vocoder (what a perfect acoustic model would
        sound like), or None where the family's audio cannot be made from a true clip:
        the harness then leaves that row out and says so."""

    def scoring_text(self, text: str, language: str) -> str:
        """``text`` as the model reads it (cleaned, numbers spelled out): what CER and WER
        compare a transcript with."""


def open_speaking_model(path: str | Path, device: str = "auto",
                        vocoder: str | Path | None = None) -> SpeakingModel:
    """The model at ``path`` (a run folder, checkpoint or bundle of ``myxtts train``, or an
    XTTS-v2 folder or bundle) as a
    ``SpeakingModel``, not yet loaded. A family is one branch here, decided from the path
    alone; what no branch claims goes to ``myxtts train``'s reader, whose errors name what
    the path is instead (a bundle of another family included)."""
    if is_xtts_v2(path):
        return XttsV2SpeakingModel.open(path, device, vocoder)
    return MelSpeakingModel.open(path, device, vocoder)
