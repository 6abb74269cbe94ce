"""Dataset readers: turn a folder (or manifest file) into train/val ``Utterance`` lists.

Three layouts are understood (``data.format``; ``auto`` detects them in this order):

* ``ljspeech``: ``metadata.csv`` with ``id|text[|normalized[|speaker]]`` rows and the
  clips at ``wavs/ID.wav``. The normalized column wins when present and non-empty; the
  speaker defaults to the dataset folder's name.
* ``manifest``: a ``.csv`` / ``.tsv`` / ``.jsonl`` file with columns ``audio``, ``text``
  and optionally ``speaker``, ``language``, ``id``, ``duration``; audio paths are relative
  to the manifest's folder. The path may be the file itself or a folder holding exactly
  one such file.
* ``speakers``: one folder per speaker, ``DATA/SPEAKER/...`` with the clips
  (``.wav``/``.flac``/``.ogg``) and either a transcript per clip (``ID.txt`` or LibriTTS'
  ``ID.normalized.txt`` next to it), or one ``metadata.csv`` / ``transcripts.txt`` with
  ``id|text`` rows per speaker folder; or VCTK's ``txt/SPEAKER/ID.txt`` +
  ``wav48*/SPEAKER/ID[_micN].wav|flac`` (mic1 preferred). Utterance ids are prefixed with
  the speaker (``SPEAKER_ID``) unless they already start with it, so clips named
  ``001.wav`` in every folder stay distinct.

A ``train/`` (+ optional ``val/``) pair of sub-folders, or ``train.<ext>`` (+ ``val.<ext>``)
manifests, give the splits explicitly; otherwise ``split_train_val`` makes a seeded,
speaker-stratified split.

Why readers never open audio: reading thousands of headers is inspect's and prepare's job;
a reader only lists, parses and cross-checks names, so it takes well under a second even
for large corpora. Every broken row becomes a ``Problem`` in the report and reading goes
on; ``DatasetError`` is raised only when nothing can be read at all.
"""

from __future__ import annotations

import csv
import json
import math
import os
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from myxtts.config import Config
from myxtts.data.records import (
    DUPLICATE_ID,
    EMPTY_TEXT,
    MALFORMED_ROW,
    MISSING_AUDIO,
    MISSING_TRANSCRIPT,
    NOT_UTF8,
    UNKNOWN_LANGUAGE,
    DataReport,
    DatasetError,
    Utterance,
)

AUDIO_EXTS = (".wav", ".flac", ".ogg")
MANIFEST_EXTS = (".csv", ".tsv", ".jsonl")
PER_SPEAKER_METADATA = ("metadata.csv", "transcripts.txt")
LAYOUTS_HINT = (
    "expected an LJSpeech folder (metadata.csv with id|text rows + wavs/ID.wav), speaker folders "
    "(SPEAKER/*.wav with ID.txt transcripts or a metadata.csv per speaker, or VCTK's txt/ + wav48*/), "
    "or a .csv/.tsv/.jsonl manifest with audio and text columns"
)

# (utterance, source file, 1-based line or None) — the location is kept until the
# cross-file checks (duplicate ids) have run, so those problems can name both places.
_Row = tuple[Utterance, str, "int | None"]


@dataclass
class DatasetSplits:
    """Result of ``read_dataset``. ``split`` says where the split came from:
    ``folders`` (train/ + val/), ``files`` (train.<ext> + val.<ext>), ``seeded``."""

    train: list[Utterance]
    val: list[Utterance]
    report: DataReport
    format: str
    root: Path | None = None
    split: str = "seeded"

    @property
    def all(self) -> list[Utterance]:
        return self.train + self.val

    @property
    def speakers(self) -> list[str]:
        return sorted({u.speaker for u in self.all})


# ---------------------------------------------------------------- entry point

