"""`myxtts make-demo-data` and `myxtts inspect-data` through the real CLI entry point."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from myxtts.cli.main import main
from tests.helpers import LJSPEECH_MINI


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "demo"
    assert main(["make-demo-data", str(out), "--speakers", "2", "--utterances", "5", "--seed", "3"]) == 0
    return out


def _wav(path: Path, sr: int = 22050, seconds: float = 0.5) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.arange(int(seconds * sr)) / sr
    sf.write(path, (0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32), sr, subtype="PCM_16")


def test_make_demo_data_writes_and_refuses_non_empty(demo, capsys, tmp_path):
    assert len(list((demo / "wavs").glob("*.wav"))) == 10
    assert (demo / "README.txt").is_file()
    rc, out, err = _run(capsys, "make-demo-data", demo, "--utterances", "2")
    assert rc == 2 and "is not empty" in err and "--force" in err and err.count("\n") == 1
    again = tmp_path / "again"
    rc, out, _ = _run(capsys, "make-demo-data", again, "--speakers", "2", "--utterances", "5",
                      "--seed", "3")
    assert rc == 0 and "wrote 10 clips" in out and f"inspect-data {again}" in out
    assert (again / "metadata.csv").read_bytes() == (demo / "metadata.csv").read_bytes()
    rc, _, _ = _run(capsys, "make-demo-data", again, "--speakers", "1", "--utterances", "1", "--force")
    assert rc == 0 and len((again / "metadata.csv").read_text().splitlines()) == 1
    assert [p.name for p in (again / "wavs").iterdir()] == ["spk0_0000.wav"]  # stale clips gone


def test_inspect_demo_summary(demo, capsys):
    rc, out, err = _run(capsys, "inspect-data", demo, "--set", "data.val_fraction=0.2")
    assert rc == 0, err
    assert "format ljspeech" in out
    assert "utterances: 10 (train 8, val 2)" in out
    assert "h total (train" in out
    assert "speakers: 2" in out
    for spk in ("spk0", "spk1"):
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(spk))
        assert "5 utts" in line and "min" in line and "(4/1)" in line
    assert "clip durations (" in out and "|#" in out
    hist_counts = [int(ln.rsplit("|", 1)[1]) for ln in out.splitlines() if " s |" in ln]
    assert sum(hist_counts) == 10
    assert "sample rates: 22050 Hz (10 clips)" in out
    assert "problems: none" in out


def test_inspect_reports_problems_and_exits_zero(tmp_path, capsys):
    root = tmp_path / "broken"
    for uid in ("a", "b", "c"):
        _wav(root / "wavs" / f"{uid}.wav")
    _wav(root / "wavs" / "hi.wav", sr=44100)
    (root / "wavs" / "junk.wav").write_bytes(b"not a wav file at all")
    (root / "metadata.csv").write_text(
        "a|fine\n"
        "b|one|two|three|four|five\n"   # line 2: columns
        "x|no audio\n"             # line 3: missing
        "c|\n"                     # line 4: empty text
        "a|dup\n"                  # line 5
        "hi|other rate\n"
        "junk|unreadable clip\n")
    json_path = tmp_path / "report.json"
    rc, out, err = _run(capsys, "inspect-data", root, "--json", json_path)
    assert rc == 0, err
    assert "utterances: 3 (train" in out
    meta = root / "metadata.csv"
    for reason, where in [("malformed row", f"{meta}:2"), ("missing audio", f"{meta}:3"),
                          ("empty text", f"{meta}:4"), ("duplicate id", f"{meta}:5"),
                          ("unreadable audio", str(root / "wavs" / "junk.wav"))]:
        assert f"{reason} (1):" in out
        assert any(where in ln and "fix:" in ln for ln in out.splitlines()), where
    assert "6 problem(s)" not in out and "5 problem(s)" in out
    assert "44100 Hz (1 clips)" in out and "will be resampled" in out
    assert json.loads(json_path.read_text())["counts"]["missing audio"] == 1
    # With resampling off the other-rate clip becomes a problem (and an error line).
    rc, out, _ = _run(capsys, "inspect-data", root, "--set", "audio.resample=false")
    assert rc == 0 and "wrong sample rate (1):" in out and "audio.resample is false" in out


def test_inspect_errors_exit_2(tmp_path, capsys):
    rc, out, err = _run(capsys, "inspect-data", tmp_path / "missing")
    assert rc == 2 and "does not exist" in err and err.count("\n") == 1
    root = tmp_path / "allbad"
    root.mkdir()
    (root / "metadata.csv").write_text("a|x\nb|y\n")
    rc, out, err = _run(capsys, "inspect-data", root)
    assert rc == 2 and "no usable utterances" in err
    assert "missing audio (2):" in out and f"{root / 'metadata.csv'}:2" in out


def test_inspect_ljspeech_mini(capsys):
    if not (LJSPEECH_MINI / "metadata.csv").is_file():
        pytest.skip(f"{LJSPEECH_MINI} not present (set MYXTTS_LJSPEECH_MINI)")
    rc, out, err = _run(capsys, "inspect-data", LJSPEECH_MINI)
    assert rc == 0, err
    assert "utterances: 100 (train 95, val 5)" in out and "problems: none" in out
