"""What the machine or the shell does to a command, in one line or none: a reader that stops
reading the output (``| head -1``) ends every command quietly, exit 0, no traceback; a seed
no generator takes is refused by the argument parser (or the config check, for
``--set``) naming it, before any work."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections import namedtuple

import pytest

from myxtts.artifacts.runs import CheckpointManager
from myxtts.cli.main import main
from myxtts.data.feed import slots
from myxtts.data.prepare.chunks import _mp_context, _worker_init
from myxtts.train import recipe
from tests.bad_inputs.test_files_and_folders import _error
from tests.helpers import MICRO_MODEL, REPO


@pytest.mark.parametrize("argv", [["config", "show"], ["inspect-data", "{data}"]])
@pytest.mark.slow
def test_a_reader_that_stops_reading_ends_every_command_quietly(argv, micro_store):
    argv = [a.format(data=micro_store.parent / "data", store=micro_store) for a in argv]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"),
                                                      os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "myxtts.cli.main", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.close()  # the reader is gone before the first line: every write is EPIPE
    _, err = proc.communicate(timeout=120)
    err = err.decode(errors="replace")
    assert proc.returncode == 0 and "Traceback" not in err and "BrokenPipe" not in err, err


@pytest.mark.parametrize("argv", [
    ["train", "{store}", "--seed", "99999999999999999999999"],
    ["train", "{store}", "--seed", "-1"],
    ["synthesize", "-c", "{store}", "-t", "hi", "-r", "x.wav", "-o", "o.wav", "--seed",
     "99999999999999999999999"],
    ["evaluate", "{store}", "{store}", "--seed", "-5"],
    ["make-demo-data", "{tmp}/d", "--seed", "4294967296"],
])
def test_a_seed_no_generator_takes_is_refused_by_the_parser(argv, micro_store, tmp_path,
                                                            capsys):
    argv = [a.format(store=micro_store, tmp=tmp_path) for a in argv]
    with pytest.raises(SystemExit) as e:  # argparse's own one-line error, exit code 2
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "argument --seed: a seed is in [0, 4294967295]" in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("key", ["train.seed", "data.split_seed", "data.shuffle_seed"])
def test_a_seed_set_in_the_config_is_bounded_too(key, micro_store, tmp_path, capsys):
    _error(["train", str(micro_store), "--output-dir", str(tmp_path / "run"), "--set",
            f"{key}=99999999999999999999999"], capsys, key, "4294967295")


def test_prepare_workers_end_by_the_signal_not_by_the_clis_handler():
    """The CLI turns SIGTERM into an exception; prepare's forked workers must not inherit
    that, or the pool's terminate() at the end prints a traceback per idle worker."""
    previous = signal.signal(signal.SIGTERM, lambda *a: None)  # as the CLI's handler does
    try:
        pool = _mp_context().Pool(1, initializer=_worker_init, initargs=(os.getpid(),))
        try:
            inherited = pool.apply(signal.getsignal, (signal.SIGTERM,))
        finally:
            pool.terminate()
            pool.join()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert inherited == signal.SIG_DFL


@pytest.mark.parametrize("source", ["store", "raw"])
def test_a_worker_count_in_the_thousands_is_refused_before_any_worker_starts(source, micro_store,
                                                                            tmp_path, capsys):
    data = micro_store if source == "store" else micro_store.parent / "data"
    _error(["train", str(data), "--output-dir", str(tmp_path / "run"), "--num-workers",
            "100000"], capsys, "data.num_workers=100000", "per CPU")


@pytest.mark.slow
def test_a_run_folder_removed_while_training_stops_the_run_in_one_line(micro_store, tmp_path,
                                                                       capsys, monkeypatch):
    """The run folder is deleted after the first checkpoint: the next save does not make a
    half-empty folder again (checkpoints without config.yaml or vocab.json) but stops the
    run with one line naming the folder."""
    run, real = tmp_path / "run", CheckpointManager.save

    def then_removed(manager, state, step, *a, **k):
        path = real(manager, state, step, *a, **k)
        if step == 2:
            shutil.rmtree(run)
        return path

    monkeypatch.setattr(CheckpointManager, "save", then_removed)
    argv = ["train", str(micro_store), "--output-dir", str(run), "--max-steps", "8", "--quiet"]
    for item in [*MICRO_MODEL, "train.ckpt_every=2", "train.val_every=100",
                 "train.synth_every=0", "train.tensorboard=false", "data.num_workers=0",
                 "train.device=cpu"]:
        argv += ["--set", item]
    line = _error(argv, capsys, f"the run folder {run} was removed", "run stops")
    assert not run.exists(), line