def read_dataset(path: str | Path, cfg: Config) -> DatasetSplits:
    """Read a dataset in any supported layout; see the module docstring."""
    path = Path(path).expanduser()
    if not path.exists():
        raise DatasetError(f"dataset path {path} does not exist; {LAYOUTS_HINT}")
    forced = cfg.data.format
    report = DataReport()
    default_speaker = _dataset_name(path)

    parts = _split_parts(path, forced)
    if parts is not None:
        split_kind, train_path, val_path = parts
        fmt, rows = _read_part(train_path, forced, cfg, report, default_speaker)
        val_rows: list[_Row] = []
        if val_path is not None:
            _, val_rows = _read_part(val_path, fmt, cfg, report, default_speaker)
        train_rows, val_rows = _dedupe(rows, val_rows, report)
        train = [r[0] for r in train_rows]
        val = [r[0] for r in val_rows]
        if not train:
            _raise_empty(train_path, report)
        if val_path is None:  # train/ alone: split it like an unsplit dataset
            train, val = split_train_val(train, cfg.data.val_fraction,
                                         cfg.data.min_val_utterances, cfg.data.split_seed)
            split_kind = "seeded"
        return DatasetSplits(train, val, report, fmt, path, split_kind)

    fmt, rows = _read_part(path, forced, cfg, report, default_speaker)
    rows, _ = _dedupe(rows, [], report)
    utts = [r[0] for r in rows]
    if not utts:
        _raise_empty(path, report)
    train, val = split_train_val(utts, cfg.data.val_fraction, cfg.data.min_val_utterances,
                                 cfg.data.split_seed)
    return DatasetSplits(train, val, report, fmt, path, "seeded")


