"""Bad audio and bad transcripts that decode without error but are wrong: each is reported
(file, line or field, reason) or handled as its module's rule says, never kept quietly.

Audio rules: ``myxtts.audio.io`` (module doc); transcript rules: ``myxtts.data.prepare.readers``.
Fixtures are generated here (soundfile); the prepare cases run in-process.
"""

from __future__ import annotations

import json
import logging
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from myxtts.audio.io import (
    CLIPPED_AUDIO,
    DC_OFFSET,
    ONE_CHANNEL,
    OUT_OF_RANGE_AUDIO,
    SCALED_AUDIO,
    TRUNCATED_AUDIO,
    AudioError,
    audio_info,
    load_audio,
)
from myxtts.cli.main import main
from myxtts.config import AudioConfig, Config, TextConfig, load_config
from myxtts.data.prepare.readers import read_dataset
from myxtts.data.prepare.records import MALFORMED_ROW
from myxtts.inference.synthesizer import Synthesizer
from myxtts.text import clean_text

SR = 22050


def _tone(seconds: float = 0.6, amp: float = 0.3, sr: int = SR) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    return (amp * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def _write(path: Path, wav: np.ndarray, subtype: str = "PCM_16", sr: int = SR) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, wav, sr, subtype=subtype)
    return path


def _truncated(path: Path) -> Path:
    _write(path, _tone(1.0))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # header still declares 1 s
    return path


def _out_of_range(path: Path) -> Path:
    return _write(path, _tone(amp=1.0) * 32767.0, subtype="FLOAT")  # int16 values as float


def _dc(path: Path) -> Path:
    return _write(path, _tone(amp=0.3) + 0.4)


def _clipped(path: Path) -> Path:
    return _write(path, np.clip(_tone(amp=3.0), -0.9, 0.9))


def _phase_inverted(path: Path) -> Path:
    tone = _tone()
    return _write(path, np.stack([tone, -tone], axis=1))


# ------------------------------------------------------------------ audio

def test_truncated_wav_is_reported_with_what_is_missing(tmp_path):
    path = _truncated(tmp_path / "cut.wav")
    for read in (lambda: audio_info(path), lambda: load_audio(path, AudioConfig())):
        with pytest.raises(AudioError) as e:
            read()
        assert e.value.reason == TRUNCATED_AUDIO
        assert str(path) in str(e.value) and "missing" in str(e.value) and "1.00 s" in str(e.value)


def test_complete_wav_and_open_ended_size_are_not_truncated(tmp_path):
    path = _write(tmp_path / "ok.wav", _tone())
    assert audio_info(path).n_samples == len(_tone())
    data = bytearray(path.read_bytes())
    at = data.index(b"data") + 4
    data[at:at + 4] = b"\xff\xff\xff\xff"  # a streaming writer's "size unknown"
    (tmp_path / "stream.wav").write_bytes(bytes(data))
    assert load_audio(tmp_path / "stream.wav", AudioConfig()).size > 0


@pytest.mark.parametrize("make, reason, needle", [
    (_out_of_range, OUT_OF_RANGE_AUDIO, "far outside [-1, 1]"),
    (_dc, DC_OFFSET, "DC offset +0.4"),
    (_clipped, CLIPPED_AUDIO, "hard clipping"),
])
def test_level_rules_reject_with_file_and_reason(tmp_path, make, reason, needle):
    path = make(tmp_path / "bad.wav")
    with pytest.raises(AudioError) as e:
        load_audio(path, AudioConfig())
    assert e.value.reason == reason
    assert str(path) in str(e.value) and needle in str(e.value)


def test_level_rules_keep_ordinary_clips(tmp_path):
    cfg = AudioConfig()
    loud = _write(tmp_path / "loud.wav", _tone(amp=1.5), subtype="FLOAT")  # a little over
    assert np.abs(load_audio(loud, cfg)).max() <= 1.0
    assert load_audio(_write(tmp_path / "full.wav", _tone(amp=0.999)), cfg).size > 0
    assert load_audio(_write(tmp_path / "dc.wav", _tone() + 0.05), cfg).size > 0


def test_phase_inverted_stereo_uses_one_channel_and_says_so(tmp_path, caplog):
    path = _phase_inverted(tmp_path / "inv.wav")
    with caplog.at_level(logging.WARNING):
        wav = load_audio(path, AudioConfig(trim_silence=False, normalize_loudness=False))
    assert np.abs(wav).max() == pytest.approx(0.3, abs=1e-3)
    assert str(path) in caplog.text and "cancel" in caplog.text


