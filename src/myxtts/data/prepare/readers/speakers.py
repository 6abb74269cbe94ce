"""Speaker-folder layouts: ``DATA/SPEAKER/...`` with the clips and either a transcript per
clip (``ID.txt`` or LibriTTS' ``ID.normalized.txt`` next to it) or one ``metadata.csv`` /
``transcripts.txt`` with ``id|text`` rows per speaker folder; or VCTK's
``txt/SPEAKER/ID.txt`` + ``wav48*/SPEAKER/ID[_micN].wav|flac`` (mic1 preferred).

Utterance ids are prefixed with the speaker (``SPEAKER_ID``) unless they already start
with it, so clips named ``001.wav`` in every folder stay distinct.
"""

from __future__ import annotations

import re
from pathlib import Path

from myxtts.config import Config
from myxtts.data.prepare.readers.common import (
    UNNAMED,
    FileIndex,
    Row,
    audio_files,
    clip_in,
    decoded_lines,
    has_audio,
    prefixed_id,
    read_transcript,
    report_outside,
)
from myxtts.data.prepare.records import (
    EMPTY_TEXT,
    MALFORMED_ROW,
    MISSING_AUDIO,
    MISSING_TRANSCRIPT,
    DataReport,
    Utterance,
)

PER_SPEAKER_METADATA = ("metadata.csv", "transcripts.txt")


def vctk_dirs(path: Path) -> tuple[Path, Path] | None:
    txt = path / "txt"
    if not txt.is_dir():
        return None
    wavs = sorted(p for p in path.iterdir() if p.is_dir() and p.name.lower().startswith("wav"))
    return (txt, wavs[0]) if wavs else None


def speaker_dirs(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir()
                  if p.is_dir() and not p.name.startswith(".") and has_audio(p))


MIC_SUFFIX = re.compile(r"_mic\d+$")


def read_speakers(root: Path, cfg: Config, report: DataReport) -> list[Row]:
    vctk = vctk_dirs(root)
    if vctk is not None:
        return read_vctk(root, *vctk, cfg, report)
    rows: list[Row] = []
    for spk_dir in speaker_dirs(root):
        meta = next((spk_dir / n for n in PER_SPEAKER_METADATA if (spk_dir / n).is_file()), None)
        if meta is not None:
            rows += read_speaker_metadata(meta, spk_dir, cfg, report)
        else:
            rows += read_clip_transcripts(spk_dir, cfg, report)
    return rows


def read_speaker_metadata(meta: Path, spk_dir: Path, cfg: Config, report: DataReport) -> list[Row]:
    """``SPEAKER/metadata.csv`` (or transcripts.txt): ``id|text[|normalized]`` rows."""
    speaker = spk_dir.name
    files = FileIndex()
    rows: list[Row] = []
    for line_no, line in decoded_lines(meta, report):
        cols = line.split("|")
        stem = cols[0].strip()
        if not 2 <= len(cols) <= 3 or not stem:
            report.add(meta, line_no, stem or None, MALFORMED_ROW,
                       f"fix line {line_no} of {meta.name}",
                       f"{len(cols)} '|'-separated column(s), expected id|text[|normalized]"
                       if stem else "the id (first column) is empty")
            continue
        uid = prefixed_id(speaker, stem)
        if clip_in(spk_dir, stem) is None:
            report_outside(report, meta, line_no, uid, stem, spk_dir, "id")
            continue
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
        rows.append((Utterance(uid, audio, text, speaker, UNNAMED), str(meta), line_no))
    return rows


def read_clip_transcripts(spk_dir: Path, cfg: Config, report: DataReport) -> list[Row]:
    """``SPEAKER/**/ID.wav`` with ``ID.txt`` (or LibriTTS ``ID.normalized.txt``) next to it."""
    speaker = spk_dir.name
    files = FileIndex()
    rows: list[Row] = []
    for audio in audio_files(spk_dir):
        uid = prefixed_id(speaker, audio.stem)
        txt = next((audio.parent / (audio.stem + s) for s in (".normalized.txt", ".txt", ".original.txt")
                    if files.exists(audio.parent / (audio.stem + s))), None)
        if txt is None:
            report.add(audio, None, uid, MISSING_TRANSCRIPT,
                       f"write the transcript to {audio.with_suffix('.txt')} or delete the clip",
                       "no transcript file next to the clip")
            continue
        rows += transcript_row(audio, txt, uid, speaker, cfg, report)
    return rows


def read_vctk(root: Path, txt_dir: Path, wav_dir: Path, cfg: Config, report: DataReport) -> list[Row]:
    """VCTK: ``txt/SPEAKER/ID.txt`` + ``wav48*/SPEAKER/ID[_micN].ext``; mic1 preferred."""
    files = FileIndex()
    rows: list[Row] = []
    for spk_dir in sorted(p for p in wav_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        speaker = spk_dir.name
        chosen: dict[str, Path] = {}
        for audio in audio_files(spk_dir):  # sorted, so *_mic1 comes before *_mic2
            chosen.setdefault(MIC_SUFFIX.sub("", audio.stem), audio)
        for base, audio in chosen.items():
            uid = prefixed_id(speaker, base)
            txt = txt_dir / speaker / f"{base}.txt"
            if not files.exists(txt):
                report.add(audio, None, uid, MISSING_TRANSCRIPT,
                           f"write the transcript to {txt} or delete the clip", f"{txt} does not exist")
                continue
            rows += transcript_row(audio, txt, uid, speaker, cfg, report)
    return rows


def transcript_row(audio: Path, txt: Path, uid: str, speaker: str, cfg: Config,
                   report: DataReport) -> list[Row]:
    """The clip ``audio`` with the transcript file ``txt``: one row, or none (reported) when
    the transcript cannot be decoded or is empty."""
    text = read_transcript(txt, report, uid)
    if text is None:
        return []
    if not text:
        report.add(txt, 1, uid, EMPTY_TEXT, f"write the transcript into {txt.name} or delete the clip")
        return []
    return [(Utterance(uid, audio, text, speaker, UNNAMED), str(txt), None)]
