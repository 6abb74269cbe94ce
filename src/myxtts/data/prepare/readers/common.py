"""Pieces every layout reader uses: file listings, line decoding, transcript files, ids,
and where a row's clip may be (``clip_in``).

Data stays inside the dataset: a row names its clip by a path inside the reader's clip
folder (Common Voice ``clips/``, LJSpeech ``wavs/``, a speaker's folder, a manifest's
folder). A path that leads elsewhere -- climbing with ``..``, or absolute and not under the
folder -- is reported for its row and never opened: a downloaded corpus must not make
prepare read (and pack into a store) ``/etc/passwd`` or a file beside the dataset. The rule
is on the path the row writes, not on where links lead: a clip that is a symbolic link (or
lies in a linked folder) is read when its target is a regular file, so a dataset of links
into a shared clip folder works. Layouts found by listing folders (LibriTTS, speaker
folders, VCTK) name only entries of the folders they list, so they are inside by
construction; every clip, linked or not, must be a regular file (a FIFO or a device is
never opened).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from myxtts.data.prepare.records import (
    BAD_ID,
    NOT_UTF8,
    NOTHING_TO_SAY,
    OUTSIDE_DATASET,
    OUTSIDE_LANGUAGE,
    UNKNOWN_LANGUAGE,
    DataReport,
    Utterance,
)
from myxtts.outputs import MAX_NAME_CHARS, name_problem, safe_name
from myxtts.system import path_kind
from myxtts.text import clean_text
from myxtts.text.scripts import (
    describe,
    drop_outside,
    languages_by_script,
    outside_language,
    speakable,
)

AUDIO_EXTS = (".wav", ".flac", ".ogg")
MANIFEST_EXTS = (".csv", ".tsv", ".jsonl")
LAYOUTS_HINT = (
    "expected an LJSpeech folder (metadata.csv with id|text rows + wavs/ID.wav), a Common Voice "
    "release (clips/ + train.tsv or validated.tsv), LibriTTS (train-*/dev-* subsets), speaker folders "
    "(SPEAKER/*.wav with ID.txt transcripts or a metadata.csv per speaker, or VCTK's txt/ + wav48*/), "
    "or a .csv/.tsv/.jsonl manifest with audio and text columns"
)

log = logging.getLogger(__name__)

# The language of a row whose dataset names none: ``check_transcripts`` gives it one (by
# its script when text.languages holds several, else text.default_language).
UNNAMED = ""

# (utterance, source file, 1-based line or None) — the location is kept until the
# cross-file checks (duplicate ids) have run, so those problems can name both places.
Row = tuple[Utterance, str, "int | None"]


def clip_in(folder: Path, text: str) -> Path | None:
    """The clip a row names by ``text``: a path relative to ``folder``, or an absolute one
    under it, given as ``folder / relative``; None when the text leads outside ``folder``
    (a ``..`` anywhere, even one that would come back: through a linked folder ``..`` goes
    to the link target's parent, so only a path without it stays inside by its text)."""
    path = Path(text)
    if path.is_absolute():
        for base in dict.fromkeys((Path(os.path.abspath(folder)), folder.resolve())):
            if path.is_relative_to(base):
                path = path.relative_to(base)
                break
        else:
            return None
    if ".." in path.parts:
        return None
    return folder / path


def report_outside(report: DataReport, source: Path, line: int | None, uid: str | None,
                   text: str, folder: Path, what: str = "path") -> None:
    """Report a row whose clip ``text`` (its ``what``) leads outside ``folder``."""
    shown = text if len(text) <= 80 else text[:77] + "..."
    where = f"line {line} of {source.name}" if line is not None else source.name
    report.add(source, line, uid, OUTSIDE_DATASET,
               f"change the {what} on {where} to one inside {folder} (relative to it, without "
               f"'..') or delete the row; to use clips kept elsewhere, link their folder into "
               f"{folder}", f"{what} {shown!r} leads outside {folder}, where the row's clip "
               f"must be; not opened")


def first_line(path: Path) -> str:
    with open(path, "rb") as fh:
        return fh.readline().decode("utf-8", errors="replace").lstrip("\ufeff")


def audio_files(folder: Path) -> list[Path]:
    """Every audio file below ``folder``, sorted (so VCTK's *_mic1 comes before *_mic2)."""
    return sorted(p for p in folder.rglob("*")
                  if p.suffix.lower() in AUDIO_EXTS and not p.name.startswith(".") and p.is_file())


def has_audio(folder: Path, depth: int = 2) -> bool:
    """Any audio file at most ``depth`` folder levels below ``folder`` (cheap scan)."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return False
    for e in entries:
        if e.is_file() and e.name.lower().endswith(AUDIO_EXTS):
            return True
    if depth > 1:
        return any(has_audio(Path(e.path), depth - 1) for e in entries
                   if e.is_dir() and not e.name.startswith("."))
    return False


class FileIndex:
    """Cached directory listings: one ``scandir`` per folder instead of a stat per row.
    An entry that cannot be checked (a symbolic link loop) is left out on its own; the
    rest of its folder is still listed."""

    def __init__(self) -> None:
        self._dirs: dict[Path, tuple[set[str], set[str]]] = {}  # folder -> (files, all names)

    def _listing(self, folder: Path) -> tuple[set[str], set[str]]:
        if folder not in self._dirs:
            files: set[str] = set()
            every: set[str] = set()
            try:
                with os.scandir(folder) as entries:
                    for e in entries:
                        every.add(e.name)
                        try:
                            if e.is_file():
                                files.add(e.name)
                        except OSError:
                            pass
            except OSError:
                pass
            self._dirs[folder] = (files, every)
        return self._dirs[folder]

    def names(self, folder: Path) -> set[str]:
        return self._listing(folder)[0]

    def exists(self, path: Path) -> bool:
        return path.name in self.names(path.parent)

    def why_not(self, path: Path) -> str:
        """Why ``exists(path)`` is False, in words: what is there instead (a folder, a
        FIFO, a link to something that is no regular file) or that nothing is."""
        if path.name in self._listing(path.parent)[1]:
            return f"{path} is {path_kind(path)}, not an audio file"
        return f"{path} does not exist"

    def find_audio(self, folder: Path, stem: str) -> Path | None:
        names = self.names(folder)
        for ext in AUDIO_EXTS:
            if stem + ext in names:
                return folder / (stem + ext)
        return None

    def why_missing(self, folder: Path, stem: str) -> str:
        """Why ``find_audio(folder, stem)`` found no clip, in words: what is there instead
        (a folder, a FIFO, a link loop, a file in a format myxtts does not read) or that
        nothing is."""
        every = self._listing(folder)[1]
        for ext in AUDIO_EXTS:
            if stem + ext in every:
                return f"{folder / (stem + ext)} is {path_kind(folder / (stem + ext))}, not an audio file"
        others = sorted(n for n in every if n.startswith(stem + ".") and n != stem + ".txt")
        if others:
            fmt = Path(others[0]).suffix.lstrip(".").upper() or "no extension"
            return (f"{folder / others[0]} is in a format myxtts does not read ({fmt}); convert it "
                    f"to {'/'.join(e.lstrip('.').upper() for e in AUDIO_EXTS)}")
        return f"{folder / stem}.wav does not exist"


def decoded_lines(path: Path, report: DataReport) -> Iterator[tuple[int, str]]:
    """Non-blank lines of a text file as ``(line_no, text)``, decoded one by one.

    Decoding per line means one stray Latin-1 byte costs that row (reported with its
    line number), not the whole file.
    """
    data = path.read_bytes()
    for i, raw in enumerate(data.split(b"\n"), start=1):
        raw = raw.rstrip(b"\r")
        if i == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        if not raw.strip():
            continue
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            guess = raw.decode("utf-8", errors="replace").split("|")[0].split(",")[0].strip()
            report.add(path, i, guess or None, NOT_UTF8,
                       f"re-save {path.name} as UTF-8 (e.g. iconv -f latin1 -t utf-8) or fix line {i}",
                       f"byte 0x{raw[e.start]:02x} at column {e.start + 1} is not valid UTF-8")
            continue
        yield i, line


def read_transcript(path: Path, report: DataReport, uid: str) -> str | None:
    """Text of a one-clip transcript file (lines joined by spaces); None if undecodable."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8").lstrip("\ufeff")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        report.add(path, line, uid, NOT_UTF8, f"re-save {path.name} as UTF-8",
                   f"byte 0x{data[e.start]:02x} is not valid UTF-8")
        return None
    return " ".join(text.split())


