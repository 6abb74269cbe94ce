"""Common Voice layout: a release's language folder as downloaded, ``clips/*.mp3`` beside
``validated.tsv``, ``train.tsv``, ``dev.tsv``, ``test.tsv``, ``other.tsv``,
``invalidated.tsv`` (and, in newer releases, ``reported.tsv``, ``clip_durations.tsv``,
``*_sentences.tsv``).

Each row file is tab-separated with a header row; columns are read by their header name
(releases add and reorder columns): ``path`` is the clip under ``clips/`` (a path leading
out of it is reported, ``common.clip_in``), ``sentence``
the text, ``client_id`` the speaker and ``locale`` the language. The locale maps onto
``text.languages``: itself when listed, else its base code (``fa-IR`` -> ``fa``,
``en-US`` -> ``en``) when that is listed; any other locale is reported for its row.

Which rows: the release's own split, ``train.tsv`` -> train and ``dev.tsv`` -> val. The
test set stays out of training (it is the release's benchmark), as do ``other.tsv``
(clips not yet validated) and ``invalidated.tsv`` (clips voted wrong); ``validated.tsv``
holds train + dev + test and more, so it is read (with a seeded split) only when the
release has no ``train.tsv``. ``CommonVoiceRelease.note`` says what was read and left out.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from myxtts.config import Config
from myxtts.data.prepare import records
from myxtts.data.prepare.readers import common
from myxtts.text.cleaners import canonical_language

ROW_FILES = ("train.tsv", "dev.tsv", "validated.tsv", "test.tsv", "other.tsv", "invalidated.tsv")
WHY_LEFT_OUT = {
    "test.tsv": "the release's test set",
    "validated.tsv": "train.tsv and dev.tsv are its split of it",
    "other.tsv": "clips not yet validated",
    "invalidated.tsv": "clips voted wrong",
}
REQUIRED = ("path", "sentence")


@dataclass
class CommonVoiceRelease:
    """Which row files feed train and val (``val`` None: seeded split), and the note."""

    train: Path
    val: Path | None
    note: str


def is_common_voice(path: Path) -> bool:
    """A folder with ``clips/`` and a row file whose header names ``path`` and ``sentence``."""
    if not (path.is_dir() and (path / "clips").is_dir()):
        return False
    for name in ("train.tsv", "validated.tsv"):
        if (path / name).is_file():
            header = {c.strip().lower() for c in common.first_line(path / name).rstrip("\r\n").split("\t")}
            return set(REQUIRED) <= header
    return False


def release_parts(path: Path) -> CommonVoiceRelease:
    """The row files to read and a one-line note on those read and left out."""
    present = sorted(p.name for p in path.glob("*.tsv") if p.is_file())
    if (path / "train.tsv").is_file():
        train = path / "train.tsv"
        val = path / "dev.tsv" if (path / "dev.tsv").is_file() else None
    else:
        train, val = path / "validated.tsv", None
    read = [f"{train.name} (train)"] + ([f"{val.name} (val)"] if val is not None
                                        else ["a seeded val split of it"])
    used = {train.name} | ({val.name} if val is not None else set())
    left = [f"{n} ({WHY_LEFT_OUT.get(n, 'not a row file of the split')})"
            for n in present if n not in used]
    note = "Common Voice rows read from " + ", ".join(read)
    if left:
        note += "; left out: " + ", ".join(left)
    return CommonVoiceRelease(train, val, note)


LOCALE = re.compile(r"^[A-Za-z]{2,3}(?:[-_][A-Za-z0-9]{1,8})*$")  # fa, fa-IR, zh-CN, sv-SE


def declared_languages(path: Path) -> list[str]:
    """The languages the rows a release trains on declare (``locale``, as base codes:
    ``fa-IR`` -> ``fa``), in order of first appearance; empty without a locale column. A
    value that is no language code is left to the row's own report."""
    release = release_parts(path)
    seen: dict[str, None] = {}
    for tsv in (release.train, release.val):
        if tsv is None or not tsv.is_file():
            continue
        column = None
        for _, line in common.decoded_lines(tsv, records.DataReport()):
            cols = line.split("\t")
            if column is None:
                header = [c.strip().lower() for c in cols]
                if "locale" not in header:
                    break
                column, width = header.index("locale"), len(header)
                continue
            locale = cols[column].strip() if len(cols) == width else ""
            if LOCALE.match(locale):
                seen[canonical_language(locale)] = None
    return list(seen)


def map_locale(locale: str, languages: list[str]) -> str | None:
    """The configured language code for a Common Voice locale, or None when none fits."""
    if locale in languages:
        return locale
    base = canonical_language(locale)
    return base if base in languages else None


def read_common_voice(tsv: Path, root: Path, cfg: Config, report: records.DataReport,
                      default_speaker: str) -> list[common.Row]:
    """Rows of one Common Voice row file; clips resolved under ``root/clips``."""
    clips = root / "clips"
    files = common.FileIndex()
    rows: list[common.Row] = []
    header: list[str] | None = None
    for line_no, line in common.decoded_lines(tsv, report):
        # Common Voice writes no quoting, yet sentences can hold '"' (quotations, inch
        # marks): with csv's default quoting a stray '"' would swallow the tabs and lines
        # after it into one field. QUOTE_NONE splits on tabs only, as the release was written.
        cols = next(csv.reader([line], delimiter="\t", quoting=csv.QUOTE_NONE))
        if header is None:
            header = [c.strip().lower() for c in cols]
            missing = [c for c in REQUIRED if c not in header]
            if missing:
                raise records.DatasetError(f"{tsv}:{line_no}: a Common Voice row file needs the columns "
                                   f"path and sentence (found: {', '.join(header)}); restore the "
                                   f"release's header line")
            continue
        if len(cols) != len(header):
            report.add(tsv, line_no, None, records.MALFORMED_ROW, f"fix line {line_no} of {tsv.name} "
                       "(a tab inside the sentence must be removed)",
                       f"{len(cols)} tab-separated column(s), the header has {len(header)}")
            continue
        rec = dict(zip(header, cols))
        clip = rec["path"].strip()
        uid = Path(clip).stem
        if not clip:
            report.add(tsv, line_no, None, records.MALFORMED_ROW, f"give line {line_no} of {tsv.name} "
                       "a path or delete it", "the path column is empty")
            continue
        text = rec["sentence"].strip()
        if not text:
            report.add(tsv, line_no, uid, records.EMPTY_TEXT,
                       f"write the sentence on line {line_no} of {tsv.name} or delete the line")
            continue
        locale = rec.get("locale", "").strip()
        language = common.UNNAMED
        if locale:
            mapped = map_locale(locale, cfg.text.languages)
            if mapped is None:
                common.unknown_language(report, tsv, line_no, uid, canonical_language(locale),
                                 cfg.text.languages, f"(locale {locale!r}) on line {line_no} "
                                 f"of {tsv.name}")
                continue
            language = mapped
        audio = common.clip_in(clips, clip)
        if audio is None:
            common.report_outside(report, tsv, line_no, uid, clip, clips)
            continue
        if not files.exists(audio):
            report.add(tsv, line_no, uid, records.MISSING_AUDIO,
                       f"put the clip at {audio} or delete line {line_no} of {tsv.name}",
                       files.why_not(audio))
            continue
        speaker = rec.get("client_id", "").strip() or default_speaker
        rows.append((records.Utterance(uid, audio, text, speaker, language), str(tsv), line_no))
    return rows