def split_train_val(utterances: list[Utterance], val_fraction: float, min_val_utterances: int,
                    seed: int) -> tuple[list[Utterance], list[Utterance]]:
    """Deterministic, speaker-stratified train/val split.

    Size: ``max(round(val_fraction * N), min_val_utterances)`` validation utterances, but
    never more than half the dataset, and only taken from speakers with >= 2 utterances,
    each of which keeps at least one in train (every validation speaker is also a training
    speaker, so cloning from a train reference makes sense). ``val_fraction == 0`` gives
    no validation set. Speakers get shares proportional to their size (largest remainder).

    Which utterances: per speaker, its ids sorted then shuffled by ``Random(f"{seed}:{speaker}")``
    and the first ones taken. The split therefore depends only on the set of ids and the
    seed, not on file order, and adding one speaker does not reshuffle the others.
    Both lists keep the input order.
    """
    n = len(utterances)
    if val_fraction <= 0 or n < 2:
        return list(utterances), []
    by_speaker: dict[str, list[str]] = {}
    for u in utterances:
        by_speaker.setdefault(u.speaker, []).append(u.id)
    eligible = {s: ids for s, ids in by_speaker.items() if len(ids) >= 2}
    capacity = sum(len(ids) - 1 for ids in eligible.values())
    n_val = min(max(round(val_fraction * n), min_val_utterances), n // 2, capacity)
    if n_val <= 0:
        return list(utterances), []
    total = sum(len(ids) for ids in eligible.values())
    quota: dict[str, int] = {}
    remainders: list[tuple[float, str]] = []
    for s in sorted(eligible):
        exact = n_val * len(eligible[s]) / total
        quota[s] = min(int(exact), len(eligible[s]) - 1)
        remainders.append((-(exact - int(exact)), s))
    order = [s for _, s in sorted(remainders)]
    left = n_val - sum(quota.values())
    while left > 0:  # terminates: n_val <= capacity
        for s in order:
            if left and quota[s] < len(eligible[s]) - 1:
                quota[s] += 1
                left -= 1
    val_ids: set[str] = set()
    for s in sorted(eligible):
        ids = sorted(eligible[s])
        random.Random(f"{seed}:{s}").shuffle(ids)
        val_ids.update(ids[: quota[s]])
    train = [u for u in utterances if u.id not in val_ids]
    val = [u for u in utterances if u.id in val_ids]
    return train, val


# ---------------------------------------------------------------- layout detection

def _dataset_name(path: Path) -> str:
    """Default speaker name: the dataset folder's name (the manifest's folder for a file)."""
    p = path.resolve()
    if p.is_file():
        p = p.parent
    return p.name or "speaker"


def _split_parts(path: Path, forced: str) -> tuple[str, Path, Path | None] | None:
    """``(kind, train, val|None)`` when the dataset is pre-split, else None."""
    if not path.is_dir():
        return None
    if (path / "train").is_dir() and not (path / "metadata.csv").is_file():
        val = path / "val"
        return "folders", path / "train", (val if val.is_dir() else None)
    if forced in ("auto", "manifest"):
        for ext in MANIFEST_EXTS:
            train = path / f"train{ext}"
            if train.is_file():
                val = path / f"val{ext}"
                return "files", train, (val if val.is_file() else None)
    return None


def _first_line(path: Path) -> str:
    with open(path, "rb") as fh:
        return fh.readline().decode("utf-8", errors="replace").lstrip("\ufeff")


def _is_manifest_header(path: Path) -> bool:
    """First line names (at least) the ``audio`` and ``text`` columns."""
    cols = {c.strip().strip('"').lower() for c in re.split(r"[,\t]", _first_line(path))}
    return {"audio", "text"} <= cols


def _is_ljspeech_csv(path: Path) -> bool:
    """A ``.csv`` of ``id|text`` rows rather than a manifest with a header."""
    return not _is_manifest_header(path) and ("|" in _first_line(path) or path.name == "metadata.csv")


def _manifests_in(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir()
                  if p.is_file() and p.suffix.lower() in MANIFEST_EXTS and not p.name.startswith("."))


def _has_audio(folder: Path, depth: int = 2) -> bool:
    """Any audio file at most ``depth`` folder levels below ``folder`` (cheap scan)."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return False
    for e in entries:
        if e.is_file() and e.name.lower().endswith(AUDIO_EXTS):
            return True
    if depth > 1:
        return any(_has_audio(Path(e.path), depth - 1) for e in entries
                   if e.is_dir() and not e.name.startswith("."))
    return False


def _vctk_dirs(path: Path) -> tuple[Path, Path] | None:
    txt = path / "txt"
    if not txt.is_dir():
        return None
    wavs = sorted(p for p in path.iterdir() if p.is_dir() and p.name.lower().startswith("wav"))
    return (txt, wavs[0]) if wavs else None


def _speaker_dirs(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir()
                  if p.is_dir() and not p.name.startswith(".") and _has_audio(p))


def _detect(path: Path, forced: str) -> str:
    """Which reader handles ``path`` (raises DatasetError when none does)."""
    if path.is_file():
        if path.suffix.lower() not in MANIFEST_EXTS:
            raise DatasetError(f"{path} is not a dataset folder or a .csv/.tsv/.jsonl manifest; {LAYOUTS_HINT}")
        if forced == "speakers":
            raise DatasetError(f"{path} is a file but data.format=speakers expects a folder of speaker folders")
        if forced == "ljspeech" or (forced == "auto" and path.suffix.lower() == ".csv"
                                    and _is_ljspeech_csv(path)):
            return "ljspeech"
        return "manifest"
    has_meta = (path / "metadata.csv").is_file()
    if forced == "ljspeech":
        if not has_meta:
            raise DatasetError(f"{path}: no metadata.csv (data.format=ljspeech expects metadata.csv "
                               f"with id|text[|normalized[|speaker]] rows and wavs/ID.wav)")
        return "ljspeech"
    if forced == "manifest":
        if not _manifests_in(path):
            raise DatasetError(f"{path}: no .csv/.tsv/.jsonl manifest (data.format=manifest expects "
                               f"one with audio and text columns)")
        return "manifest"
    if forced == "speakers":
        if not (_vctk_dirs(path) or _speaker_dirs(path)):
            raise DatasetError(f"{path}: no speaker folders with audio (data.format=speakers expects "
                               f"SPEAKER/*.wav with transcripts, or VCTK's txt/ + wav48*/)")
        return "speakers"
    if has_meta and _is_ljspeech_csv(path / "metadata.csv"):
        return "ljspeech"
    if _manifests_in(path):
        return "manifest"
    if _vctk_dirs(path) or _speaker_dirs(path):
        return "speakers"
    raise DatasetError(f"{path}: no recognised dataset metadata; {LAYOUTS_HINT}")


def _read_part(path: Path, fmt: str, cfg: Config, report: DataReport,
               default_speaker: str) -> tuple[str, list[_Row]]:
    fmt = _detect(path, fmt)
    if fmt == "ljspeech":
        root = path.parent if path.is_file() else path
        meta = path if path.is_file() else root / "metadata.csv"
        return fmt, _read_ljspeech(meta, root, cfg, report, default_speaker)
    if fmt == "manifest":
        if path.is_dir():
            found = _manifests_in(path)
            if len(found) > 1:
                names = ", ".join(p.name for p in found)
                raise DatasetError(f"{path}: several manifests ({names}); pass the one to use as the "
                                   f"dataset path, or name them train.<ext> and val.<ext>")
            path = found[0]
        return fmt, _read_manifest(path, cfg, report, default_speaker)
    return fmt, _read_speakers(path, cfg, report)


# ---------------------------------------------------------------- shared helpers

class _FileIndex:
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


def _decoded_lines(path: Path, report: DataReport) -> Iterator[tuple[int, str]]:
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


def _read_transcript(path: Path, report: DataReport, uid: str) -> str | None:
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


def _prefixed_id(speaker: str, stem: str) -> str:
    return stem if stem.startswith(speaker) else f"{speaker}_{stem}"


def _dedupe(train: list[_Row], val: list[_Row], report: DataReport) -> tuple[list[_Row], list[_Row]]:
    """Keep the first utterance of each id (train before val); report the others."""
    seen: dict[str, str] = {}
    out: tuple[list[_Row], list[_Row]] = ([], [])
    for k, rows in enumerate((train, val)):
        for utt, source, line in rows:
            where = f"{source}:{line}" if line is not None else source
            if utt.id in seen:
                report.add(source, line, utt.id, DUPLICATE_ID,
                           "give every utterance a unique id (rename or delete one of them)",
                           f"id {utt.id!r} already used at {seen[utt.id]}; this one is skipped")
                continue
            seen[utt.id] = where
            out[k].append((utt, source, line))
    return out


def _raise_empty(path: Path, report: DataReport) -> None:
    if len(report):
        first = report.problems[0].format()
        raise DatasetError(f"{path}: no usable utterances, all {len(report)} problem(s) must be fixed "
                           f"(first: {first})", report)
    raise DatasetError(f"{path}: no utterances found; {LAYOUTS_HINT}", report)


# ---------------------------------------------------------------- LJSpeech

def _read_ljspeech(meta: Path, root: Path, cfg: Config, report: DataReport,
                   default_speaker: str) -> list[_Row]:
    wav_dir = root / "wavs"
    files = _FileIndex()
    rows: list[_Row] = []
    lang = cfg.text.default_language
    for line_no, line in _decoded_lines(meta, report):
        cols = line.split("|")
        uid = cols[0].strip()
        if not 2 <= len(cols) <= 4 or not uid:
            detail = (f"{len(cols)} '|'-separated column(s), expected 2 to 4 (id|text[|normalized[|speaker]])"
                      if uid else "the id (first column) is empty")
            report.add(meta, line_no, uid or None, MALFORMED_ROW,
                       f"fix line {line_no} of {meta.name} (a '|' inside the text must be removed)", detail)
            continue
        text = cols[1].strip()
        if len(cols) >= 3 and cols[2].strip():
            text = cols[2].strip()
        speaker = cols[3].strip() if len(cols) == 4 and cols[3].strip() else default_speaker
        if not text:
            report.add(meta, line_no, uid, EMPTY_TEXT,
                       f"write the transcript on line {line_no} or delete the line")
            continue
        audio = files.find_audio(wav_dir, uid)
        if audio is None:
            report.add(meta, line_no, uid, MISSING_AUDIO,
                       f"put the clip at {wav_dir / uid}.wav or delete line {line_no} of {meta.name}",
                       f"{wav_dir / uid}.wav does not exist")
            continue
        rows.append((Utterance(uid, audio, text, speaker, lang), str(meta), line_no))
    return rows


# ---------------------------------------------------------------- manifests

def _manifest_records(path: Path, report: DataReport) -> Iterator[tuple[int, dict[str, str]]]:
    """``(line_no, {column: value})`` per row of a .csv/.tsv/.jsonl manifest."""
    lines = _decoded_lines(path, report)
    if path.suffix.lower() == ".jsonl":
        for line_no, line in lines:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                report.add(path, line_no, None, MALFORMED_ROW, f"fix the JSON on line {line_no}",
                           f"not valid JSON ({e.msg} at column {e.colno})")
                continue
            if not isinstance(rec, dict):
                report.add(path, line_no, None, MALFORMED_ROW,
                           f'write line {line_no} as an object like {{"audio": ..., "text": ...}}',
                           f"a JSON {type(rec).__name__}, expected an object")
                continue
            yield line_no, {str(k).strip().lower(): ("" if v is None else str(v)) for k, v in rec.items()}
        return
    tsv = path.suffix.lower() == ".tsv"
    kw = dict(delimiter="\t", quoting=csv.QUOTE_NONE) if tsv else dict(delimiter=",")
    header: list[str] | None = None
    for line_no, line in lines:
        try:
            cols = next(csv.reader([line], **kw))
        except csv.Error as e:
            report.add(path, line_no, None, MALFORMED_ROW, f"fix the quoting on line {line_no}", str(e))
            continue
        if header is None:
            header = [c.strip().lower() for c in cols]
            missing = [c for c in ("audio", "text") if c not in header]
            if missing:
                sep = "tab" if tsv else "comma"
                raise DatasetError(f"{path}:{line_no}: the header must name the columns audio and text "
                                   f"({sep}-separated; found: {', '.join(header)}); add a header line "
                                   f"like 'audio{chr(9) if tsv else ','}text'")
            continue
        if len(cols) != len(header):
            report.add(path, line_no, None, MALFORMED_ROW,
                       f"fix line {line_no} (quote fields that contain {'tabs' if tsv else 'commas'})",
                       f"{len(cols)} column(s), the header has {len(header)}")
            continue
        yield line_no, dict(zip(header, cols))


def _read_manifest(path: Path, cfg: Config, report: DataReport, default_speaker: str) -> list[_Row]:
    base = path.parent
    files = _FileIndex()
    rows: list[_Row] = []
    for line_no, rec in _manifest_records(path, report):
        audio_s = rec.get("audio", "").strip()
        uid = rec.get("id", "").strip() or (Path(audio_s).stem if audio_s else "")
        if "audio" not in rec or "text" not in rec or not audio_s:
            missing = "audio" if not audio_s else "text"
            report.add(path, line_no, uid or None, MALFORMED_ROW,
                       f"give line {line_no} an {missing!r} value", f"no {missing!r} field")
            continue
        text = rec["text"].strip()
        if not text:
            report.add(path, line_no, uid, EMPTY_TEXT, f"write the transcript on line {line_no} or delete it")
            continue
        language = rec.get("language", "").strip() or cfg.text.default_language
        if language not in cfg.text.languages:
            langs = ",".join([*cfg.text.languages, language])
            report.add(path, line_no, uid, UNKNOWN_LANGUAGE,
                       f"fix the language on line {line_no}, or train it too with --set text.languages=[{langs}]",
                       f"{language!r} is not in text.languages {cfg.text.languages}")
            continue
        duration_s: float | None = None
        if rec.get("duration", "").strip():
            try:
                duration_s = float(rec["duration"])
            except ValueError:
                duration_s = math.nan
            if not (math.isfinite(duration_s) and duration_s > 0):
                report.add(path, line_no, uid, MALFORMED_ROW,
                           f"write the duration in seconds on line {line_no} or leave it empty",
                           f"duration {rec['duration']!r} is not a positive number of seconds")
                continue
        audio = Path(audio_s).expanduser()
        if not audio.is_absolute():
            audio = base / audio
        if not files.exists(audio):
            report.add(path, line_no, uid, MISSING_AUDIO,
                       f"fix the audio path on line {line_no} (relative paths start at {base}) or delete it",
                       f"{audio} does not exist")
            continue
        speaker = rec.get("speaker", "").strip() or default_speaker
        rows.append((Utterance(uid, audio, text, speaker, language, duration_s), str(path), line_no))
    return rows


# ---------------------------------------------------------------- speaker folders

_MIC_SUFFIX = re.compile(r"_mic\d+$")


def _read_speakers(root: Path, cfg: Config, report: DataReport) -> list[_Row]:
    vctk = _vctk_dirs(root)
    if vctk is not None:
        return _read_vctk(root, *vctk, cfg, report)
    rows: list[_Row] = []
    for spk_dir in _speaker_dirs(root):
        meta = next((spk_dir / n for n in PER_SPEAKER_METADATA if (spk_dir / n).is_file()), None)
        if meta is not None:
            rows += _read_speaker_metadata(meta, spk_dir, cfg, report)
        else:
            rows += _read_clip_transcripts(spk_dir, cfg, report)
    return rows


def _audio_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*")
                  if p.suffix.lower() in AUDIO_EXTS and not p.name.startswith(".") and p.is_file())


def _read_speaker_metadata(meta: Path, spk_dir: Path, cfg: Config, report: DataReport) -> list[_Row]:
    """``SPEAKER/metadata.csv`` (or transcripts.txt): ``id|text[|normalized]`` rows."""
    speaker = spk_dir.name
    files = _FileIndex()
    rows: list[_Row] = []
    for line_no, line in _decoded_lines(meta, report):
        cols = line.split("|")
        stem = cols[0].strip()
        if not 2 <= len(cols) <= 3 or not stem:
            report.add(meta, line_no, stem or None, MALFORMED_ROW,
                       f"fix line {line_no} of {meta.name}",
                       f"{len(cols)} '|'-separated column(s), expected id|text[|normalized]"
                       if stem else "the id (first column) is empty")
            continue
        uid = _prefixed_id(speaker, stem)
        text = cols[2].strip() if len(cols) == 3 and cols[2].strip() else cols[1].strip()
        if not text:
            report.add(meta, line_no, uid, EMPTY_TEXT, f"write the transcript on line {line_no} or delete it")
            continue
        audio = files.find_audio(spk_dir, stem) or files.find_audio(spk_dir / "wavs", stem)
        if audio is None:
            report.add(meta, line_no, uid, MISSING_AUDIO,
                       f"put the clip at {spk_dir / stem}.wav or delete line {line_no} of {meta.name}",
                       f"no {stem}.wav/.flac/.ogg in {spk_dir}")
            continue
        rows.append((Utterance(uid, audio, text, speaker, cfg.text.default_language), str(meta), line_no))
    return rows


def _read_clip_transcripts(spk_dir: Path, cfg: Config, report: DataReport) -> list[_Row]:
    """``SPEAKER/**/ID.wav`` with ``ID.txt`` (or LibriTTS ``ID.normalized.txt``) next to it."""
    speaker = spk_dir.name
    files = _FileIndex()
    rows: list[_Row] = []
    for audio in _audio_files(spk_dir):
        uid = _prefixed_id(speaker, audio.stem)
        txt = next((audio.parent / (audio.stem + s) for s in (".normalized.txt", ".txt", ".original.txt")
                    if files.exists(audio.parent / (audio.stem + s))), None)
        if txt is None:
            report.add(audio, None, uid, MISSING_TRANSCRIPT,
                       f"write the transcript to {audio.with_suffix('.txt')} or delete the clip",
                       "no transcript file next to the clip")
            continue
        text = _read_transcript(txt, report, uid)
        if text is None:
            continue
        if not text:
            report.add(txt, 1, uid, EMPTY_TEXT, f"write the transcript into {txt.name} or delete the clip")
            continue
        rows.append((Utterance(uid, audio, text, speaker, cfg.text.default_language), str(txt), None))
    return rows


def _read_vctk(root: Path, txt_dir: Path, wav_dir: Path, cfg: Config, report: DataReport) -> list[_Row]:
    """VCTK: ``txt/SPEAKER/ID.txt`` + ``wav48*/SPEAKER/ID[_micN].ext``; mic1 preferred."""
    files = _FileIndex()
    rows: list[_Row] = []
    for spk_dir in sorted(p for p in wav_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        speaker = spk_dir.name
        chosen: dict[str, Path] = {}
        for audio in _audio_files(spk_dir):  # sorted, so *_mic1 comes before *_mic2
            chosen.setdefault(_MIC_SUFFIX.sub("", audio.stem), audio)
        for base, audio in chosen.items():
            uid = _prefixed_id(speaker, base)
            txt = txt_dir / speaker / f"{base}.txt"
            if not files.exists(txt):
                report.add(audio, None, uid, MISSING_TRANSCRIPT,
                           f"write the transcript to {txt} or delete the clip", f"{txt} does not exist")
                continue
            text = _read_transcript(txt, report, uid)
            if text is None:
                continue
            if not text:
                report.add(txt, 1, uid, EMPTY_TEXT, f"write the transcript into {txt.name}")
                continue
            rows.append((Utterance(uid, audio, text, speaker, cfg.text.default_language), str(txt), None))
    return rows
