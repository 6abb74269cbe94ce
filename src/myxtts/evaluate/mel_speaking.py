"""The model family of ``myxtts train`` as ``myxtts evaluate`` scores it
(``evaluate.speaking.SpeakingModel``): a mel model conditioned on a reference's mel, voiced
by a vocoder (a bundle's, --vocoder, or Griffin-Lim), through
``inference.synthesizer.Synthesizer``.

A true clip's mel goes through the same vocoder ("truth, vocoded"), so the vocoder's share
of an error shows; decoding is cut at ``metrics.truth.length_cap`` of the true clip's
frames, or ``model.max_decoder_frames``, the smaller.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from myxtts.artifacts.bundle import Trained, is_bundle
from myxtts.artifacts.trained import load_trained
from myxtts.config import config_from_dict
from myxtts.evaluate.record import read_evaluation
from myxtts.inference.synthesizer import Synthesizer
from myxtts.metrics.truth import length_cap
from myxtts.text import clean_text

WARM_UP_FRAMES = 24  # enough to run every kernel once, too few to cost


def training_record(trained: Trained) -> dict[str, Any] | None:
    """The run's last evaluation in training: the one a bundle carries, else the run's own
    ``evaluation.json`` beside the checkpoint read (``evaluate.record``)."""
    if is_bundle(trained.source):
        return trained.evaluation
    return read_evaluation(trained.source)


class MelSpeakingModel:
    """``trained`` (read by ``artifacts.trained.load_trained``) to be spoken on ``device``
    through ``vocoder`` (a ``myxtts train-vocoder`` run; None: the bundle's where it
    carries one, else Griffin-Lim). ``load`` builds the ``Synthesizer`` (``synth``)."""

    def __init__(self, trained: Trained, device: str = "auto",
                 vocoder: str | Path | None = None) -> None:
        self.trained, self._device, self._vocoder = trained, device, vocoder
        self.config = config_from_dict(trained.config)
        self.sample_rate = self.config.audio.sample_rate
        self.languages = list(trained.vocab["languages"])
        self.training_record = training_record(trained)
        self.synth: Synthesizer | None = None

    @classmethod
    def open(cls, path: str | Path, device: str = "auto",
             vocoder: str | Path | None = None) -> MelSpeakingModel:
        """A run folder, checkpoint or bundle of ``myxtts train`` (its averaged weights)."""
        return cls(load_trained(path), device, vocoder)

    def load(self) -> None:
        if self.synth is None:
            self.synth = Synthesizer.from_trained(self.trained, self._device, self._vocoder)

    @property
    def _loaded(self) -> Synthesizer:
        if self.synth is None:
            raise RuntimeError("MelSpeakingModel.load() first: the networks are not built")
        return self.synth

    @property
    def device(self) -> torch.device:
        return self._loaded.device

    @property
    def vocoder(self) -> str:
        if self._vocoder:
            return str(self._vocoder)
        return "the bundle's" if self._loaded.neural else "Griffin-Lim"

    @property
    def length_limit(self) -> str:
        return f"model.max_decoder_frames ({self.config.model.max_decoder_frames})"

    def voice_of(self, wav: np.ndarray, name: str) -> torch.Tensor:
        """Conditioning latents of the clip (made once: its warnings are said once)."""
        synth = self._loaded
        with torch.inference_mode():
            return synth.model.condition(*synth.reference_of(wav, name))

    def warm_up(self, text: str, voice: torch.Tensor, language: str, seed: int) -> None:
        """``WARM_UP_FRAMES`` frames of ``text``, vocoded."""
        synth = self._loaded
        keep, synth.max_frames = synth.max_frames, WARM_UP_FRAMES
        try:
            synth.vocode(*synth.synthesize_mel([text], voice, language, seed))
        finally:
            synth.max_frames = keep

    def say(self, text: str, voice: torch.Tensor, language: str, seed: int,
            truth_samples: int) -> tuple[np.ndarray, bool]:
        synth = self._loaded
        # a model that never stops decodes up to MAX_LENGTH_RATIO x the truth, not for minutes
        cap = length_cap(truth_samples // self.config.audio.hop_length)
        keep, synth.max_frames = synth.max_frames, min(synth.max_frames, cap)
        try:
            mels, lengths = synth.synthesize_mel([text], voice, language, seed)
            spoken = synth.vocode(mels, lengths)[0]  # back on the host: the device's work is done
            return spoken, int(lengths[0]) >= synth.max_frames
        finally:
            synth.max_frames = keep

    def vocoded_truth(self, truth: np.ndarray) -> np.ndarray:
        """The true clip's mel (the training ``MelSpectrogram``) through the same vocoder."""
        synth = self._loaded
        with torch.inference_mode():
            mel, n = synth.mel(torch.from_numpy(truth).to(synth.device))
            return synth.vocode(mel[None], n.reshape(1))[0]

    def scoring_text(self, text: str, language: str) -> str:
        return clean_text(text, language, self.config.text)