def prefixed_id(speaker: str, stem: str) -> str:
    return stem if stem.startswith(speaker) else f"{speaker}_{stem}"


def unknown_language(report: DataReport, source: Path, line: int | None, uid: str, language: str,
                     languages: list[str], where: str) -> None:
    """Report a row naming a language that ``text.languages`` lacks (``where``: what to fix)."""
    report.unknown_languages.add(language)
    report.add(source, line, uid, UNKNOWN_LANGUAGE,
               f"fix the language {where}, or train it too with --set "
               f"text.languages=[{','.join([*languages, language])}]",
               f"{language!r} is not in text.languages {languages}")


def row_language(text: str, text_cfg: Any) -> str:
    """The language of a row whose dataset names none: with several ``text.languages``,
    the one whose script holds every letter of ``text`` (the default when it fits, else
    the only one that fits); ``text.default_language`` otherwise, and when the script fits
    none or several (the row's checks then report it)."""
    default = text_cfg.default_language
    if len(text_cfg.languages) < 2:
        return default
    fits = languages_by_script(text, text_cfg.languages)
    return fits[0] if len(fits) == 1 and default not in fits else default


def check_ids(rows: list[Row], report: DataReport) -> list[Row]:
    """Rows whose id is a name (``outputs.name_problem``); the others are reported with
    file and line and left out: output files (evaluation audio, vocoder samples) are named
    after ids, and an id that is a path would write outside its folder."""
    kept = []
    for utt, source, line in rows:
        problem = name_problem(utt.id)
        if problem is None:
            kept.append((utt, source, line))
        else:
            report.add(source, line, safe_name(utt.id), BAD_ID, "give the row an id "
                       "without '/', '\\', '..' or control characters, of at most "
                       f"{MAX_NAME_CHARS} characters", problem[:300])
    return kept


