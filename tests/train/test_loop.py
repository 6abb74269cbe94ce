"""The training loop on a micro model: exact resume, signals, stopping, DDP, samples."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.artifacts.runs import CheckpointManager
from myxtts.train.engine import TTSTask
from myxtts.train.errors import TrainError
from myxtts.train.tts import oom_message, train
from tests.helpers import MICRO_MODEL, micro_config, train_crashing_at


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return ck.load(CheckpointManager(run / "checkpoints", 10).latest())[ck.MODEL]


def _losses(run: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


def _val(run: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["val/loss"] for r in rows if "val/loss" in r}


@pytest.mark.parametrize("self_feed, ema", [(0.0, 0.0), (0.5, 0.0), (0.0, 0.9)])
@pytest.mark.slow
def test_crashed_and_resumed_run_equals_uninterrupted(micro_store, tmp_path, self_feed, ema):
    # 10 steps cross an epoch boundary (the micro store has ~7 batches per epoch); with
    # scheduled sampling on, its random choices must resume exactly too; with a weight
    # average, the average (and the validation that uses it) too.
    overrides = ("train.max_steps=10", "train.ckpt_every=3", "train.val_every=5",
                 f"train.self_feed={self_feed}", "train.self_feed_after=2",
                 f"train.ema_decay={ema}")
    assert train(micro_config(tmp_path / "full", *overrides), micro_store, progress=False).step == 10

    with pytest.raises(RuntimeError, match="simulated crash"):
        train_crashing_at(micro_config(tmp_path / "part", *overrides), micro_store, call=8)
    # the newest checkpoint is step 6 (epoch 0, 6 batches in); the same command continues
    saved = ck.TrainingProgress.from_state_dict(
        ck.load(CheckpointManager(tmp_path / "part" / "checkpoints", 1).latest())[ck.PROGRESS])
    assert (saved.step, saved.epoch, saved.batches_consumed) == (6, 0, 6)
    assert train(micro_config(tmp_path / "part", *overrides), micro_store, progress=False).step == 10
    a, b = _weights(tmp_path / "full"), _weights(tmp_path / "part")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs after resume"
    la, lb = _losses(tmp_path / "full"), _losses(tmp_path / "part")
    for step in (8, 10):
        assert la[step] == lb[step]
    if ema:
        ea, eb = (ck.load(CheckpointManager(r / "checkpoints", 10).latest())[ck.EMA]
                  for r in (tmp_path / "full", tmp_path / "part"))
        assert torch.equal(ea["updates"], eb["updates"]) and int(ea["updates"]) == 10
        for k in ea["weights"]:
            assert torch.equal(ea["weights"][k], eb["weights"][k]), f"average of {k} differs"
        va, vb = (_val(r) for r in (tmp_path / "full", tmp_path / "part"))
        assert va[10] == vb[10]


@pytest.mark.slow
def test_checkpoint_at_the_end_of_an_epoch_resumes_into_the_next(micro_store, tmp_path):
    # a checkpoint taken right after an epoch's last batch records position == batches/epoch;
    # resuming must start the next epoch (CI once saw SIGINT land exactly there)
    from myxtts.train.data import open_train_data
    from myxtts.train.distributed import DistInfo

    per_epoch = len(open_train_data(micro_config(tmp_path / "probe"), micro_store,
                                    torch.device("cpu"), DistInfo(), None).sampler)
    overrides = (f"train.max_steps={per_epoch + 2}", f"train.ckpt_every={per_epoch}",
                 "train.val_every=1000")
    train(micro_config(tmp_path / "full", *overrides), micro_store, progress=False)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train_crashing_at(micro_config(tmp_path / "part", *overrides), micro_store, call=per_epoch + 1)
    saved = ck.TrainingProgress.from_state_dict(
        ck.load(CheckpointManager(tmp_path / "part" / "checkpoints", 1).latest())[ck.PROGRESS])
    assert (saved.step, saved.batches_consumed) == (per_epoch, per_epoch)
    assert train(micro_config(tmp_path / "part", *overrides), micro_store,
                 progress=False).step == per_epoch + 2
    a, b = _weights(tmp_path / "full"), _weights(tmp_path / "part")
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs after resume"


@pytest.mark.slow
def test_store_workers_train_what_the_training_process_alone_trains(micro_store, tmp_path):
    # Two workers hand their batches over in shared slots (no copy on a CPU run, a slot back
    # to its worker once its batch is dropped), several to a task, on one stream across
    # epochs; gradient accumulation holds two batches per step. 10 steps cross epoch ends
    # and a crash-and-resume restarts the stream mid-epoch: weights and losses must be bit
    # for bit those of the training process building every batch itself.
    overrides = ("train.max_steps=10", "train.ckpt_every=3", "train.val_every=5",
                 "train.grad_accum_steps=2")
    train(micro_config(tmp_path / "alone", *overrides), micro_store, progress=False)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train_crashing_at(micro_config(tmp_path / "workers", *overrides, "data.num_workers=2"),
                          micro_store, call=8)
    train(micro_config(tmp_path / "workers", *overrides, "data.num_workers=2"), micro_store,
          progress=False)
    a, b = _weights(tmp_path / "alone"), _weights(tmp_path / "workers")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    la, lb = _losses(tmp_path / "alone"), _losses(tmp_path / "workers")
    assert la == lb and len(la) >= 4


@pytest.mark.slow
def test_sigint_saves_a_checkpoint_and_the_same_command_continues(micro_store, tmp_path):
    run = tmp_path / "sig"
    cmd = [sys.executable, "-m", "myxtts.cli.main", "train", str(micro_store), "--quiet",
           "--output-dir", str(run), "--max-steps", "400", "--set", "train.ckpt_every=1000",
           "--set", "train.val_every=1000"]
    for item in [*MICRO_MODEL, "data.batch_frames=1200", "data.num_workers=0",
                 "train.tensorboard=false", "train.log_every=2", "train.synth_every=0", "train.device=cpu"]:
        cmd += ["--set", item]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = run / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.is_file() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.2)
    assert proc.poll() is None, f"the trainer ended before the interrupt: {proc.communicate()[0]}"
    assert metrics.is_file() and metrics.read_text().count("\n") >= 2, "no metrics within 120 s"
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    saved = CheckpointManager(run / "checkpoints", 1).latest()
    assert saved is not None, out
    step = ck.load(saved)[ck.PROGRESS]["step"]
    assert 4 <= step < 400
    # re-running the same command (with a smaller budget) resumes instead of starting over
    again = subprocess.run([*cmd[:cmd.index("--max-steps") + 1], str(step + 2),
                            *cmd[cmd.index("--max-steps") + 2:]],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"trained to step {step + 2}" in again.stdout


def test_too_many_nonfinite_steps_stop_the_run(micro_store, tmp_path, monkeypatch):
    import myxtts.train.engine.task as task_module

    real = task_module.compute_losses

    def diverged(*args, **kwargs):  # every step's loss overflows
        return {k: v * float("nan") for k, v in real(*args, **kwargs).items()}

    monkeypatch.setattr(task_module, "compute_losses", diverged)
    cfg = micro_config(tmp_path / "nan", "train.max_steps=20", "train.max_nonfinite_in_row=3")
    with pytest.raises(TrainError, match="consecutive steps had a non-finite loss"):
        train(cfg, micro_store, progress=False)


def test_oom_message_names_batch_and_fix():
    from myxtts.config import load_config

    cfg = load_config(overrides=["data.batch_frames=20000"])
    batch = {"mel": torch.zeros(12, 800, 80), "tokens": torch.zeros(12, 96, dtype=torch.long)}
    msg = oom_message([batch], cfg, TTSTask(cfg, 40, 1))
    assert "12 utterances x 800 frames" in msg and "--batch-frames 14000" in msg


def _torchrun(store: Path, run: Path, steps: int, port: int) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           f"--master_port={port}", "-m", "myxtts.cli.main", "train", str(store), "--quiet",
           "--output-dir", str(run), "--max-steps", str(steps)]
    for item in [*MICRO_MODEL, "data.batch_frames=1200", "data.num_workers=0",
                 "train.tensorboard=false", "train.log_every=3", "train.synth_every=0",
                 "train.device=cpu", "train.val_every=6", "train.ckpt_every=3"]:
        cmd += ["--set", item]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stdout.count(f"trained to step {steps}") == 2  # both ranks reached the same step
    return r


@pytest.mark.slow
def test_torchrun_two_ranks_train_in_step_and_resume_exactly(micro_store, tmp_path):
    """DDP on CPU (gloo): both ranks take the same steps, rank 0 checkpoints, and a run
    stopped at step 3 and resumed ends with the uninterrupted run's weights -- which needs
    each rank's own dropout streams back (the micro model trains with dropout)."""
    _torchrun(micro_store, tmp_path / "full", 6, 29533)
    state = ck.load(tmp_path / "full" / "checkpoints" / "ckpt_00000006.pt")
    assert state[ck.PROGRESS]["data_plan"]["world_size"] == 2
    assert len(state[ck.RNG_RANKS]) == 2
    assert not torch.equal(state[ck.RNG_RANKS][0]["torch"], state[ck.RNG_RANKS][1]["torch"])

    _torchrun(micro_store, tmp_path / "part", 3, 29534)
    _torchrun(micro_store, tmp_path / "part", 6, 29535)
    a, b = _weights(tmp_path / "full"), _weights(tmp_path / "part")
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs after a DDP resume"


def test_free_running_samples_are_written_and_scored(micro_store, tmp_path):
    """synth_every: wavs of fixed validation sentences, plus their length ratio and DTW mel
    distance to the ground truth in the metrics log."""
    import math

    import soundfile as sf

    cfg = micro_config(tmp_path / "run", "train.max_steps=4", "train.synth_every=4",
                       "train.synth_sentences=2", "model.max_decoder_frames=60")
    train(cfg, micro_store, progress=False)
    wavs = sorted((tmp_path / "run" / "samples" / "step_00000004").glob("val*.wav"))
    assert len(wavs) == 2
    for w in wavs:
        info = sf.info(str(w))
        assert info.samplerate == cfg.audio.sample_rate and 0 < info.frames <= 60 * cfg.audio.hop_length
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    synth = {k: v for r in rows for k, v in r.items() if k.startswith("synth/")}
    for i in range(2):
        assert 0 < synth[f"synth/length_ratio_{i}"] and math.isfinite(synth[f"synth/dtw_l1_{i}"])
        assert synth[f"synth/dtw_l1_{i}"] > 0  # an untrained model is far from the truth
