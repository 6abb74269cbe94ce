"""Multi-node training with torchrun's c10d rendezvous, tested as two "nodes" on this
machine (two launchers on localhost, gloo): they train, write each checkpoint once, resume;
a changed world size, a store missing on one node and a node left alone at the rendezvous
all end with a message instead of a hang."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

import pytest
from torch.distributed import TCPStore

from myxtts.artifacts import checkpoint as ck
from tests.helpers import MICRO_MODEL

SETS = [*MICRO_MODEL, "data.batch_frames=1200", "data.num_workers=0", "train.tensorboard=false",
        "train.log_every=2", "train.synth_every=0", "train.device=cpu", "train.val_every=4",
        "train.ckpt_every=2"]
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def _train_args(store: Path | str, run: Path, steps: int) -> list[str]:
    args = ["-m", "myxtts.cli.main", "train", str(store), "--quiet", "--output-dir", str(run),
            "--max-steps", str(steps)]
    for item in SETS:
        args += ["--set", item]
    return args


def _launcher(port: int, run_id: str, join_timeout: int = 60, conf: str = "") -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node",
            "1", "--rdzv_backend", "c10d", "--rdzv_endpoint", f"localhost:{port}", "--rdzv_id",
            run_id, "--rdzv_conf", f"join_timeout={join_timeout}{conf}"]


def _two_nodes(port: int, run_id: str, args_a: list[str], args_b: list[str]
               ) -> list[subprocess.CompletedProcess]:
    """Both launchers join a rendezvous store this process hosts (``is_host=false``). Hosted
    by a launcher, the store closes when that launcher exits, and the other launcher, still
    polling it while its worker shuts down, fails the run after training succeeded (torchrun's
    agent, seen in CI on a loaded machine); docs/gpus.md ("Several machines") says so. Output goes to files:
    a full pipe not read while waiting on the other node would stall that node."""
    store = TCPStore("localhost", port, is_master=True, multi_tenant=True,
                     wait_for_workers=False, timeout=timedelta(seconds=120))
    with tempfile.TemporaryDirectory() as logs:
        files = [open(Path(logs) / f"node{i}.log", "w+") for i in range(2)]
        procs = [subprocess.Popen([*_launcher(port, run_id, conf=",is_host=false"), *args],
                                  stdout=f, stderr=subprocess.STDOUT, text=True, env=ENV)
                 for args, f in zip((args_a, args_b), files)]
        try:
            for p in procs:
                p.wait(timeout=300)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            del store
        outs = []
        for p, f in zip(procs, files):
            f.seek(0)
            outs.append(subprocess.CompletedProcess(p.args, p.returncode, f.read(), ""))
            f.close()
    return outs


@pytest.mark.slow
def test_two_nodes_train_checkpoint_once_and_resume(micro_store, tmp_path):
    run = tmp_path / "run"
    first = _two_nodes(29621, "mn-a", _train_args(micro_store, run, 4), _train_args(micro_store, run, 4))
    for r in first:
        assert r.returncode == 0, r.stdout[-3000:]
    assert sum("last checkpoint" in r.stdout for r in first) == 1  # rank 0 alone writes
    assert sorted(p.name for p in (run / "checkpoints").glob("ckpt_*.pt")) == \
        ["ckpt_00000002.pt", "ckpt_00000004.pt"]
    state = ck.load(run / "checkpoints" / "ckpt_00000004.pt")
    assert state[ck.PROGRESS]["data_plan"]["world_size"] == 2

    again = _two_nodes(29622, "mn-b", _train_args(micro_store, run, 6), _train_args(micro_store, run, 6))
    for r in again:
        assert r.returncode == 0, r.stdout[-3000:]
        assert "ckpt_00000004.pt (step 4)" in r.stdout and "trained to step 6" in r.stdout
    assert ck.load(run / "checkpoints" / "ckpt_00000006.pt")[ck.PROGRESS]["step"] == 6

    # the same run on one process: refused in one line, naming the fix
    alone = subprocess.run([sys.executable, *_train_args(micro_store, run, 8)],
                           capture_output=True, text=True, timeout=120, env=ENV)
    assert alone.returncode == 2
    error = alone.stderr.strip().splitlines()[-1]
    assert error.startswith("myxtts train: error: cannot continue the data order") and \
        "world_size=2" in error and "same number of processes" in error, alone.stderr


@pytest.mark.slow
def test_a_store_missing_on_one_node_stops_every_node(micro_store, tmp_path):
    run = tmp_path / "run"
    outs = _two_nodes(29623, "mn-c", _train_args(micro_store, run, 2),
                      _train_args(tmp_path / "not-mounted" / "store", run, 2))
    text = "\n".join(r.stdout for r in outs)
    assert all(r.returncode != 0 for r in outs), text[-3000:]
    assert "not-mounted/store does not exist" in text
    assert "could not start:" in text  # the healthy node names the rank that failed
    assert not (run / "checkpoints").exists() or not list((run / "checkpoints").glob("*.pt"))


@pytest.mark.slow
def test_a_node_alone_at_the_rendezvous_times_out_with_a_message(micro_store, tmp_path):
    r = subprocess.run([*_launcher(29624, "mn-d", join_timeout=3),
                        *_train_args(micro_store, tmp_path / "run", 2)],
                       capture_output=True, text=True, timeout=120, env=ENV)
    assert r.returncode != 0
    assert "RendezvousTimeoutError" in r.stdout + r.stderr


@pytest.mark.slow
def test_one_data_gpu_for_every_rank_is_refused(micro_store, tmp_path):
    raw = micro_store.parent / "data"  # on-the-fly: the dataset the micro store came from
    # --monitor-interval 5: torchrun stops the second rank only after both have refused
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_port=29625", "--monitor-interval=5", *_train_args(raw, tmp_path / "run", 2),
           "--set", "data.data_device=cuda:0"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=ENV)
    assert r.returncode != 0
    assert r.stderr.count("myxtts train: error: data.data_device=cuda:0 under torchrun would make "
                          "every rank compute features on that one GPU") == 2, r.stderr[-2000:]
