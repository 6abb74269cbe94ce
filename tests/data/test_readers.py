"""Dataset readers: every layout, the splits, and every kind of broken input."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from myxtts.config import load_config
from myxtts.data.prepare.readers import read_dataset, split_train_val
from myxtts.data.prepare.records import (
    DUPLICATE_ID,
    EMPTY_TEXT,
    MALFORMED_ROW,
    MISSING_AUDIO,
    MISSING_TRANSCRIPT,
    NOT_UTF8,
    OUTSIDE_LANGUAGE,
    UNKNOWN_LANGUAGE,
    DataReport,
    DatasetError,
    Utterance,
)

SR = 16000


def _wav(path: Path, seconds: float = 0.2, freq: float = 220.0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.arange(int(seconds * SR)) / SR
    sf.write(path, (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32), SR, subtype="PCM_16")
    return path


def _cfg(*overrides: str):
    return load_config(overrides=list(overrides))


def _ljspeech(root: Path, lines: list[str], wavs: list[str] | None = None,
              encoding_bytes: bytes | None = None) -> Path:
    """LJSpeech folder: metadata.csv from ``lines``; a clip for each id in ``wavs``
    (default: the first column of every line)."""
    root.mkdir(parents=True, exist_ok=True)
    data = encoding_bytes if encoding_bytes is not None else ("\n".join(lines) + "\n").encode()
    (root / "metadata.csv").write_bytes(data)
    ids = wavs if wavs is not None else [ln.split("|")[0] for ln in lines]
    for uid in ids:
        _wav(root / "wavs" / f"{uid}.wav")
    return root


def _problem(report: DataReport, reason: str):
    found = report.by_reason(reason)
    assert len(found) == 1, report.format()
    return found[0]


# ---------------------------------------------------------------- LJSpeech

def test_ljspeech_columns_normalized_speaker_and_defaults(tmp_path):
    root = _ljspeech(tmp_path / "myvoice", [
        "a1|Raw text one|normalized one",
        "a2|Raw text two|",  # empty normalized column -> raw text
        "a3|Only raw",
    ])
    splits = read_dataset(root, _cfg("data.val_fraction=0"))
    assert splits.format == "ljspeech" and len(splits.report) == 0 and splits.val == []
    by_id = {u.id: u for u in splits.train}
    assert [u.id for u in splits.train] == ["a1", "a2", "a3"]
    assert by_id["a1"].text == "normalized one"
    assert by_id["a2"].text == "Raw text two"
    assert by_id["a3"].text == "Only raw"
    assert by_id["a1"].speaker == "myvoice"  # the folder's name
    assert by_id["a1"].audio_path == root / "wavs" / "a1.wav"
    assert all(u.language == "en" and u.duration_s is None for u in splits.train)


def test_ljspeech_language_column(tmp_path):
    root = _ljspeech(tmp_path / "bi", [
        "e1|Hello there|hello there|ann|en",
        "f1|سلام||bo|fa",  # empty normalized column, Persian text
        "d1|Default language|default language|ann|",  # empty language -> text.default_language
        "x1|Bonjour|bonjour|cy|fr",  # line 4: not in text.languages
        "s1|Four columns still work|four|ann",
    ])
    splits = read_dataset(root, _cfg("data.val_fraction=0", "text.languages=[en, fa]"))
    by_id = {u.id: u for u in splits.train}
    assert sorted(by_id) == ["d1", "e1", "f1", "s1"]
    assert {k: (u.language, u.speaker) for k, u in by_id.items()} == {
        "e1": ("en", "ann"), "f1": ("fa", "bo"), "d1": ("en", "ann"), "s1": ("en", "ann")}
    assert by_id["f1"].text == "سلام"
    lang = _problem(splits.report, UNKNOWN_LANGUAGE)
    assert (lang.line, lang.utterance_id) == (4, "x1") and "'fr'" in lang.detail
    assert "text.languages=[en,fa,fr]" in lang.fix and "line 4" in lang.fix
    assert len(splits.report) == 1
    # With the default config (text.languages=[en]) the fa row is reported the same way.
    only_en = read_dataset(root, _cfg("data.val_fraction=0"))
    assert sorted(u.id for u in only_en.train) == ["d1", "e1", "s1"]
    assert [p.utterance_id for p in only_en.report.by_reason(UNKNOWN_LANGUAGE)] == ["f1", "x1"]
    fa_default = read_dataset(root, _cfg("data.val_fraction=0", "text.languages=[en, fa]",
                                         "text.default_language=fa"))
    # d1 and s1 (no language) are written in Latin letters: with several languages they take en
    assert {u.id: u.language for u in fa_default.train} == {"d1": "en", "e1": "en", "f1": "fa",
                                                            "s1": "en"}
    # With fa alone they take the default, and their Latin text is outside the language
    fa_only = read_dataset(root, _cfg("data.val_fraction=0", "text.languages=[fa]",
                                      "text.default_language=fa"))
    assert sorted(u.id for u in fa_only.train) == ["f1"]
    outside = fa_only.report.by_reason(OUTSIDE_LANGUAGE)
    assert [(p.line, p.utterance_id) for p in outside] == [(3, "d1"), (5, "s1")]
    assert "'fa' text holds 'a' (U+0061 LATIN SMALL LETTER A)" in outside[0].detail


def test_ljspeech_metadata_file_path_and_forced_format(tmp_path):
    root = _ljspeech(tmp_path / "ds", ["x1|hello", "x2|world"])
    cfg = _cfg("data.val_fraction=0")
    assert [u.id for u in read_dataset(root / "metadata.csv", cfg).train] == ["x1", "x2"]
    forced = _cfg("data.val_fraction=0", "data.format=ljspeech")
    assert read_dataset(root, forced).format == "ljspeech"
    with pytest.raises(DatasetError, match="data.format=manifest"):
        read_dataset(root / "wavs", _cfg("data.format=manifest"))


def test_ljspeech_train_val_folders(tmp_path):
    root = tmp_path / "corpus"
    _ljspeech(root / "train", [f"t{i}|train text {i}" for i in range(5)])
    _ljspeech(root / "val", ["v0|val text", "v1|val text two"])
    splits = read_dataset(root, _cfg())
    assert splits.split == "folders"
    assert [u.id for u in splits.train] == [f"t{i}" for i in range(5)]
    assert [u.id for u in splits.val] == ["v0", "v1"]
    assert {u.speaker for u in splits.all} == {"corpus"}  # dataset name, not "train"


def test_train_folder_without_val_is_split_by_seed(tmp_path):
    root = tmp_path / "corpus"
    _ljspeech(root / "train", [f"t{i}|text {i}" for i in range(20)])
    splits = read_dataset(root, _cfg("data.val_fraction=0.1"))
    assert splits.split == "seeded" and len(splits.val) == 2 and len(splits.train) == 18


def _many(root: Path, n_per_speaker: dict[str, int]) -> list[str]:
    lines = [f"{spk}_{k:03d}|text {k}|text {k}|{spk}" for spk, n in n_per_speaker.items()
             for k in range(n)]
    _ljspeech(root, lines)
    return lines


def test_seeded_split_deterministic_disjoint_stratified(tmp_path):
    lines = _many(tmp_path / "a", {"s1": 30, "s2": 12, "s3": 1})
    cfg = _cfg("data.val_fraction=0.1", "data.min_val_utterances=2", "data.split_seed=7")
    first = read_dataset(tmp_path / "a", cfg)
    again = read_dataset(tmp_path / "a", cfg)
    train_ids, val_ids = [u.id for u in first.train], [u.id for u in first.val]
    assert (train_ids, val_ids) == ([u.id for u in again.train], [u.id for u in again.val])
    assert not set(train_ids) & set(val_ids)
    assert sorted(train_ids + val_ids) == sorted(ln.split("|")[0] for ln in lines)
    assert len(val_ids) == round(0.1 * 43)
    # Proportional: s1 has most; the singleton speaker stays in train; every val speaker trains.
    val_spk = [u.speaker for u in first.val]
    assert val_spk.count("s1") > val_spk.count("s2") >= 1 and "s3" not in val_spk
    assert {u.speaker for u in first.train} == {"s1", "s2", "s3"}
    # The split depends on the ids and the seed, not on the file's line order.
    shuffled = lines[:]
    random.Random(0).shuffle(shuffled)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "metadata.csv").write_text("\n".join(shuffled) + "\n")
    (tmp_path / "b" / "wavs").symlink_to(tmp_path / "a" / "wavs")
    assert sorted(u.id for u in read_dataset(tmp_path / "b", cfg).val) == sorted(val_ids)
    # Another seed picks other utterances.
    other = read_dataset(tmp_path / "a", _cfg("data.val_fraction=0.1", "data.split_seed=8"))
    assert sorted(u.id for u in other.val) != sorted(val_ids)


def _utts(spec: dict[str, int]) -> list[Utterance]:
    return [Utterance(f"{s}-{k}", Path(f"{s}-{k}.wav"), "t", s, "en")
            for s, n in spec.items() for k in range(n)]


def test_split_sizes_minimum_cap_and_zero():
    utts = _utts({"a": 10, "b": 10})
    assert split_train_val(utts, 0.0, 2, 0) == (utts, [])
    train, val = split_train_val(utts, 0.01, 3, 0)  # round(0.2) = 0 -> the minimum wins
    assert len(val) == 3 and len(train) == 17
    train, val = split_train_val(_utts({"a": 3}), 0.05, 2, 0)  # never more than half
    assert len(val) == 1 and len(train) == 2
    train, val = split_train_val(_utts({"a": 1, "b": 1, "c": 1}), 0.5, 2, 0)  # singletons train
    assert val == [] and len(train) == 3


# ---------------------------------------------------------------- speaker folders

def test_speaker_folders_with_clip_transcripts(tmp_path):
    root = tmp_path / "multi"
    _wav(root / "alice" / "001.wav")
    (root / "alice" / "001.txt").write_text("Hello there.\n")
    _wav(root / "alice" / "ch1" / "alice_002.flac")  # nested (LibriTTS-like), own prefix
    (root / "alice" / "ch1" / "alice_002.normalized.txt").write_text("Second  one")
    _wav(root / "bob" / "001.wav")
    (root / "bob" / "001.txt").write_text("Bob speaks")
    _wav(root / "bob" / "002.wav")  # no transcript
    (root / "notes").mkdir()
    (root / "notes" / "readme.txt").write_text("not a speaker")
    splits = read_dataset(root, _cfg("data.val_fraction=0"))
    assert splits.format == "speakers"
    got = {u.id: (u.speaker, u.text) for u in splits.train}
    assert got == {"alice_001": ("alice", "Hello there."), "alice_002": ("alice", "Second one"),
                   "bob_001": ("bob", "Bob speaks")}
    p = _problem(splits.report, MISSING_TRANSCRIPT)
    assert p.source.endswith("bob/002.wav") and p.utterance_id == "bob_002"


def test_speaker_folders_with_per_speaker_metadata(tmp_path):
    root = tmp_path / "multi"
    for spk in ("s1", "s2"):
        _wav(root / spk / "u1.wav")
        _wav(root / spk / "wavs" / "u2.wav")
        (root / spk / "metadata.csv").write_text("u1|first\nu2|second|second norm\nu3|gone\n")
    splits = read_dataset(root, _cfg("data.val_fraction=0"))
    assert {u.id: u.text for u in splits.train} == {
        "s1_u1": "first", "s1_u2": "second norm", "s2_u1": "first", "s2_u2": "second norm"}
    missing = splits.report.by_reason(MISSING_AUDIO)
    assert [(Path(p.source).parent.name, p.line) for p in missing] == [("s1", 3), ("s2", 3)]


def test_vctk_layout_prefers_mic1(tmp_path):
    root = tmp_path / "VCTK"
    (root / "txt" / "p225").mkdir(parents=True)
    (root / "txt" / "p225" / "p225_001.txt").write_text("Please call Stella.\n")
    (root / "txt" / "p225" / "p225_002.txt").write_text("Ask her.\n")
    for mic in ("mic1", "mic2"):
        _wav(root / "wav48_silence_trimmed" / "p225" / f"p225_001_{mic}.flac")
        _wav(root / "wav48_silence_trimmed" / "p225" / f"p225_002_{mic}.flac")
    _wav(root / "wav48_silence_trimmed" / "p315" / "p315_001_mic1.flac")  # no transcript
    splits = read_dataset(root, _cfg("data.val_fraction=0"))
    assert splits.format == "speakers"
    assert [(u.id, u.audio_path.name, u.text) for u in splits.train] == [
        ("p225_001", "p225_001_mic1.flac", "Please call Stella."),
        ("p225_002", "p225_002_mic1.flac", "Ask her.")]
    assert _problem(splits.report, MISSING_TRANSCRIPT).utterance_id == "p315_001"


# ---------------------------------------------------------------- manifests

def _manifest_clips(root: Path) -> None:
    _wav(root / "clips" / "c1.wav")
    _wav(root / "clips" / "c2.wav")
    _wav(root / "clips" / "c3.wav")


def test_manifest_csv_tsv_jsonl(tmp_path):
    _manifest_clips(tmp_path)
    (tmp_path / "m.csv").write_text(
        'audio,text,speaker,language,id,duration\n'
        'clips/c1.wav,"Hello, world",ann,en,first,0.2\n'
        'clips/c2.wav,Second,,,,\n')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "clips").symlink_to(tmp_path / "clips")  # clips kept elsewhere, linked in
    (tmp_path / "sub" / "m.tsv").write_text('text\taudio\n"Quoted" text\tclips/c3.wav\n')
    (tmp_path / "m.jsonl").write_text(
        json.dumps({"audio": str(tmp_path / "clips" / "c3.wav"), "text": "مسیر کامل",
                    "language": "fa", "speaker": "bo"}) + "\n")
    cfg = _cfg("data.val_fraction=0", "text.languages=[en,fa]")
    csv_s = read_dataset(tmp_path / "m.csv", cfg)
    assert csv_s.format == "manifest" and len(csv_s.report) == 0
    u1, u2 = csv_s.train
    assert (u1.id, u1.text, u1.speaker, u1.language, u1.duration_s) == ("first", "Hello, world", "ann", "en", 0.2)
    assert (u2.id, u2.speaker, u2.duration_s) == ("c2", tmp_path.name, None)
    assert u1.audio_path == tmp_path / "clips" / "c1.wav"
    (t,) = read_dataset(tmp_path / "sub", cfg).train  # a folder holding one manifest
    assert t.text == '"Quoted" text' and t.audio_path.resolve() == (tmp_path / "clips" / "c3.wav")
    (j,) = read_dataset(tmp_path / "m.jsonl", cfg).train
    assert (j.language, j.speaker, j.id) == ("fa", "bo", "c3")


def test_manifest_train_val_files(tmp_path):
    _manifest_clips(tmp_path)
    (tmp_path / "train.jsonl").write_text("".join(
        json.dumps({"audio": f"clips/c{i}.wav", "text": f"t{i}"}) + "\n" for i in (1, 2)))
    (tmp_path / "val.jsonl").write_text(json.dumps({"audio": "clips/c3.wav", "text": "v"}) + "\n")
    splits = read_dataset(tmp_path, _cfg())
    assert splits.split == "files"
    assert [u.id for u in splits.train] == ["c1", "c2"] and [u.id for u in splits.val] == ["c3"]


# ---------------------------------------------------------------- broken input

def test_nonexistent_path_and_folder_without_metadata(tmp_path):
    with pytest.raises(DatasetError, match=r"does not exist; expected an LJSpeech folder"):
        read_dataset(tmp_path / "nope", _cfg())
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("hi")
    with pytest.raises(DatasetError, match=r"empty: no recognised dataset metadata; expected") as e:
        read_dataset(tmp_path / "empty", _cfg())
    assert "\n" not in str(e.value)


def test_ljspeech_bad_rows_are_reported_with_line_numbers(tmp_path):
    lines = [
        "ok1|fine",                    # 1
        "bad|too|many|cols|en|here",   # 2 wrong column count
        "nowav|no clip for me",        # 3 missing audio
        "ok2|",                        # 4 empty text
        "ok1|duplicate of line 1",     # 5 duplicate id
        "",                            # 6 blank: ignored
        "ok3|still read after problems",  # 7
    ]
    root = _ljspeech(tmp_path / "ds", lines, wavs=["ok1", "ok2", "ok3", "bad"])
    splits = read_dataset(root, _cfg("data.val_fraction=0"))
    assert [u.id for u in splits.train] == ["ok1", "ok3"]
    meta = str(root / "metadata.csv")
    assert splits.report.counts_by_reason() == {DUPLICATE_ID: 1, EMPTY_TEXT: 1, MALFORMED_ROW: 1,
                                                MISSING_AUDIO: 1}
    for reason, line, uid in [(MALFORMED_ROW, 2, "bad"), (MISSING_AUDIO, 3, "nowav"),
                              (EMPTY_TEXT, 4, "ok2"), (DUPLICATE_ID, 5, "ok1")]:
        p = _problem(splits.report, reason)
        assert (p.source, p.line, p.utterance_id) == (meta, line, uid)
        assert p.fix and f"{meta}:{line}" in p.format()
    malformed = _problem(splits.report, MALFORMED_ROW).detail
    assert "6 '|'-separated" in malformed and "2 to 5" in malformed and "[|language]" in malformed
    assert f"{meta}:1" in _problem(splits.report, DUPLICATE_ID).detail


def test_non_utf8_line_costs_only_that_line(tmp_path):
    data = "u1|caf\u00e9 ok\n".encode() + b"u2|caf\xe9 latin-1\n" + b"u3|after\n"
    root = _ljspeech(tmp_path / "ds", [], wavs=["u1", "u2", "u3"], encoding_bytes=data)
    splits = read_dataset(root, _cfg("data.val_fraction=0"))
    assert [u.text for u in splits.train] == ["caf\u00e9 ok", "after"]
    p = _problem(splits.report, NOT_UTF8)
    assert (p.line, p.utterance_id) == (2, "u2") and "0xe9" in p.detail and "UTF-8" in p.fix


def test_manifest_unknown_language_and_bad_rows(tmp_path):
    _manifest_clips(tmp_path)
    (tmp_path / "m.csv").write_text(
        "audio,text,language,duration\n"
        "clips/c1.wav,Hello,en,\n"
        "clips/c2.wav,Bonjour,fr,\n"        # line 3: unknown language
        "clips/c3.wav,Too,many,cols,x\n"    # line 4: column count
        "clips/c3.wav,Bad duration,en,abc\n"  # line 5
        "clips/zz.wav,Missing,en,\n")       # line 6
    splits = read_dataset(tmp_path / "m.csv", _cfg("data.val_fraction=0"))
    assert [u.id for u in splits.train] == ["c1"]
    lang = _problem(splits.report, UNKNOWN_LANGUAGE)
    assert lang.line == 3 and "'fr'" in lang.detail and "text.languages=[en,fr]" in lang.fix
    assert [p.line for p in splits.report.by_reason(MALFORMED_ROW)] == [4, 5]
    assert _problem(splits.report, MISSING_AUDIO).line == 6


def test_jsonl_bad_lines(tmp_path):
    _manifest_clips(tmp_path)
    (tmp_path / "m.jsonl").write_text(
        '{"audio": "clips/c1.wav", "text": "good"}\n'
        '{"audio": "clips/c2.wav", "text": \n'
        '["not", "an", "object"]\n'
        '{"audio": "clips/c3.wav"}\n')
    splits = read_dataset(tmp_path / "m.jsonl", _cfg("data.val_fraction=0"))
    assert [u.id for u in splits.train] == ["c1"]
    assert [p.line for p in splits.report.by_reason(MALFORMED_ROW)] == [2, 3, 4]


def test_manifest_without_required_columns_is_an_error(tmp_path):
    (tmp_path / "m.csv").write_text("path,transcript\na.wav,hi\n")
    with pytest.raises(DatasetError, match=r"m\.csv:1: the header must name the columns audio and text"):
        read_dataset(tmp_path / "m.csv", _cfg())


def test_nothing_usable_raises_with_the_report(tmp_path):
    root = _ljspeech(tmp_path / "ds", ["a|x", "b|y"], wavs=[])
    with pytest.raises(DatasetError, match=r"no usable utterances.*missing audio") as e:
        read_dataset(root, _cfg())
    assert e.value.report is not None and len(e.value.report) == 2
    empty = _ljspeech(tmp_path / "empty", [""], wavs=[])
    with pytest.raises(DatasetError, match="no utterances found"):
        read_dataset(empty, _cfg())


def test_report_json_and_format_group_by_reason():
    r = DataReport()
    for i in range(7):
        r.add("meta.csv", i + 1, f"u{i}", MISSING_AUDIO, "add it")
    r.add("meta.csv", 9, None, EMPTY_TEXT, "write it")
    text = r.format(max_per_reason=3)
    assert "8 problem(s)" in text and "missing audio (7):" in text and "... and 4 more" in text
    assert "meta.csv:9" in text
    d = json.loads(r.to_json())
    assert d["counts"] == {MISSING_AUDIO: 7, EMPTY_TEXT: 1} and d["problems"][0]["line"] == 1
