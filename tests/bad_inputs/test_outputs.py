"""Outputs the user names, one family per rule, through the real CLI in-process:

- an output that is one of the command's inputs -- also through a symbolic or hard link --
  or a file of another kind (a checkpoint, a config, a dataset's metadata) is refused, and
  a folder a command writes is never inside the data it reads;
- ``-`` is standard output where a command says so (``inspect-data --json``, ``synthesize
  --stream``) and refused elsewhere; a folder is used as documented or refused; an
  interrupted, terminated or hung-up synthesis leaves no half-written file and says so;
- a write that fails (read-only folder, full disk for a new file or over an old one, past
  ``ulimit -f``) is one line, and the old file is kept.

Each case: exit code 2 (or the documented success), one error line naming the path, every
file that was there unchanged, nothing new left behind.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from myxtts.cli.main import main
from tests.bad_inputs.conftest import one_error, snapshot
from tests.helpers import REPO

pytestmark = pytest.mark.usefixtures("one_thread")
READ_ONLY = Path("/sys/myxtts-test")  # sysfs refuses new files, even to root


@pytest.fixture
def run(micro_run, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(micro_run, copy)
    return copy


def _synth(run: Path, ref: Path, out: str, *extra: str) -> list[str]:
    return ["synthesize", "-c", str(run), "-t", "lamo tesi", "-r", str(ref), "-o", out,
            "--device", "cpu", *extra]


# ---------------------------------------------------------------- an output is never an input

def _link(kind: str, target: Path, name: Path) -> Path:
    (os.symlink if kind == "symlink" else os.link)(target, name)
    return name


RULE1 = {
    # name: (argv from (run, ref, tmp), needles of the error line)
    "export a checkpoint over itself": (
        lambda r, ref, t: ["export", str(r / "checkpoints/best.pt"), "-o",
                           str(r / "checkpoints/best.pt")], ("best.pt", "checkpoint being exported")),
    "export a run folder over the checkpoint it stands for": (
        lambda r, ref, t: ["export", str(r), "-o", str(r / "checkpoints/best.pt")],
        ("best.pt", "replace its own input")),
    "export over a symbolic link to the checkpoint": (
        lambda r, ref, t: ["export", str(r), "-o",
                           str(_link("symlink", r / "checkpoints/best.pt", t / "ln.pt"))],
        ("ln.pt", "checkpoint being exported")),
    "export over a hard link to the checkpoint": (
        lambda r, ref, t: ["export", str(r), "-o",
                           str(_link("hard", r / "checkpoints/best.pt", t / "hard.pt"))],
        ("hard.pt", "checkpoint being exported")),
    "export over another checkpoint": (
        lambda r, ref, t: ["export", str(r / "checkpoints/best.pt"), "-o",
                           str(r / "checkpoints/ckpt_00000002.pt")],
        ("ckpt_00000002.pt", "is not a model bundle")),
    "export over the run's config": (
        lambda r, ref, t: ["export", str(r), "-o", str(r / "config.yaml")],
        ("config.yaml", "is not a model bundle")),
    "synthesize over its reference": (
        lambda r, ref, t: _synth(r, shutil.copy(ref, t / "ref.wav"), str(t / "ref.wav")),
        ("ref.wav", "--reference")),
    "synthesize over a symbolic link to its reference": (
        lambda r, ref, t: _synth(r, shutil.copy(ref, t / "ref.wav"),
                                 str(_link("symlink", t / "ref.wav", t / "o.wav"))),
        ("o.wav", "--reference")),
    "stream over a checkpoint": (
        lambda r, ref, t: _synth(r, ref, str(r / "checkpoints/best.pt"), "--stream"),
        ("best.pt", "give a .wav file name")),
    "synthesize over a wav-named checkpoint": (
        lambda r, ref, t: _synth(r, ref, str(shutil.copy(r / "checkpoints/best.pt",
                                                         t / "model.wav"))),
        ("model.wav", "is not a WAV file")),
    "inspect report over the dataset's metadata": (
        lambda r, ref, t: ["inspect-data", str(t / "data"), "--json",
                           str(t / "data/metadata.csv")], ("metadata.csv", "not a JSON report")),
    "inspect report over its manifest": (
        lambda r, ref, t: ["inspect-data", str(t / "m.jsonl"), "--json", str(t / "m.jsonl")],
        ("m.jsonl", "the dataset")),
    "prepare into the dataset": (
        lambda r, ref, t: ["prepare", str(t / "data"), "--out", str(t / "data"), "--quiet"],
        ("--out", "the dataset")),
    "prepare into a folder inside the dataset": (
        lambda r, ref, t: ["prepare", str(t / "data"), "--out", str(t / "data/store"),
                           "--quiet"], ("data/store", "lies inside the dataset")),
    "train into its store": (
        lambda r, ref, t: ["train", str(t / "store"), "--output-dir", str(t / "store"),
                           "--max-steps", "1"], ("--output-dir", "the data")),
    "vocoder run into the TTS run it fine-tunes on": (
        lambda r, ref, t: ["train-vocoder", str(t / "store"), "--tts-checkpoint", str(r),
                           "--output-dir", str(r)], ("--output-dir", "--tts-checkpoint")),
    "fine-tune into the run it starts from": (
        lambda r, ref, t: ["train", str(t / "store"), "--init-from", str(r), "--output-dir",
                           str(r / "ft")], ("--init-from run",)),
    "monitor log appended to another run's metrics": (
        lambda r, ref, t: ["monitor", str(r), "--count", "1", "--log",
                           str(shutil.copy(r / "metrics.jsonl", t / "other.jsonl"))],
        ("other.jsonl", "not a log of `myxtts monitor`")),
}


@pytest.mark.parametrize("case", sorted(RULE1))
def test_an_output_is_never_an_input_nor_a_file_of_another_kind(case, run, reference, micro_store,
                                                                tmp_path, capsys, monkeypatch):
    shutil.copytree(micro_store.parent / "data", tmp_path / "data")
    shutil.copytree(micro_store, tmp_path / "store")
    wav = str(tmp_path / "data/wavs" / reference.name)
    (tmp_path / "m.jsonl").write_text(json.dumps({"audio": wav, "text": "lamo tesi"}) + "\n")
    monkeypatch.setattr("myxtts.diagnose.monitor.load_nvml", lambda: (None, "no NVML in tests"))
    argv, needles = RULE1[case][0](run, reference, tmp_path), RULE1[case][1]
    before = snapshot(tmp_path)
    one_error(argv, capsys, *needles)
    assert snapshot(tmp_path) == before  # nothing replaced, nothing added


# ---------------------------------------------------------------- "-", folders, half-written files

def test_dash_is_standard_output_where_documented_and_refused_elsewhere(run, reference, micro_store,
                                                                       tmp_path, capsys,
                                                                       monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = micro_store.parent / "data"
    assert main(["inspect-data", str(data), "--json", "-"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["problems"] == [] and "speakers" in out.err  # summary on stderr
    for argv, needle in [
        (_synth(run, reference, "-"), "needs --stream"),  # a wav cannot be streamed to stdout
        (["export", str(run), "-o", "-"], "not standard output"),
        (["prepare", str(data), "--out", "-", "--quiet"], "not standard output"),
        (["train", str(micro_store), "--output-dir", "-", "--max-steps", "1"], "--output-dir -"),
        (["make-demo-data", "-"], "not standard output"),
        (["monitor", "--log", "-", "--count", "1"], "standard output"),
    ]:
        one_error(argv, capsys, needle)
    assert sorted(os.listdir(tmp_path)) == ["run"]  # no file or folder named "-"


def test_a_folder_is_used_as_documented(run, reference, tmp_path, capsys):
    folder = tmp_path / "voices"
    folder.mkdir()
    assert main(_synth(run, reference, str(folder))) == 0  # one text -> 000.wav inside
    assert sorted(os.listdir(folder)) == ["000.wav"]
    assert main(_synth(run, reference, str(tmp_path / "new"), "--stream")) == 0
    assert sorted(os.listdir(tmp_path / "new")) == ["000.wav"]
    capsys.readouterr()
    one_error(["export", str(run), "-o", str(folder)], capsys, "is a folder")
    one_error(_synth(run, reference, str(tmp_path / "notes.txt")), capsys, "give a .wav file")
    one_error(_synth(run, reference, "/dev/null"), capsys, "character device")


# signal: (exit code, the line's word); SIGHUP: the terminal closed, an ssh session dropped
STOPS = {signal.SIGINT: (130, "interrupted"), signal.SIGTERM: (143, "terminated"),
         signal.SIGHUP: (129, "hung up")}


@pytest.mark.parametrize("stop", sorted(STOPS))
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.slow
def test_a_stopped_synthesis_leaves_no_half_written_file_and_says_so(stop, stream, run, reference,
                                                                    tmp_path, capsys,
                                                                    monkeypatch):
    from myxtts.inference.synthesizer import Synthesizer

    out = tmp_path / "out.wav"
    out.write_bytes(b"RIFF\0\0\0\0WAVE an older take")
    real = Synthesizer.speak if not stream else Synthesizer.stream

    def stopped_after_one(self, *args, **kwargs):  # the signal arrives mid-synthesis
        for i, part in enumerate(real(self, *args, **kwargs)):
            yield part
            if i == 0:
                os.kill(os.getpid(), stop)

    monkeypatch.setattr(Synthesizer, "stream" if stream else "speak", stopped_after_one)
    text = "lamo tesi. kali miresu. fato pana."
    argv = ["synthesize", "-c", str(run), "-t", text, "-r", str(reference), "-o", str(out),
            "--device", "cpu", *(["--stream"] if stream else [])]
    before = snapshot(tmp_path)
    rc = main(argv)
    err = capsys.readouterr().err
    code, word = STOPS[stop]
    assert rc == code and "Traceback" not in err
    assert f"myxtts synthesize: {word}; {out} not written (the old file is kept)" in err, err
    assert snapshot(tmp_path) == before  # the old take as it was, no temp file beside it


# ---------------------------------------------------------------- a failed write is one line

def _full_disk(monkeypatch) -> None:
    """The disk fills up while the file is written (the bytes are flushed at the end)."""
    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("myxtts.system.os.fsync", full)


WRITERS = {
    "export": lambda run, ref, out: ["export", str(run), "-o", str(out / "model.safetensors")],
    "synthesize": lambda run, ref, out: _synth(run, ref, str(out / "o.wav")),
    "inspect-data": lambda run, ref, out: ["inspect-data", str(ref.parent.parent), "--json",
                                           str(out / "report.json")],
}


@pytest.mark.parametrize("old", [False, True], ids=["new file", "over an old file"])
@pytest.mark.parametrize("command", sorted(WRITERS))
def test_a_full_disk_is_one_line_and_keeps_the_old_file(command, old, run, reference, tmp_path,
                                                        capsys, monkeypatch):
    out = tmp_path / "out"
    argv = WRITERS[command](run, reference, out)
    if old:  # a good earlier output, written before the disk filled up
        assert main(argv) == 0
        capsys.readouterr()
    before = snapshot(out) if out.exists() else {}
    _full_disk(monkeypatch)
    kept = "the old" if old else "nothing was written"
    one_error(argv, capsys, "cannot write", "the disk is full", kept)
    assert (snapshot(out) if out.exists() else {}) == before


def test_a_read_only_folder_is_one_line(run, tmp_path, capsys):
    if not Path("/sys/kernel").is_dir():
        pytest.skip("no sysfs here (not Linux)")
    one_error(["export", str(run), "-o", f"{READ_ONLY}/model.safetensors"], capsys,
              "cannot write", str(READ_ONLY))


@pytest.mark.slow
def test_past_ulimit_f_is_one_line_and_keeps_the_old_file(run, tmp_path):
    """A real file size limit, in a process of its own: SIGXFSZ must not kill it, the write
    fails with EFBIG and the old bundle stays."""
    out = tmp_path / "model.safetensors"
    assert main(["export", str(run), "-o", str(out)]) == 0
    before = snapshot(tmp_path)
    limit = out.stat().st_size // 2

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run([sys.executable, "-m", "myxtts.cli.main", "export", str(run), "-o",
                           str(out)], capture_output=True, text=True, env=env,
                          preexec_fn=small_files, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "ulimit -f" in proc.stderr and "the old model.safetensors is kept" in proc.stderr
    assert snapshot(tmp_path) == before
