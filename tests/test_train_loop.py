"""Trainer mechanics on a micro model: exact resume, checkpoints, signals, skips, accumulation."""

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

from conftest import micro_config
from myxtts.train import checkpoint as ck
from myxtts.train.errors import TrainError
from myxtts.train.loop import _oom_message, train


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return ck.load(ck.CheckpointManager(run / "checkpoints", 10).latest())[ck.MODEL]


def _losses(run: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


@pytest.mark.parametrize("self_feed", [0.0, 0.5])
def test_crashed_and_resumed_run_equals_uninterrupted(micro_store, tmp_path, monkeypatch, self_feed):
    # 10 steps cross an epoch boundary (the micro store has ~7 batches per epoch); with
    # scheduled sampling on, its random choices must resume exactly too.
    overrides = ("train.max_steps=10", "train.ckpt_every=3", "train.val_every=5",
                 f"train.self_feed={self_feed}", "train.self_feed_after=2")
    assert train(micro_config(tmp_path / "full", *overrides), micro_store, progress=False).step == 10

    from myxtts.train.step import TrainStep

    real_call, calls = TrainStep.__call__, []

    def crash_on_8th(self, batches):
        calls.append(1)
        if len(calls) == 8:
            raise RuntimeError("simulated crash")
        return real_call(self, batches)

    monkeypatch.setattr(TrainStep, "__call__", crash_on_8th)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(micro_config(tmp_path / "part", *overrides), micro_store, progress=False)
    monkeypatch.setattr(TrainStep, "__call__", real_call)
    # the newest checkpoint is step 6; the same command continues from it
    assert ck.load(ck.CheckpointManager(tmp_path / "part" / "checkpoints", 1).latest())[ck.STEP] == 6
    assert train(micro_config(tmp_path / "part", *overrides), micro_store, progress=False).step == 10
    a, b = _weights(tmp_path / "full"), _weights(tmp_path / "part")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs after resume"
    la, lb = _losses(tmp_path / "full"), _losses(tmp_path / "part")
    for step in (8, 10):
        assert la[step] == lb[step]


def test_self_feed_ramps_up_after_teacher_forcing_steps():
    from myxtts.train.step import TrainStep

    cfg = micro_config(Path("unused"), "train.self_feed=0.6", "train.self_feed_after=100")
    probe = TrainStep.__new__(TrainStep)
    probe.cfg = cfg
    got = [probe.self_feed_probability(s) for s in (0, 100, 150, 200, 5000)]
    assert got == pytest.approx([0.0, 0.0, 0.3, 0.6, 0.6])
    probe.cfg = micro_config(Path("unused"))
    assert probe.self_feed_probability(5000) == 0.0  # off by default


def test_self_feed_is_training_only_validation_stays_teacher_forced(tmp_path):
    """The step feeds the model its own predictions while training; validation losses stay
    pure teacher forcing (deterministic and comparable across a run)."""
    from myxtts.model.dummy import random_batch, randomize_weights
    from myxtts.model.xtts import build_model
    from myxtts.train.optim import build_optimizer, build_scheduler
    from myxtts.train.step import TrainStep

    cfg = micro_config(tmp_path, "train.self_feed=1.0", "train.self_feed_after=0",
                       "model.dropout=0.0", "model.prenet_dropout=0.0", "audio.n_mels=16")
    torch.manual_seed(0)
    model = build_model(cfg, 30, len(cfg.text.languages), None, None)
    opt, fused = build_optimizer(model, cfg.train)
    step = TrainStep(model, opt, build_scheduler(opt, cfg.train), cfg, torch.device("cpu"), fused,
                     compile_model=False)
    randomize_weights(model, 0)  # an untrained model's outputs barely depend on its inputs
    assert step.self_feed_probability(5) == 1.0
    step.self_feed.fill_(1.0)
    batch = random_batch(16, 30, [5, 9], [11, 23], [6, 12], n_languages=len(cfg.text.languages))
    model.eval()
    a, b = step.loss(batch), step.loss(batch)
    assert torch.equal(a["loss"], b["loss"])
    assert torch.equal(a["loss"], compute_losses_of(model, batch, cfg))  # == plain teacher forcing
    model.train()
    assert not torch.allclose(step.loss(batch)["mel_l1"], a["mel_l1"])  # own predictions fed


def compute_losses_of(model, batch, cfg):
    from myxtts.model.losses import compute_losses

    return compute_losses(model(batch), batch, cfg.train)["loss"]


def test_checkpoint_contents_and_retention(micro_store, tmp_path):
    cfg = micro_config(tmp_path / "run", "train.max_steps=12", "train.keep_last=2")
    train(cfg, micro_store, progress=False)
    ckdir = tmp_path / "run" / "checkpoints"
    kept = sorted(p.name for p in ckdir.glob("ckpt_*.pt"))
    assert kept == ["ckpt_00000008.pt", "ckpt_00000012.pt"]
    assert (ckdir / "best.pt").is_file() and (ckdir / "latest.txt").read_text() == "ckpt_00000012.pt"
    state = ck.load(ckdir / "ckpt_00000012.pt")
    for key in (ck.MODEL, ck.OPTIMIZER, ck.SCHEDULER, ck.SCALER, ck.SAMPLER, ck.RNG, ck.STEP,
                ck.CONFIG, ck.VOCAB, ck.MEL_MEAN, ck.MEL_STD, ck.BEST_VAL):
        assert key in state
    assert state[ck.STEP] == 12 and state[ck.CONFIG]["train"]["keep_last"] == 2
    assert (tmp_path / "run" / "config.yaml").is_file() and (tmp_path / "run" / "vocab.json").is_file()


def test_corrupt_checkpoint_is_a_clear_error(tmp_path):
    bad = tmp_path / "ckpt_00000001.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(TrainError, match="cannot be read"):
        ck.load(bad)


def test_checkpoint_refuses_pickled_objects(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    path = tmp_path / "evil.pt"
    torch.save({ck.FORMAT: ck.FORMAT_VERSION, "x": Evil()}, path)
    with pytest.raises(TrainError):
        ck.load(path)


def test_sigint_saves_a_checkpoint_and_the_same_command_continues(micro_store, tmp_path):
    run = tmp_path / "sig"
    cmd = [sys.executable, "-m", "myxtts.cli.main", "train", str(micro_store), "--quiet",
           "--output-dir", str(run), "--max-steps", "400", "--set", "train.ckpt_every=1000",
           "--set", "train.val_every=1000"]
    for item in ["model.d_model=32", "model.n_heads=2", "model.text_layers=1",
                 "model.decoder_layers=1", "model.cond_layers=1", "model.cond_latents=4",
                 "model.prenet_dim=32", "model.postnet_channels=32", "model.postnet_layers=2",
                 "data.batch_frames=1200", "data.num_workers=0", "train.tensorboard=false",
                 "train.log_every=2", "train.synth_every=0"]:
        cmd += ["--set", item]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = run / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.is_file() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    saved = ck.CheckpointManager(run / "checkpoints", 1).latest()
    assert saved is not None, out
    step = ck.load(saved)[ck.STEP]
    assert 4 <= step < 400
    # re-running the same command (with a smaller budget) resumes instead of starting over
    again = subprocess.run([*cmd[:cmd.index("--max-steps") + 1], str(step + 2),
                            *cmd[cmd.index("--max-steps") + 2:]],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"trained to step {step + 2}" in again.stdout


def test_nonfinite_steps_are_skipped_on_device_and_counted(micro_store, tmp_path):
    from myxtts.data.loader import build_loader
    from myxtts.model.xtts import build_model
    from myxtts.train.optim import build_optimizer, build_scheduler
    from myxtts.train.step import TrainStep

    cfg = micro_config(tmp_path, "train.max_steps=10")
    loader, _ = build_loader(micro_store, cfg)
    batch = next(iter(loader))
    torch.manual_seed(0)
    model = build_model(cfg, 64, 1, None, None)
    opt, fused = build_optimizer(model, cfg.train)
    step = TrainStep(model, opt, build_scheduler(opt, cfg.train), cfg, torch.device("cpu"),
                     fused, compile_model=False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    poisoned = dict(batch, mel=batch["mel"].clone())
    poisoned["mel"][0, 0, 0] = float("nan")
    step([poisoned])
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), f"{k} changed on a non-finite step"
    step([batch])
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())
    values = step.read()
    assert values["nonfinite_steps"] == 1.0 and values["nonfinite_run_peak"] == 1.0


def test_too_many_nonfinite_steps_stop_the_run(micro_store, tmp_path):
    cfg = micro_config(tmp_path / "nan", "train.max_steps=20", "train.lr=1e30",
                       "train.warmup_steps=0", "train.max_nonfinite_in_row=3", "train.grad_clip=0")
    with pytest.raises(TrainError, match="consecutive steps had a non-finite loss"):
        train(cfg, micro_store, progress=False)


def test_gradient_accumulation_sums_micro_batches(micro_store, tmp_path):
    from myxtts.data.loader import build_loader
    from myxtts.model.losses import compute_losses
    from myxtts.model.xtts import build_model
    from myxtts.train.optim import build_optimizer, build_scheduler
    from myxtts.train.step import TrainStep

    cfg = micro_config(tmp_path, "train.grad_accum_steps=2", "train.grad_clip=0",
                       "model.dropout=0", "model.prenet_dropout=0")
    loader, _ = build_loader(micro_store, cfg)
    it = iter(loader)
    b1, b2 = next(it), next(it)
    torch.manual_seed(0)
    model = build_model(cfg, 64, 1, None, None)
    ref = build_model(cfg, 64, 1, None, None)
    ref.load_state_dict(model.state_dict())
    loss = sum(compute_losses(ref(b), b, cfg.train)["loss"] for b in (b1, b2)) / 2
    loss.backward()
    expected = {n: p.grad.clone() for n, p in ref.named_parameters() if p.grad is not None}
    opt, fused = build_optimizer(model, cfg.train)
    step = TrainStep(model, opt, build_scheduler(opt, cfg.train), cfg, torch.device("cpu"),
                     fused, compile_model=False)
    grads = {}
    hooks = [p.register_post_accumulate_grad_hook(lambda p, n=n: grads.__setitem__(n, p.grad.clone()))
             for n, p in model.named_parameters()]
    step([b1, b2])
    for h in hooks:
        h.remove()
    for n, g in expected.items():
        torch.testing.assert_close(grads[n], g, rtol=1e-4, atol=1e-6)


def test_oom_message_names_batch_and_fix():
    from myxtts.config import load_config

    cfg = load_config(overrides=["data.batch_frames=20000"])
    batch = {"mel": torch.zeros(12, 800, 80), "tokens": torch.zeros(12, 96, dtype=torch.long)}
    msg = _oom_message([batch], cfg)
    assert "12 utterances x 800 frames" in msg and "--batch-frames 14000" in msg


def test_torchrun_two_ranks_train_in_step(micro_store, tmp_path):
    """DDP on CPU (gloo): both ranks take the same number of steps and rank 0 checkpoints."""
    run = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29533",
           "-m", "myxtts.cli.main", "train", str(micro_store), "--quiet", "--output-dir", str(run),
           "--max-steps", "6"]
    for item in ["model.d_model=32", "model.n_heads=2", "model.text_layers=1",
                 "model.decoder_layers=1", "model.cond_layers=1", "model.cond_latents=4",
                 "model.prenet_dim=32", "model.postnet_channels=32", "model.postnet_layers=2",
                 "data.batch_frames=1200", "data.num_workers=0", "train.tensorboard=false",
                 "train.log_every=2", "train.synth_every=0", "train.val_every=6", "train.ckpt_every=6"]:
        cmd += ["--set", item]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stdout.count("trained to step 6") == 2  # both ranks reached the same step
    state = ck.load(run / "checkpoints" / "ckpt_00000006.pt")
    assert state[ck.SAMPLER]["world_size"] == 2


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
