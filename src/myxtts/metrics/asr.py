"""Intelligibility: what a speech recognizer hears, scored against the text that was spoken.

``pocketsphinx`` (the default) recognizes English with the acoustic model, dictionary and
language model inside its wheel: weak (4 real LJSpeech clips: CER 0.20, WER 0.47 pooled) but
offline, and it separates speech from mumbling (garbage scores near 1). ``whisper[:SIZE]``
uses openai-whisper or faster-whisper where one is installed AND its weights are already
on disk: a download is never started (the error names where the weights must be).

Error rates are Levenshtein distances over characters (CER) and words (WER), on texts
lower-cased with punctuation removed (apostrophes inside words kept): edits / reference
length, summed over utterances for a corpus figure (``ErrorCounts``).
"""

from __future__ import annotations

import os
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import soxr

from myxtts.metrics import EvaluationError, missing, require

ASR_RATE = 16000  # every recognizer here listens at 16 kHz


def normalize(text: str) -> str:
    """Lower case, punctuation and symbols out (an apostrophe between letters stays), one
    space between words."""
    text = unicodedata.normalize("NFKC", text).lower().replace("\u2019", "'")
    kept = "".join(ch if (ch.isalnum() or ch == "'" or ch.isspace()
                          or unicodedata.category(ch).startswith("M")) else " " for ch in text)
    kept = re.sub(r"(?<!\w)'|'(?!\w)", " ", kept)  # quotes, not contractions
    return " ".join(kept.split())


def edit_distance(ref: list[str] | str, hyp: list[str] | str) -> int:
    """Levenshtein distance (substitutions, insertions, deletions) between two sequences."""
    prev = np.arange(len(hyp) + 1)
    hyp_arr = np.array(list(hyp), dtype=object)
    for k, r in enumerate(ref, 1):
        sub = prev[:-1] + (hyp_arr != r)  # [len(hyp)]
        cur = np.empty_like(prev)
        cur[0] = k
        best = np.minimum(sub, prev[1:] + 1)  # substitute or delete
        for j in range(1, len(cur)):  # insertions chain along the row
            cur[j] = min(best[j - 1], cur[j - 1] + 1)
        prev = cur
    return int(prev[-1])


@dataclass
class ErrorCounts:
    """Character and word edits against reference lengths; add them over utterances."""

    char_edits: int = 0
    chars: int = 0
    word_edits: int = 0
    words: int = 0

    @classmethod
    def of(cls, reference: str, hypothesis: str) -> ErrorCounts:
        ref, hyp = normalize(reference), normalize(hypothesis)
        return cls(edit_distance(ref, hyp), len(ref), edit_distance(ref.split(), hyp.split()),
                   len(ref.split()))

    def __add__(self, other: ErrorCounts) -> ErrorCounts:
        return ErrorCounts(self.char_edits + other.char_edits, self.chars + other.chars,
                           self.word_edits + other.word_edits, self.words + other.words)

    @property
    def cer(self) -> float:
        return self.char_edits / self.chars if self.chars else float("nan")

    @property
    def wer(self) -> float:
        return self.word_edits / self.words if self.words else float("nan")


class Recognizer(Protocol):
    name: str

    def speaks(self, language: str) -> bool: ...
    def transcribe(self, wav: np.ndarray, sample_rate: int, language: str) -> str: ...


def to_16k(wav: np.ndarray, sample_rate: int) -> np.ndarray:
    wav = np.asarray(wav, dtype=np.float32)
    if sample_rate != ASR_RATE:
        wav = soxr.resample(wav, sample_rate, ASR_RATE).astype(np.float32)
    return np.clip(wav, -1.0, 1.0)


class PocketSphinx:
    """English, from the models in the pocketsphinx wheel (US English acoustic model, CMU
    dictionary, a general 3-gram language model)."""

    name = "pocketsphinx"

    def __init__(self) -> None:
        require("pocketsphinx", what="the ASR metrics (CER, WER)")
        from pocketsphinx import Decoder  # optional: the eval extra

        self.decoder = Decoder(loglevel="FATAL")  # the wheel's en-us model; no log lines

    def speaks(self, language: str) -> bool:
        return language == "en"

    def transcribe(self, wav: np.ndarray, sample_rate: int, language: str) -> str:
        pcm = (to_16k(wav, sample_rate) * 32767).astype(np.int16).tobytes()
        self.decoder.start_utt()
        self.decoder.process_raw(pcm, full_utt=True)
        self.decoder.end_utt()
        hyp = self.decoder.hyp()
        return hyp.hypstr if hyp is not None else ""


class Whisper:
    """openai-whisper, else faster-whisper, of ``size``, from weights already on disk."""

    def __init__(self, size: str = "small") -> None:
        self.name, self.size = f"whisper:{size}", size
        if not missing("whisper"):
            import whisper  # optional: openai-whisper

            root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "whisper"
            weights = root / f"{size}.pt"
            if not weights.is_file():
                raise EvaluationError(f"--asr {self.name}: no weights at {weights} (evaluate "
                                      f"never downloads); copy {size}.pt there from a machine "
                                      f"that ran whisper.load_model({size!r})")
            self.model, self.kind = whisper.load_model(str(weights), device="cpu"), "openai"
        elif not missing("faster_whisper"):
            from faster_whisper import WhisperModel  # optional: faster-whisper

            try:
                self.model = WhisperModel(size, device="cpu", compute_type="int8",
                                          local_files_only=True)
            except Exception as e:  # its error for weights not in the local cache
                raise EvaluationError(f"--asr {self.name}: faster-whisper has no local weights "
                                      f"for {size!r} (evaluate never downloads): "
                                      f"{type(e).__name__}: {e}") from None
            self.kind = "faster"
        else:
            raise EvaluationError(f"--asr {self.name} needs openai-whisper or faster-whisper "
                                  f"installed (pip install openai-whisper) with its weights "
                                  f"on disk")

    def speaks(self, language: str) -> bool:
        return True  # multilingual: told the language of each utterance

    def transcribe(self, wav: np.ndarray, sample_rate: int, language: str) -> str:
        audio = to_16k(wav, sample_rate)
        if self.kind == "openai":
            return str(self.model.transcribe(audio, language=language, fp16=False)["text"])
        segments, _ = self.model.transcribe(audio, language=language)
        return " ".join(s.text for s in segments)


def recognizer(spec: str) -> Recognizer | None:
    """``pocketsphinx``, ``whisper`` or ``whisper:SIZE``; ``none`` (no ASR metrics) -> None."""
    name, _, size = spec.partition(":")
    if name == "none":
        return None
    if name == "pocketsphinx" and not size:
        return PocketSphinx()
    if name == "whisper":
        return Whisper(size or "small")
    raise EvaluationError(f"--asr {spec!r} is not a recognizer; give pocketsphinx, "
                          f"whisper[:SIZE] or none")
