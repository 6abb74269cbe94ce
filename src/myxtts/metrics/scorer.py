"""Every metric of one clip (``Scorer``), and their summary over many (``summarize``).

A clip is scored on what it says (ASR error counts against its text), whose voice it has
(similarity of its d-vector to a reference clip's), how it sounds (DNSMOS) and how close it
is to its ground-truth clip (``truth.against_truth``). Each family is optional: the scorer
of a training run leaves out ASR and DNSMOS (seconds per clip), and a language without a
recognizer gets no error counts rather than made-up ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from myxtts.config import AudioConfig
from myxtts.metrics import require
from myxtts.metrics.asr import ErrorCounts, Recognizer, recognizer
from myxtts.metrics.mos import DNSMOS
from myxtts.metrics.speaker import SpeakerEncoder, similarity
from myxtts.metrics.truth import against_truth

# Summary keys, in table order: what each means is in docs/evaluation.md.
METRICS = ("cer", "wer", "similarity", "sig", "bak", "ovrl", "mcd_db", "f0_rmse_cents",
           "voicing_error", "duration_ratio", "rtf")


def packages(asr: str = "pocketsphinx", speaker: bool = True, mos: bool = True) -> list[str]:
    """The optional packages a scorer with these families needs (``metrics.require``)."""
    needed = ["pocketsphinx"] if asr == "pocketsphinx" else []
    needed += ["resemblyzer"] if speaker else []
    return needed + (["speechmos", "onnxruntime", "librosa"] if mos else [])


@dataclass
class ClipScores:
    """One clip's scores; None where a metric was not computed for it."""

    errors: ErrorCounts | None = None
    transcript: str | None = None
    similarity: float | None = None
    mos: dict[str, float] | None = None  # sig, bak, ovrl
    truth: dict[str, float] | None = None  # truth.TruthScores as a dict
    seconds: float = 0.0  # the clip's length
    synthesis_s: float | None = None  # the time it took to make (the model's clips)

    def flat(self) -> dict[str, Any]:
        """The per-utterance values, one key per metric (the CSV's columns)."""
        out: dict[str, Any] = {
            "cer": self.errors.cer if self.errors else None,
            "wer": self.errors.wer if self.errors else None,
            "similarity": self.similarity, **(self.mos or {}), **(self.truth or {}),
            "rtf": self.synthesis_s / self.seconds if self.synthesis_s and self.seconds else None,
            "seconds": self.seconds, "transcript": self.transcript}
        return out


@dataclass
class Scorer:
    """Scores clips at ``audio.sample_rate``. ``asr``: a recognizer spec (``asr.recognizer``;
    ``none`` for no ASR); ``speaker`` / ``mos``: compute similarity / DNSMOS."""

    audio: AudioConfig
    asr: str = "pocketsphinx"
    speaker: bool = True
    mos: bool = True
    device: str = "cpu"
    recognizer: Recognizer | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        # each family loads its model now, so a missing package fails before any synthesis
        require(*packages(self.asr, self.speaker, self.mos))
        self.recognizer = recognizer(self.asr)
        self._encoder = self._dnsmos = None
        if self.speaker:
            self._encoder = SpeakerEncoder(self.device)
        if self.mos:
            self._dnsmos = DNSMOS()

    def speaks(self, language: str) -> bool:
        return self.recognizer is not None and self.recognizer.speaks(language)

    def embed(self, wav: np.ndarray) -> np.ndarray | None:
        """The clip's d-vector (None without the speaker family)."""
        if self._encoder is None:
            return None
        return self._encoder.embed(wav, self.audio.sample_rate)

    def score(self, wav: np.ndarray, text: str | None = None, language: str = "en",
              truth: np.ndarray | None = None, reference: np.ndarray | None = None
              ) -> ClipScores:
        """All the scores ``wav`` can get: ASR against ``text`` (cleaned, in ``language``),
        similarity to the d-vector ``reference``, DNSMOS, and ``truth``'s comparisons."""
        sr = self.audio.sample_rate
        out = ClipScores(seconds=len(wav) / sr)
        if text is not None and self.speaks(language):
            out.transcript = self.recognizer.transcribe(wav, sr, language)
            out.errors = ErrorCounts.of(text, out.transcript)
        if reference is not None and self._encoder is not None:
            out.similarity = similarity(self.embed(wav), reference)
        if self._dnsmos is not None:
            out.mos = self._dnsmos.score(wav, sr).to_dict()
        if truth is not None:
            out.truth = against_truth(wav, truth, self.audio).to_dict()
        return out


def summarize(scores: list[ClipScores]) -> dict[str, float | None]:
    """Means over the clips of each metric (NaN values, such as an F0 error without voiced
    pairs, left out); CER and WER pooled (all edits / all reference characters or words);
    RTF as all synthesis time / all audio. None for a metric no clip has."""
    out: dict[str, float | None] = {}
    counted = [s.errors for s in scores if s.errors is not None]
    total = sum(counted, ErrorCounts()) if counted else None
    out["cer"], out["wer"] = (total.cer, total.wer) if total else (None, None)
    flat = [s.flat() for s in scores]
    for key in METRICS[2:-1]:
        values = [v for f in flat if (v := f.get(key)) is not None and not math.isnan(v)]
        out[key] = float(np.mean(values)) if values else None
    made = [s for s in scores if s.synthesis_s is not None]
    audio_s = sum(s.seconds for s in made)
    out["rtf"] = sum(s.synthesis_s for s in made) / audio_s if made and audio_s else None
    out["utterances"] = float(len(scores))
    return out
