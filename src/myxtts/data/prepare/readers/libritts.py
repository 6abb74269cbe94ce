"""LibriTTS / LibriTTS-R layout, as downloaded: subset folders ``train-*``, ``dev-*``,
``test-*`` (e.g. ``train-clean-100``), each ``SPEAKER/CHAPTER/ID.wav`` with
``ID.normalized.txt`` (and ``ID.original.txt``) beside every clip; or one subset folder
given directly.

The speaker is the ``SPEAKER`` folder's name; ids are the clip names (LibriTTS' own
``SPEAKER_CHAPTER_PARAGRAPH_SENTENCE``, unique across the corpus). The text is the
normalized transcript; a clip with only ``ID.original.txt`` is read from that (the
cleaners expand its numbers and abbreviations as they do for any raw text, and losing
the clip would cost more than the small difference in normalisation).

Splits: every ``train-*`` subset is train, every ``dev-*`` subset val; ``test-*`` subsets
stay out of training (the corpus' benchmark). With no ``dev-*`` subset, or a single
subset folder, val is a seeded split of the rest.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from myxtts.config import Config
from myxtts.data.prepare.readers.common import AUDIO_EXTS, Row, has_audio
from myxtts.data.prepare.readers.speakers import transcript_row
from myxtts.data.prepare.records import MISSING_TRANSCRIPT, DataReport, DatasetError

SUBSET = re.compile(r"^(train|dev|test)-")
TRANSCRIPTS = (".normalized.txt", ".original.txt")  # first found wins


def _dirs(folder: Path) -> list[Path]:
    try:
        return sorted(Path(e.path) for e in os.scandir(folder)
                      if e.is_dir() and not e.name.startswith("."))
    except OSError:
        return []


def subsets(path: Path) -> list[Path]:
    """``train-*`` / ``dev-*`` / ``test-*`` folders of ``path`` that hold clips."""
    return [d for d in _dirs(path) if SUBSET.match(d.name) and has_audio(d, depth=3)]


def is_subset(path: Path) -> bool:
    """``path`` is one subset: speaker folders holding only ``CHAPTER/`` folders (no clips
    of their own), with ``ID.normalized.txt`` transcripts beside the clips. Only the first
    speaker folder holding folders is looked at."""
    for spk in _dirs(path):
        chapters = _dirs(spk)
        if not chapters:
            continue
        if has_audio(spk, depth=1):
            return False
        for ch in chapters:
            try:
                if any(e.name.endswith(".normalized.txt") for e in os.scandir(ch)):
                    return True
            except OSError:
                continue
        return False
    return False


def is_libritts(path: Path) -> bool:
    return path.is_dir() and (bool(subsets(path)) or is_subset(path))


def libritts_parts(path: Path) -> tuple[list[Path], list[Path], str]:
    """``(train subsets, val subsets, note)``; a single subset folder is train."""
    found = subsets(path)
    if not found:
        return [path], [], f"LibriTTS subset {path.name} read as train, val a seeded split of it"
    train = [d for d in found if d.name.startswith("train-")]
    val = [d for d in found if d.name.startswith("dev-")]
    test = [d for d in found if d.name.startswith("test-")]
    if not train:
        have = ", ".join(d.name for d in found)
        raise DatasetError(f"{path}: no train-* LibriTTS subset (found {have}); download one "
                           f"(e.g. train-clean-100) or pass a subset folder as the dataset path")
    note = "LibriTTS subsets read: " + ", ".join(d.name for d in train) + " (train)"
    note += (", " + ", ".join(d.name for d in val) + " (val)") if val else \
        ", val a seeded split of them"
    if test:
        note += "; left out: " + ", ".join(d.name for d in test) + " (the test set)"
    return train, val, note


def read_libritts_subset(subset: Path, cfg: Config, report: DataReport) -> list[Row]:
    """Rows of one subset folder: ``SPEAKER/CHAPTER/ID.wav`` + ``ID.normalized.txt``."""
    rows: list[Row] = []
    for spk in _dirs(subset):
        for chapter in _dirs(spk):
            try:
                names = {e.name for e in os.scandir(chapter) if e.is_file()}
            except OSError:
                continue
            for name in sorted(names):
                stem, ext = os.path.splitext(name)
                if ext.lower() not in AUDIO_EXTS or name.startswith("."):
                    continue
                audio = chapter / name
                txt = next((chapter / (stem + s) for s in TRANSCRIPTS if stem + s in names), None)
                if txt is None:
                    report.add(audio, None, stem, MISSING_TRANSCRIPT,
                               f"write the transcript to {chapter / (stem + TRANSCRIPTS[0])} or "
                               f"delete the clip", "no .normalized.txt or .original.txt beside it")
                    continue
                rows += transcript_row(audio, txt, stem, spk.name, cfg, report)
    return rows
