"""Validation under DDP: each rank validates its shard and the all-reduced mean equals the
loss one process computes over the whole split."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.model.xtts import build_model
from myxtts.train.data import open_train_data
from myxtts.train.distributed import DistInfo
from myxtts.train.engine import TrainEngine
from myxtts.train.validation import validation_loss, validation_sums
from tests.helpers import MICRO_MODEL, micro_config

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def val_store(tmp_path_factory):
    """A store whose val split has several batches (a third of 2 x 12 utterances)."""
    from myxtts.data.prepare.build import prepare_store
    from myxtts.synthetic import make_demo_data

    root = tmp_path_factory.mktemp("valstore")
    data = make_demo_data(root / "data", speakers=2, utterances=12, seed=5)
    cfg = micro_config(root / "unused", "data.val_fraction=0.34")
    prepare_store(data, root / "store", cfg, workers=1, progress=False, echo=lambda *a: None)
    return root / "store"


def _engine(cfg, data) -> TrainEngine:
    torch.manual_seed(0)
    model = build_model(cfg, data.vocab_size, len(data.languages), data.mel_mean, data.mel_std)
    return TrainEngine(cfg, model, CPU, DistInfo(), compile_model=False)


@pytest.mark.parametrize("world", [2, 3])
def test_rank_shards_add_up_to_the_single_process_loss(val_store, tmp_path, world, one_thread):
    cfg = micro_config(tmp_path, "data.batch_frames=600")
    whole = open_train_data(cfg, val_store, CPU, DistInfo(), None)
    engine = _engine(cfg, whole)
    single = validation_loss(engine, whole, CPU)
    n_batches = len(whole.val_sampler)
    assert n_batches >= 3  # enough batches to shard

    totals: dict[str, float] = {}
    count, shards = 0.0, []
    for rank in range(world):
        data = open_train_data(cfg, val_store, CPU, DistInfo(rank=rank, world_size=world), None)
        shards.append(data.val_sampler.real_batches)
        with engine.evaluating():  # what validation_loss runs the sums in
            sums, n = validation_sums(engine, data, CPU)
        count += float(n)
        for k, v in sums.items():
            totals[k] = totals.get(k, 0.0) + float(v)
    assert sum(shards) == n_batches and max(shards) < n_batches  # each rank did a part
    assert count == n_batches
    assert single is not None and set(totals) == set(single)
    for k in single:
        assert totals[k] / count == pytest.approx(single[k], rel=1e-5, abs=1e-6), k


@pytest.mark.slow
def test_torchrun_validation_logs_the_global_loss(val_store, tmp_path):
    """Two gloo ranks train 2 steps and validate at step 2; rank 0's logged val loss equals a
    single process validating the step-2 checkpoint on the whole split."""
    run = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_port=29541", "-m", "myxtts.cli.main", "train", str(val_store), "--quiet",
           "--output-dir", str(run), "--max-steps", "2"]
    sets = [*MICRO_MODEL, "data.batch_frames=600", "data.num_workers=0", "train.tensorboard=false",
            "train.log_every=2", "train.synth_every=0", "train.device=cpu", "train.val_every=2",
            "train.ckpt_every=2", "train.warmup_steps=2"]
    for item in sets:
        cmd += ["--set", item]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    logged = [row["val/loss"] for row in rows if "val/loss" in row]
    assert len(logged) == 1  # rank 0 alone logs

    cfg = micro_config(tmp_path / "single", *[s for s in sets if not s.startswith("model.")])
    state = ck.load(run / "checkpoints" / "ckpt_00000002.pt")
    data = open_train_data(cfg, val_store, CPU, DistInfo(), None)
    engine = _engine(cfg, data)
    engine.load_state_dict(state)  # validation evaluates the weight average
    single = validation_loss(engine, data, CPU)
    assert logged[0] == pytest.approx(single["loss"], rel=1e-5)