def test_prepare_reports_each_bad_clip_by_file_and_reason(tmp_path):
    root = tmp_path / "data"
    makers = {"cut": _truncated, "range": _out_of_range, "dc": _dc, "clip": _clipped}
    rows = [f"g{i}|the cat sat on the mat {i}" for i in range(4)] + [f"{k}|a bad clip" for k in makers]
    root.mkdir()
    (root / "metadata.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    for i in range(4):
        _write(root / "wavs" / f"g{i}.wav", _tone(1.0))
    for uid, make in makers.items():
        make(root / "wavs" / f"{uid}.wav")
    out = tmp_path / "store"
    assert main(["prepare", str(root), "--out", str(out), "--workers", "1", "--quiet"]) == 0
    report = json.loads((out / "report.json").read_text())
    got = {Path(r["audio_path"]).stem: r["reason"] for r in report["rejected"]}
    assert got == {"cut": TRUNCATED_AUDIO, "range": OUT_OF_RANGE_AUDIO, "dc": DC_OFFSET,
                   "clip": CLIPPED_AUDIO}


def test_prepare_lists_every_clip_it_kept_after_a_fix(tmp_path, capsys):
    root = tmp_path / "data"
    root.mkdir()
    rows = [f"g{i}|the cat sat on the mat {i}" for i in range(4)] + ["loud|a loud clip",
                                                                    "inv|an inverted clip"]
    (root / "metadata.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    for i in range(4):
        _write(root / "wavs" / f"g{i}.wav", _tone(1.0))
    _write(root / "wavs" / "loud.wav", _tone(1.0, amp=1.5), subtype="FLOAT")
    _phase_inverted(root / "wavs" / "inv.wav")
    out = tmp_path / "store"
    assert main(["prepare", str(root), "--out", str(out), "--workers", "1", "--quiet",
                 "--set", "data.min_duration_s=0.3"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["rejected"] == []
    got = {r["id"]: r["reason"] for r in report["fixed"]}
    assert got == {"loud": SCALED_AUDIO, "inv": ONE_CHANNEL}
    assert report["counts_by_fix"] == {ONE_CHANNEL: 1, SCALED_AUDIO: 1}
    assert all(r["split"] in ("train", "val") and r["detail"].startswith(r["audio_path"])
               for r in report["fixed"])
    printed = capsys.readouterr().out
    assert "kept after a fix: 2" in printed
    assert str(root / "wavs" / "loud.wav") in printed and "scaled down by 3.5 dB" in printed


# ------------------------------------------------------------------ transcripts

def _read(root: Path, *overrides: str):
    return read_dataset(root, load_config(overrides=["data.val_fraction=0", *overrides]))


def _clips(root: Path, ids: list[str]) -> None:
    for uid in ids:
        _write(root / "wavs" / f"{uid}.wav", _tone())


def test_pipe_inside_ljspeech_text_is_reported_not_moved(tmp_path):
    root = tmp_path / "lj"
    rows = ["a1|one two|one two", "a2|three|three", "a3|left | right|left right",
            "a4|four|four"]
    root.mkdir()
    (root / "metadata.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    _clips(root, ["a1", "a2", "a3", "a4"])
    splits = _read(root)
    assert sorted(u.id for u in splits.train) == ["a1", "a2", "a4"]
    assert {u.speaker for u in splits.train} == {"lj"}  # no invented speaker
    (p,) = splits.report.problems
    assert (p.reason, p.line, p.utterance_id) == (MALFORMED_ROW, 3, "a3")
    assert "metadata.csv" in p.source and "4 '|'-separated columns" in p.detail and "3" in p.detail


def test_pipe_inside_two_column_text_is_reported(tmp_path):
    root = tmp_path / "lj"
    root.mkdir()
    (root / "metadata.csv").write_text("b1|plain\nb2|also plain\nb3|this | that\n", "utf-8")
    _clips(root, ["b1", "b2", "b3"])
    splits = _read(root)
    assert [u.text for u in splits.train] == ["plain", "also plain"]
    assert [(p.line, p.reason) for p in splits.report.problems] == [(3, MALFORMED_ROW)]


def test_row_with_fewer_columns_than_its_file_is_reported_not_given_a_guessed_speaker(tmp_path):
    root = tmp_path / "lj"
    root.mkdir()
    rows = ["d1|one|one|ann", "d2|two|two|bo", "d3|three", "d4|four||ann"]
    (root / "metadata.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    _clips(root, ["d1", "d2", "d3", "d4"])
    splits = _read(root)
    assert sorted((u.id, u.speaker) for u in splits.train) == [("d1", "ann"), ("d2", "bo"),
                                                              ("d4", "ann")]
    (p,) = splits.report.problems
    assert (p.reason, p.line, p.utterance_id) == (MALFORMED_ROW, 3, "d3")
    assert "2 '|'-separated columns where the file's rows have 4" in p.detail
    assert "without its speaker column" in p.detail and "line 3" in p.fix and "'id|text||'" in p.fix


@pytest.mark.parametrize("field, value, kind", [
    ("text", ["a", "b"], "array"),
    ("speaker", ["ann", "bo"], "array"),
    ("text", True, "boolean"),
    ("language", False, "boolean"),
    ("duration", True, "boolean"),
])
def test_jsonl_field_of_wrong_type_is_reported_with_row_and_field(tmp_path, field, value, kind):
    root = tmp_path / "m"
    _clips(root, ["c1", "c2"])
    good = {"audio": "wavs/c1.wav", "text": "a good row", "speaker": "ann"}
    bad = {"audio": "wavs/c2.wav", "text": "bad row", "speaker": "ann", field: value}
    (root / "list.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n", "utf-8")
    splits = _read(root)
    assert [u.id for u in splits.train] == ["c1"]
    (p,) = splits.report.problems
    assert (p.reason, p.line) == (MALFORMED_ROW, 2)
    assert f"field {field!r} is a JSON {kind}" in p.detail and "line 2" in p.fix
    assert not any("[" in u.text or u.speaker.startswith("[") for u in splits.train)


def test_jsonl_numbers_stay_readable_where_they_make_sense(tmp_path):
    root = tmp_path / "m"
    _clips(root, ["c1"])
    row = {"audio": "wavs/c1.wav", "text": "numbers", "id": 7, "duration": 0.6}
    (root / "list.jsonl").write_text(json.dumps(row) + "\n", "utf-8")
    splits = _read(root)
    assert [(u.id, u.duration_s) for u in splits.train] == [("7", 0.6)]
    assert len(splits.report) == 0


def test_compatibility_characters_are_normalised_not_vocabulary():
    assert clean_text("the \ufb01ne \ufb02ower", "en") == "the fine flower"
    assert clean_text("\uff28\uff45\uff4c\uff4c\uff4f", "en") == "hello"
    assert clean_text("\u2460 and x\u00b2", "en", TextConfig(expand_numbers=False)) == "1 and x2"
    assert clean_text(clean_text("\ufb01 \ufb03", "en"), "en") == clean_text("\ufb01 \ufb03", "en")


def test_nfkc_leaves_persian_text_intact():
    text = "می\u200cخواهم کتاب\u200cها را بخوانم، آیا خانهٔ ما بزرگ است؟ ۀ ئ ؤ ژ گ چ پ"
    expected = "می\u200cخواهم کتاب\u200cها را بخوانم, آیا خانۀ ما بزرگ است? ۀ ئ ؤ ژ گ چ پ"
    cfg = TextConfig(languages=["fa"], default_language="fa")
    assert clean_text(text, "fa", cfg) == expected
    alphabet = "آابپتثجچحخدذرزژسشصضطظعغفقکگلمنوهیئؤۀء"
    assert clean_text(alphabet, "fa", cfg) == unicodedata.normalize("NFC", alphabet)
    # Arabic presentation forms still become the base letters (the Persian step).
    assert clean_text("\ufefb \ufb8e\ufee4", "fa", cfg) == "لا کم"


# ------------------------------------------------------------------ references

@pytest.mark.parametrize("rate, warned", [(8000, True), (16000, False), (SR, False)])
def test_low_rate_reference_is_warned_with_file_and_rates(tmp_path, caplog, rate, warned):
    cfg = Config()
    synth = Synthesizer(torch.nn.Identity(), cfg, None, torch.device("cpu"))
    path = _write(tmp_path / "ref.wav", _tone(2.0, sr=rate), sr=rate)
    with caplog.at_level(logging.WARNING):
        mel, n = synth.reference(path)
    assert int(n) > 0
    message = f"{path} is recorded at {rate} Hz"
    assert (message in caplog.text) is warned
    if warned:
        assert f"audio.fmax={cfg.audio.fmax:.0f} Hz" in caplog.text and "4000 Hz" in caplog.text
