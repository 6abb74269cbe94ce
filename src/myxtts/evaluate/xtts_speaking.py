"""Coqui's XTTS-v2 as ``myxtts evaluate`` scores it (``evaluate.speaking.SpeakingModel``),
through ``inference.xtts_v2.XttsV2Synthesizer``: the folder as downloaded or its bundle.

Its audio comes from GPT latents, not from a mel, so no true clip can go through its
decoder alone: the "truth, vocoded" row is left out (the harness says so). Decoding draws
codes with the model's own sampling settings, seeded; each utterance's codes are capped at
``metrics.truth.length_cap`` of the true clip's length in codes (one code per 1024 samples
at 22050 Hz), or the model's limit, the smaller.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from myxtts.artifacts.xtts_v2 import read_xtts_v2_any
from myxtts.artifacts.xtts_v2.run import is_xtts_run
from myxtts.config import Config, config_from_dict
from myxtts.evaluate.record import read_evaluation
from myxtts.inference.xtts_v2.synthesizer import XttsV2Synthesizer
from myxtts.inference.xtts_v2.voice import XttsVoice
from myxtts.metrics import EvaluationError
from myxtts.metrics.truth import length_cap

WARM_UP_CODES = 8  # every kernel once, too few to cost
ROMANISED = ("zh", "ja", "ko")  # the model reads these romanised; a transcript is not


class XttsV2SpeakingModel:
    """An XTTS-v2 model to be spoken on ``device``; ``load`` builds the synthesizer.
    ``training_record``: the last evaluation in training of the fine-tuning run behind it
    (a run's ``evaluation.json``, or what its bundle carries); None for a model as
    downloaded."""

    def __init__(self, path: str | Path, device: str = "auto") -> None:
        self.path, self._device = Path(path), device
        self.files = read_xtts_v2_any(path)
        self.training_record = (read_evaluation(path) if is_xtts_run(self.path)
                                else self.files.evaluation)
        args = self.files.config.args
        self.sample_rate = args.output_sample_rate
        self.languages = list(self.files.config.languages)
        self.config: Config = config_from_dict({
            "audio": {"sample_rate": self.sample_rate},
            "text": {"languages": self.languages, "default_language": self.languages[0]}})
        self.synth: XttsV2Synthesizer | None = None

    @classmethod
    def open(cls, path: str | Path, device: str = "auto",
             vocoder: str | Path | None = None) -> XttsV2SpeakingModel:
        if vocoder is not None:
            raise EvaluationError(f"--vocoder: {path} is XTTS-v2, which speaks through its own "
                                  f"HiFi-GAN decoder; leave --vocoder out")
        return cls(path, device)

    def load(self) -> None:
        if self.synth is None:
            self.synth = XttsV2Synthesizer.from_files(self.files, self._device)

    @property
    def _loaded(self) -> XttsV2Synthesizer:
        if self.synth is None:
            raise RuntimeError("XttsV2SpeakingModel.load() first: the networks are not built")
        return self.synth

    @property
    def device(self) -> torch.device:
        return self._loaded.device

    @property
    def vocoder(self) -> str:
        return "XTTS-v2's HiFi-GAN decoder"

    @property
    def length_limit(self) -> str:
        return f"model_args.gpt_max_audio_tokens ({self.files.config.args.gpt_max_audio_tokens})"

    def voice_of(self, wav: np.ndarray, name: str) -> XttsVoice:
        return self._loaded.voice([wav], rate=self.sample_rate)

    def _capped(self, max_codes: int):
        """Cap the codes per piece; returns the decoding to restore."""
        synth = self._loaded
        limit = synth.model.gpt.max_gen_mel_tokens
        keep = synth.decoding
        synth.decoding = dataclasses.replace(keep, max_codes=max(1, min(max_codes, limit)))
        return keep

    def warm_up(self, text: str, voice: XttsVoice, language: str, seed: int) -> None:
        synth = self._loaded
        keep = self._capped(WARM_UP_CODES)
        try:
            synth.say(synth.pieces(text, language)[0], voice, language, seed)
        finally:
            synth.decoding = keep

    def say(self, text: str, voice: XttsVoice, language: str, seed: int,
            truth_samples: int) -> tuple[np.ndarray, bool]:
        synth = self._loaded
        args = synth.config.args
        codes = truth_samples * args.input_sample_rate / self.sample_rate / args.gpt_code_stride_len
        keep = self._capped(length_cap(int(codes)))
        try:
            parts = [synth.say(p, voice, language, seed) for p in synth.pieces(text, language)]
        finally:
            synth.decoding = keep
        return np.concatenate([w for w, _ in parts]), any(u for _, u in parts)

    def vocoded_truth(self, truth: np.ndarray) -> None:
        return None

    def scoring_text(self, text: str, language: str) -> str:
        base = language.split("-")[0]
        if base in ROMANISED:  # compared in its own script, numbers and all
            return " ".join(text.lower().split())
        return self._loaded.tokenizer.normalize(text, base)