def check_transcripts(rows: list[Row], text_cfg: Any, report: DataReport) -> list[Row]:
    """Rows whose transcripts are fit to train on (``text.scripts``), each with its language
    (``row_language`` for a row whose dataset names none): a row with nothing to
    say after cleaning (punctuation only) is reported and left out; characters outside the
    row's language are reported by file and line with the characters found, then the row is
    left out, loses those characters, or keeps them, as ``text.unknown_chars`` says. The
    cleaned text is checked (what the tokenizer will see); the row keeps its raw text."""
    policy, kept = text_cfg.unknown_chars, []
    for utt, source, line in rows:
        if utt.language == UNNAMED:
            utt = dataclasses.replace(utt, language=row_language(utt.text, text_cfg))
        if utt.language not in text_cfg.languages:
            kept.append((utt, source, line))  # plan_texts reports the unknown language
            continue
        cleaned = clean_text(utt.text, utt.language, text_cfg)
        if cleaned and not speakable(cleaned):
            report.add(source, line, utt.id, NOTHING_TO_SAY, "write the words spoken in the "
                       "clip, or delete the row", f"transcript {utt.text!r} has no letter or digit")
            continue
        bad = outside_language(cleaned, utt.language)
        if bad:
            chars = describe(bad)
            if policy == "reject":
                report.add(source, line, utt.id, OUTSIDE_LANGUAGE,
                           "correct the row's text or its language, or set text.unknown_chars="
                           "drop|keep", f"{utt.language!r} text holds {chars}")
                continue
            if policy == "drop":
                cleaned = drop_outside(cleaned, bad)
                if not speakable(cleaned):
                    report.add(source, line, utt.id, NOTHING_TO_SAY, "write the words spoken in "
                               "the clip in its language, or delete the row",
                               f"nothing is left once {chars} are dropped")
                    continue
                utt = dataclasses.replace(utt, text=cleaned)
            log.warning("%s%s: %s text holds %s (%s by text.unknown_chars=%s)", source,
                        f":{line}" if line is not None else "", repr(utt.language), chars,
                        "dropped" if policy == "drop" else "kept", policy)
        kept.append((utt, source, line))
    return kept
