"""Hostile files and folders, run through the real CLI in-process as in
tests/test_bad_inputs.py: nothing the user owns is deleted (``prepare --force``,
``make-demo-data --force``), a failed prepare leaves no folder of its own, a folder's
odd entries (symbolic link loops, FIFOs, folders, MP3s) are reported as what they are,
a device or FIFO given as a dataset is one line (never opened: a FIFO would block), and a
config repeating a key is refused naming the key and line.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from myxtts.cli.main import main
from tests.test_bad_inputs import GOOD, TRAIN, _dataset


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    rc = main(argv)  # an unexpected exception fails the test with its traceback
    out = capsys.readouterr()
    text = out.out + out.err
    assert "Traceback" not in text, text
    return rc, text, out.err


def _error(argv: list[str], capsys, *needles: str) -> str:
    rc, text, err = _run(argv, capsys)
    assert rc == 2, (rc, text)
    errors = [ln for ln in err.splitlines() if ": error: " in ln]
    assert len(errors) == 1, err  # one line says what is wrong and the fix
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
    return errors[0]


def _digest(path: Path) -> dict[str, str]:
    return {q.relative_to(path).as_posix(): hashlib.sha256(q.read_bytes()).hexdigest()
            for q in sorted(path.rglob("*")) if q.is_file()}


# ---------------------------------------------------------------- nothing the user owns is deleted

def test_prepare_force_refuses_to_delete_files_it_did_not_write(micro_store, tmp_path, capsys):
    store = tmp_path / "store"
    shutil.copytree(micro_store, store)
    (store / "train" / "my-run").mkdir()
    (store / "train" / "my-run" / "notes.txt").write_text("mine")
    before = _digest(store)
    # Another split seed: --force would rebuild the store.
    _error(["prepare", str(micro_store.parent / "data"), "--out", str(store), "--force",
            "--set", "data.split_seed=7", "--workers", "1", "--quiet"], capsys, "notes.txt", "not written by prepare")
    assert _digest(store) == before


def test_make_demo_data_force_refuses_a_folder_it_did_not_write(tmp_path, capsys):
    data = tmp_path / "mine"
    (data / "wavs").mkdir(parents=True)
    (data / "metadata.csv").write_text("spk0_0000|my own words\n")
    (data / "wavs" / "spk0_0000.wav").write_bytes(b"my own recording")
    before = _digest(data)
    _error(["make-demo-data", str(data), "--utterances", "1", "--speakers", "1", "--force"],
           capsys, str(data), "did not write")
    assert _digest(data) == before


def test_make_demo_data_force_replaces_only_its_own_corpus(tmp_path, capsys):
    data = tmp_path / "demo"
    args = ["make-demo-data", str(data), "--speakers", "1", "--sample-rate", "16000"]
    assert _run([*args, "--utterances", "3"], capsys)[0] == 0
    assert _run([*args, "--utterances", "2", "--force"], capsys)[0] == 0  # its own: replaced
    assert sorted(p.name for p in (data / "wavs").iterdir()) == ["spk0_0000.wav", "spk0_0001.wav"]
    (data / "wavs" / "notes.txt").write_text("mine")
    before = _digest(data)
    _error([*args, "--utterances", "1", "--force"], capsys, "notes.txt", "did not write")
    assert _digest(data) == before


def test_failed_prepare_leaves_no_empty_out_folder(tmp_path, capsys):
    (tmp_path / "nothing_here").mkdir()
    out = tmp_path / "store"
    _error(["prepare", str(tmp_path / "nothing_here"), "--out", str(out), "--quiet"], capsys,
           "no recognised dataset metadata")
    assert not out.exists()


# ---------------------------------------------------------------- folders: say what is there

def test_symlink_loop_in_wavs_is_one_reported_clip(tmp_path, capsys):
    data = _dataset(tmp_path / "d", [*GOOD, "g9|a looping link"],
                    {"g9": lambda q: os.symlink(q.name, q)})
    rc, text, _ = _run(["prepare", str(data), "--out", str(tmp_path / "s"), "--workers", "1",
                        "--quiet"], capsys)
    assert rc == 0, text
    assert "symbolic link loop" in text and "kept 4 of 4" in text, text


def test_fifo_folder_and_mp3_are_named_for_what_they_are(tmp_path, capsys):
    data = _dataset(tmp_path / "d", [*GOOD, "g7|a pipe", "g8|a folder", "g9|an mp3"],
                    {"g7": lambda q: os.mkfifo(q), "g8": lambda q: q.mkdir(),
                     "g9": lambda q: q.with_suffix(".mp3").write_bytes(b"ID3\x03\x00fake mp3")})
    rc, text, _ = _run(["inspect-data", str(data), "--max-problems", "9"], capsys)
    assert rc == 0, text
    for needle in ("g7.wav is a FIFO", "g8.wav is a folder", "g9.mp3 is in a format", "(MP3)"):
        assert needle in text, (needle, text)
    assert "does not exist" not in text, text


@pytest.mark.parametrize("target", ["dev_null", "fifo"])
@pytest.mark.parametrize("command", ["inspect-data", "prepare", "train"])
def test_device_or_fifo_as_dataset_is_one_line(command, target, tmp_path, capsys):
    path = Path("/dev/null")
    if target == "fifo":
        path = tmp_path / "pipe"
        os.mkfifo(path)  # opening it would block: the command must not
    argv = [command, str(path)]
    if command == "prepare":
        argv += ["--out", str(tmp_path / "s"), "--quiet"]
    if command == "train":
        argv += ["--output-dir", str(tmp_path / "r"), *TRAIN]
    _error(argv, capsys, str(path), "FIFO" if target == "fifo" else "character device")
    assert not (tmp_path / "s").exists()


# ---------------------------------------------------------------- config: a key named twice

@pytest.mark.parametrize("yaml_text, needles", [
    ("train:\n  lr: 0.001\nmodel:\n  preset: tiny\ntrain:\n  max_steps: 3\n",
     ("'train'", "line 5", "line 1")),
    ("train:\n  lr: 0.001\n  max_steps: 3\n  lr: 0.5\n", ("'lr'", "line 4", "line 2")),
])
def test_duplicate_yaml_keys_are_refused(yaml_text, needles, tmp_path, capsys):
    cfg = tmp_path / "dup.yaml"
    cfg.write_text(yaml_text)
    _error(["config", "show", "--config", str(cfg)], capsys, "dup.yaml", *needles)



@pytest.mark.parametrize("make, needles", [
    (lambda p: p.mkdir(), ("is a folder, not a file",)),
    (lambda p: os.mkfifo(p), ("is a FIFO (named pipe), not a file",)),  # never opened
    (lambda p: p.write_bytes(b"\xff\xfetrain: {}"), ("not UTF-8 text (byte 0)",)),
])
def test_config_that_is_not_a_text_file_is_one_line(make, needles, tmp_path, capsys):
    path = tmp_path / "c.yaml"
    make(path)
    _error(["config", "show", "--config", str(path)], capsys, str(path), *needles)
