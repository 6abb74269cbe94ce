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
from myxtts.data.prepare.records import (
    MISPLACED_AUDIO,
    MISSING_TRANSCRIPT,
    DataReport,
    DatasetError,
)

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


def libritts_parts(path: Path, report: DataReport) -> tuple[list[Path], list[Path], str]:
    """``(train subsets, val subsets, note)``; a single subset folder (named like one, or
    holding no subsets) is train. Folders of clips beside the subsets that are none are
    reported: the layout never reads them."""
    found = subsets(path)
    if not found or (SUBSET.match(path.name) and is_subset(path)):
        return [path], [], f"LibriTTS subset {path.name} read as train, val a seeded split of it"
    for d in _dirs(path):
        if d not in found and has_audio(d, depth=3):
            report.add(d, None, None, MISPLACED_AUDIO,
                       f"name it train-{d.name} (or dev-/test-) to read it as a subset, or "
                       f"move it out of {path.name}",
                       "a folder of clips beside the LibriTTS subsets that is none of them: "
                       "its clips are not read")
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


def _clips_in(folder: Path) -> int:
    """How many audio files lie directly in ``folder``."""
    try:
        return sum(1 for e in os.scandir(folder) if e.name.lower().endswith(AUDIO_EXTS)
                   and not e.name.startswith("."))
    except OSError:
        return 0


def _stray(report: DataReport, folder: Path, subset: Path, what: str) -> None:
    """Report the clips lying directly in ``folder`` (``what`` says which level it is),
    where the layout never reads them."""
    n = _clips_in(folder)
    if n:
        report.add(folder, None, None, MISPLACED_AUDIO,
                   f"move them into {subset.name}/SPEAKER/CHAPTER/ (with their "
                   f".normalized.txt), or remove them",
                   f"{n} clip(s) directly in {what}; LibriTTS clips are read only from "
                   f"SPEAKER/CHAPTER/ folders")


def read_libritts_subset(subset: Path, cfg: Config, report: DataReport) -> list[Row]:
    """Rows of one subset folder: ``SPEAKER/CHAPTER/ID.wav`` + ``ID.normalized.txt``.
    Clips the layout does not read are reported, never skipped quietly: a subset inside
    the subset (it would be read as a speaker with no clips), clips directly in the subset
    or a speaker folder, folders inside a chapter."""
    rows: list[Row] = []
    _stray(report, subset, subset, f"the subset folder {subset.name}")
    for spk in _dirs(subset):
        if SUBSET.match(spk.name) and has_audio(spk, depth=3):
            report.add(spk, None, None, MISPLACED_AUDIO,
                       f"move {spk.name} beside {subset.name} (subsets sit side by side in "
                       f"the corpus folder), or pass it as the dataset path itself",
                       f"a LibriTTS subset inside the subset {subset.name}: none of its clips "
                       f"are read")
            continue
        _stray(report, spk, subset, f"the speaker folder {spk.name}")
        for chapter in _dirs(spk):
            try:
                names = {e.name for e in os.scandir(chapter) if e.is_file()}
            except OSError:
                continue
            for inner in _dirs(chapter):
                if has_audio(inner, depth=3):
                    report.add(inner, None, None, MISPLACED_AUDIO,
                               f"move its clips up into {chapter.name}/, or remove it",
                               f"a folder inside the chapter {spk.name}/{chapter.name}: its "
                               f"clips are not read")
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
