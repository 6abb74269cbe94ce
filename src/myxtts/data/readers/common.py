"""Pieces every layout reader uses: file listings, line decoding, transcript files, ids."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from myxtts.data.records import NOT_UTF8, DataReport, Utterance

AUDIO_EXTS = (".wav", ".flac", ".ogg")
MANIFEST_EXTS = (".csv", ".tsv", ".jsonl")
LAYOUTS_HINT = (
    "expected an LJSpeech folder (metadata.csv with id|text rows + wavs/ID.wav), speaker folders "
    "(SPEAKER/*.wav with ID.txt transcripts or a metadata.csv per speaker, or VCTK's txt/ + wav48*/), "
    "or a .csv/.tsv/.jsonl manifest with audio and text columns"
)

# (utterance, source file, 1-based line or None) — the location is kept until the
# cross-file checks (duplicate ids) have run, so those problems can name both places.
Row = tuple[Utterance, str, "int | None"]


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
    """Cached directory listings: one ``scandir`` per folder instead of a stat per row."""

    def __init__(self) -> None:
        self._dirs: dict[Path, set[str]] = {}

    def names(self, folder: Path) -> set[str]:
        if folder not in self._dirs:
            try:
                self._dirs[folder] = {e.name for e in os.scandir(folder) if e.is_file()}
            except OSError:
                self._dirs[folder] = set()
        return self._dirs[folder]

    def exists(self, path: Path) -> bool:
        return path.name in self.names(path.parent)

    def find_audio(self, folder: Path, stem: str) -> Path | None:
        names = self.names(folder)
        for ext in AUDIO_EXTS:
            if stem + ext in names:
                return folder / (stem + ext)
        return None


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
