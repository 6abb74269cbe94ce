"""LJSpeech layout: ``metadata.csv`` with ``id|text[|normalized[|speaker[|language]]]`` rows
and the clips at ``wavs/ID.wav``. The normalized column wins when present and non-empty;
the speaker defaults to the dataset folder's name; a row with no language takes the one
its script fits (``common.row_language``). A file's column count is the one most of its
rows have. A row with more columns (a ``|`` inside its text) is reported with its line, not
read with words moved into the normalized, speaker or language column; so is a row without
the speaker column the file's rows have (it would be given the folder's name). A missing
normalized or language column reads as an empty one: the raw text, the script's language.

The language column makes a multilingual corpus (e.g. ``myxtts make-demo-data
--languages en,fa``) readable without converting it to a manifest. A language that is
not in ``text.languages`` is reported for its row, as the manifest reader does, rather
than read: the model has no token for it.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from myxtts.config import Config
from myxtts.data.prepare import records
from myxtts.data.prepare.readers import common
from myxtts.data.prepare.readers.manifest import is_manifest_header

LAYOUT = "id|text[|normalized[|speaker[|language]]]"
COLUMNS = ("id", "text", "normalized", "speaker", "language")


def is_ljspeech_csv(path: Path) -> bool:
    """A ``.csv`` of ``id|text`` rows rather than a manifest with a header."""
    return not is_manifest_header(path) and ("|" in common.first_line(path) or path.name == "metadata.csv")


def _usual_columns(lines: list[tuple[int, str]]) -> int:
    """The file's column count: the one most of its rows have (the first seen on a tie)."""
    counts = Counter(line.count("|") + 1 for _, line in lines)
    return counts.most_common(1)[0][0] if counts else 0


def _malformed(report: records.DataReport, meta: Path, line_no: int, uid: str, n: int,
               usual: int) -> None:
    """Report a row whose columns cannot be trusted (see the module doc)."""
    fix = f"fix line {line_no} of {meta.name}"
    if not 2 <= n <= 5:
        detail = f"{n} '|'-separated column(s), expected 2 to 5 ({LAYOUT})"
        fix += " (a '|' inside the text must be removed)"
    elif not uid:
        detail = "the id (first column) is empty"
    elif n > usual:
        detail = (f"{n} '|'-separated columns where the file's rows have {usual}: a '|' in "
                  f"the text would move words into the {'/'.join(COLUMNS[usual:n])} column")
        fix += " (a '|' inside the text must be removed)"
    else:
        detail = (f"{n} '|'-separated columns where the file's rows have {usual}: without its "
                  f"speaker column it would be spoken by the folder's name")
        fix += f" (give it the file's {usual} columns; a column may be empty, as in 'id|text||')"
    report.add(meta, line_no, uid or None, records.MALFORMED_ROW, fix, detail)


def read_ljspeech(meta: Path, root: Path, cfg: Config, report: records.DataReport,
                   default_speaker: str) -> list[common.Row]:
    wav_dir = root / "wavs"
    files = common.FileIndex()
    rows: list[common.Row] = []
    lines = list(common.decoded_lines(meta, report))
    usual = _usual_columns(lines)
    for line_no, line in lines:
        cols = line.split("|")
        uid = cols[0].strip()
        # fewer columns matter only where they drop the speaker column the file has
        short = len(cols) < 4 <= usual
        if not 2 <= len(cols) <= 5 or not uid or len(cols) > usual or short:
            _malformed(report, meta, line_no, uid, len(cols), usual)
            continue
        text = cols[1].strip()
        if len(cols) >= 3 and cols[2].strip():
            text = cols[2].strip()
        speaker = cols[3].strip() if len(cols) >= 4 and cols[3].strip() else default_speaker
        lang = cols[4].strip() if len(cols) == 5 else common.UNNAMED
        if not text:
            report.add(meta, line_no, uid, records.EMPTY_TEXT,
                       f"write the transcript on line {line_no} or delete the line")
            continue
        if lang and lang not in cfg.text.languages:
            common.unknown_language(report, meta, line_no, uid, lang, cfg.text.languages,
                             f"on line {line_no} of {meta.name}")
            continue
        if common.clip_in(wav_dir, uid) is None:
            common.report_outside(report, meta, line_no, uid, uid, wav_dir, "id")
            continue
        audio = files.find_audio(wav_dir, uid)
        if audio is None:
            report.add(meta, line_no, uid, records.MISSING_AUDIO,
                       f"put the clip at {wav_dir / uid}.wav or delete line {line_no} of {meta.name}",
                       files.why_missing(wav_dir, uid))
            continue
        rows.append((records.Utterance(uid, audio, text, speaker, lang), str(meta), line_no))
    return rows