def test_a_dev_shm_too_small_for_the_slots_is_one_line_before_any_worker(micro_store, tmp_path,
                                                                         capsys, monkeypatch):
    """Docker's default 64 MB /dev/shm (here: 1 MiB free) cannot hold the workers' shared
    batch slots: the check doctor makes runs before training, in one line with the fix,
    instead of a worker's bus error mid-epoch."""
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(slots.shutil, "disk_usage", lambda path: usage(2**20, 0, 2**20))
    _error(["train", str(micro_store), "--output-dir", str(tmp_path / "run"), "--num-workers",
            "2", "--max-steps", "1"], capsys, "/dev/shm has 1 MiB free", "--num-workers 0",
           "--shm-size")


def _ten_steps(store, run) -> list[str]:
    """``myxtts train`` for 10 steps of the micro model, checkpoints only at the end."""
    argv = ["train", str(store), "--output-dir", str(run), "--max-steps", "10", "--quiet"]
    for item in [*MICRO_MODEL, "train.ckpt_every=100", "train.val_every=100",
                 "train.synth_every=0", "train.tensorboard=false", "data.num_workers=0",
                 "train.device=cpu"]:
        argv += ["--set", item]
    return argv


def test_a_loader_worker_killed_midway_is_one_line_with_the_last_step_saved(micro_store,
                                                                            tmp_path, capsys,
                                                                            monkeypatch):
    """The out-of-memory killer takes a loader worker at step 5: not a DataLoader traceback
    and no checkpoint, but the checkpoint of step 4 and one line with the likely cause and
    the resume."""
    real, calls = recipe.next_micro, [0]

    def killed_at_step_5(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 5:
            raise RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed. ")
        return real(*args, **kwargs)

    monkeypatch.setattr(recipe, "next_micro", killed_at_step_5)
    run = tmp_path / "run"
    argv = _ten_steps(micro_store, run)
    _error(argv, capsys, "a data loader worker died (DataLoader worker (pid 4242) is killed",
           "out-of-memory killer", "saved at step 4", "run the same command to resume")
    assert CheckpointManager(run / "checkpoints", 1).latest() == run / "checkpoints" / \
        "ckpt_00000004.pt"


def test_a_worker_killed_by_a_store_file_that_shrank_names_the_file(micro_store, tmp_path,
                                                                   capsys, monkeypatch):
    """With loader workers a truncated store file kills the worker that reads past its end
    (SIGBUS, "DataLoader worker ... Bus error"): the line names the file that shrank and
    keeps the last finished step, not a shared-memory traceback."""
    store = tmp_path / "store"
    shutil.copytree(micro_store, store)
    real, calls = recipe.next_micro, [0]

    def truncated_at_step_3(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 3:
            os.truncate(store / "train" / "mel.f16", 1000)
            raise RuntimeError("DataLoader worker (pid 4242) is killed by signal: Bus error. ")
        return real(*args, **kwargs)

    monkeypatch.setattr(recipe, "next_micro", truncated_at_step_3)
    run = tmp_path / "run"
    argv = _ten_steps(store, run)
    _error(argv, capsys, "reading a damaged store", str(store / "train" / "mel.f16"),
           "truncated", "saved at step 2", "run the same command to resume")


_READ_AFTER_TRUNCATION = """
import os, sys
from myxtts.data.store import FeatureStore
store = FeatureStore.open(sys.argv[1], "train")
first = store.mel(0)  # the file is mapped
os.truncate(store.path / "train" / sys.argv[2], 0)  # another process shrinks it
print(float(store.mel(len(store) - 1).astype("float32").sum()))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the handler is Linux's")
def test_a_store_file_truncated_while_mapped_is_one_line_naming_it(micro_store, tmp_path):
    """A run with 0 loader workers reads the store through memory maps: a file truncated
    under them raised SIGBUS, and the process died with a bare "Bus error". Now: one line
    naming the file and the way back, and the signal's exit code."""
    store = tmp_path / "store"
    shutil.copytree(micro_store, store)
    mel_file = next(p.name for p in (store / "train").iterdir() if p.name.startswith("mel"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"),
                                                      os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", _READ_AFTER_TRUNCATION, str(store), mel_file],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 128 + signal.SIGBUS, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(store / "train" / mel_file) in lines[0], done.stderr
    assert "shrank while this run read it" in lines[0] and "--verify" in lines[0]


def test_a_fault_outside_every_store_map_is_said_without_a_name():
    from myxtts.data.store.mapped import bus_error_line, mapped_file

    assert mapped_file(8) is None
    assert "a memory-mapped file shrank" in bus_error_line(8)
