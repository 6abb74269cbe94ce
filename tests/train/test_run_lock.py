"""One run folder, one writer: a second `myxtts train` into a folder a live run writes is a
one-line error naming the folder and the process; a killed run's lock is taken over; an
output folder that cannot be written is a one-line error before any work."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from myxtts.artifacts import checkpoint as ck
from myxtts.artifacts.runs import CheckpointManager
from myxtts.system import FolderBusy, FolderError, folder_lock
from tests.helpers import MICRO_MODEL


def _cmd(store, run, steps: int) -> list[str]:
    cmd = [sys.executable, "-m", "myxtts.cli.main", "train", str(store), "--quiet",
           "--output-dir", str(run), "--max-steps", str(steps)]
    for item in [*MICRO_MODEL, "data.batch_frames=1200", "data.num_workers=0",
                 "train.tensorboard=false", "train.log_every=2", "train.synth_every=0",
                 "train.device=cpu", "train.ckpt_every=2", "train.val_every=1000"]:
        cmd += ["--set", item]
    return cmd


@pytest.mark.slow
def test_a_second_writer_is_refused_and_a_killed_runs_lock_is_taken_over(micro_store, tmp_path):
    run = tmp_path / "run"
    first = subprocess.Popen(_cmd(micro_store, run, 100000), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not list((run / "checkpoints").glob("ckpt_*.pt")):
            time.sleep(0.2)
        assert list((run / "checkpoints").glob("ckpt_*.pt")), "no checkpoint within 120 s"
        second = subprocess.run(_cmd(micro_store, run, 4), capture_output=True, text=True,
                                timeout=120)
        assert second.returncode == 2
        assert second.stderr.strip().splitlines() == [
            f"myxtts train: error: {run} is being written by pid {first.pid} (`myxtts train`) "
            f"right now; wait for it to finish (or stop it), or use another folder (--output-dir)"]
    finally:
        first.send_signal(signal.SIGKILL)  # a killed run leaves its lock file behind
        first.wait(timeout=60)
    newest = ck.load(CheckpointManager(run / "checkpoints", 1).resumable())[ck.PROGRESS]["step"]
    third = subprocess.run(_cmd(micro_store, run, newest + 2), capture_output=True, text=True,
                           timeout=120)
    assert third.returncode == 0, third.stderr[-2000:]
    assert f"trained to step {newest + 2}" in third.stdout


def test_the_lock_names_its_holder_and_is_free_after_use(tmp_path):
    with folder_lock(tmp_path / "a", "myxtts train"):
        with pytest.raises(FolderBusy, match=rf"pid {os.getpid()} \(`myxtts train`\)"):
            with folder_lock(tmp_path / "a", "myxtts train-vocoder"):
                pass
    with folder_lock(tmp_path / "a", "myxtts train"):  # released: taken again
        pass


def test_an_unwritable_output_folder_is_one_line(micro_store, tmp_path):
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o500)  # no write permission (root ignores it: then sysfs, read-only to all)
    target = locked / "run" if os.geteuid() != 0 else Path("/sys/myxtts-test/run")
    if os.geteuid() == 0 and not Path("/sys/kernel").is_dir():
        pytest.skip("root without a read-only sysfs: nothing here refuses a write")
    try:
        r = subprocess.run(_cmd(micro_store, target, 2), capture_output=True, text=True,
                           timeout=120)
    finally:
        locked.chmod(0o700)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"myxtts train: error: cannot write {target} (")
    assert lines[0].endswith("); choose a folder you can write (--output-dir)")


def test_a_file_where_the_folder_should_be_is_a_folder_error(tmp_path):
    (tmp_path / "taken").write_text("a file")
    with pytest.raises(FolderError, match=r"cannot write .*taken"):
        with folder_lock(tmp_path / "taken", "myxtts train"):
            pass


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="no SIGHUP on this platform")
def test_a_closed_terminal_stops_training_at_a_step_but_nohup_is_kept():
    from myxtts.train.run import StopFlag

    old = signal.getsignal(signal.SIGHUP)
    try:
        with StopFlag() as stop:  # the terminal closes: saved and stopped like SIGTERM
            os.kill(os.getpid(), signal.SIGHUP)
            assert stop.signum == signal.SIGHUP
        assert signal.getsignal(signal.SIGHUP) == old
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # started under nohup: keeps running
        with StopFlag() as stop:
            os.kill(os.getpid(), signal.SIGHUP)
            assert stop.signum is None and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, old)
