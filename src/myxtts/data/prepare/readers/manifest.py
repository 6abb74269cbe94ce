"""Manifest layout: a ``.csv`` / ``.tsv`` / ``.jsonl`` file with columns ``audio``, ``text``
and optionally ``speaker``, ``language``, ``id``, ``duration``; audio paths are relative
to the manifest's folder and stay inside it (``common.clip_in``; an absolute path under it
is fine)."""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path

from myxtts.config import Config
from myxtts.data.prepare.readers.common import (
    MANIFEST_EXTS,
    UNNAMED,
    FileIndex,
    Row,
    clip_in,
    decoded_lines,
    first_line,
    report_outside,
    unknown_language,
)
from myxtts.data.prepare.records import (
    EMPTY_TEXT,
    MALFORMED_ROW,
    MISSING_AUDIO,
    DataReport,
    DatasetError,
    Utterance,
)


def is_manifest_header(path: Path) -> bool:
    """First line names (at least) the ``audio`` and ``text`` columns."""
    cols = {c.strip().strip('"').lower() for c in re.split(r"[,\t]", first_line(path))}
    return {"audio", "text"} <= cols


def manifests_in(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir()
                  if p.is_file() and p.suffix.lower() in MANIFEST_EXTS and not p.name.startswith("."))


# The fields a reader uses; a JSONL value of another type is reported, never stored as its
# Python repr ("['a', 'b']", "True"). Extra fields are ignored whatever their type.
_STRING_FIELDS = ("audio", "text", "speaker", "language")
_NUMERIC_FIELDS = ("id", "duration")
_JSON_TYPES = {list: "array", dict: "object", bool: "boolean", int: "number", float: "number"}


def _wrong_json_field(rec: dict) -> tuple[str, object] | None:
    """The first used field of a JSONL record whose value has the wrong type, if any."""
    for name in (*_STRING_FIELDS, *_NUMERIC_FIELDS):
        value = rec.get(name)
        if value is None or isinstance(value, str):
            continue
        if name in _NUMERIC_FIELDS and isinstance(value, int | float) and not isinstance(value, bool):
            continue
        return name, value
    return None


def manifest_records(path: Path, report: DataReport) -> Iterator[tuple[int, dict[str, str]]]:
    """``(line_no, {column: value})`` per row of a .csv/.tsv/.jsonl manifest."""
    lines = decoded_lines(path, report)
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
            rec = {str(k).strip().lower(): v for k, v in rec.items()}
            wrong = _wrong_json_field(rec)
            if wrong is not None:
                name, value = wrong
                kind = _JSON_TYPES.get(type(value), type(value).__name__)
                want = "a number or a string" if name in _NUMERIC_FIELDS else "a string"
                report.add(path, line_no, None, MALFORMED_ROW,
                           f"write {name!r} on line {line_no} as {want}",
                           f"field {name!r} is a JSON {kind} ({json.dumps(value)[:60]}), "
                           f"expected {want}")
                continue
            yield line_no, {k: ("" if v is None else str(v)) for k, v in rec.items()}
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


def read_manifest(path: Path, cfg: Config, report: DataReport, default_speaker: str) -> list[Row]:
    base = path.parent
    files = FileIndex()
    rows: list[Row] = []
    for line_no, rec in manifest_records(path, report):
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
        language = rec.get("language", "").strip() or UNNAMED
        if language and language not in cfg.text.languages:
            unknown_language(report, path, line_no, uid, language, cfg.text.languages,
                             f"on line {line_no}")
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
        audio = clip_in(base, audio_s)
        if audio is None:
            report_outside(report, path, line_no, uid, audio_s, base, "audio path")
            continue
        if not files.exists(audio):
            report.add(path, line_no, uid, MISSING_AUDIO,
                       f"fix the audio path on line {line_no} (relative paths start at {base}) or delete it",
                       files.why_not(audio))
            continue
        speaker = rec.get("speaker", "").strip() or default_speaker
        rows.append((Utterance(uid, audio, text, speaker, language, duration_s), str(path), line_no))
    return rows
