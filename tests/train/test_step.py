"""The engine's step: skips non-finite steps on the device, accumulates exactly, self-feeds in
training only; its trial steps leave no trace."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from myxtts.model.dummy import random_batch
from myxtts.model.xtts import build_model
from myxtts.train.distributed import DistInfo
from myxtts.train.engine import TrainEngine
from myxtts.train.engine.optim import self_feed_probability
from tests.helpers import micro_config

CPU = torch.device("cpu")


def _engine(cfg, model) -> TrainEngine:
    return TrainEngine(cfg, model, CPU, DistInfo(), compile_model=False)


def test_self_feed_ramps_up_after_teacher_forcing_steps():
    cfg = micro_config(Path("unused"), "train.self_feed=0.6", "train.self_feed_after=100")
    got = [self_feed_probability(s, cfg.train) for s in (0, 100, 150, 200, 5000)]
    assert got == pytest.approx([0.0, 0.0, 0.3, 0.6, 0.6])
    off = micro_config(Path("unused")).train
    assert self_feed_probability(5000, off) == 0.0  # off by default


def test_self_feed_is_training_only_validation_stays_teacher_forced(tmp_path):
    """The step feeds the model its own predictions while training; validation losses stay
    pure teacher forcing (deterministic and comparable across a run)."""
    from myxtts.model.dummy import randomize_weights

    cfg = micro_config(tmp_path, "train.self_feed=1.0", "train.self_feed_after=0",
                       "model.dropout=0.0", "model.prenet_dropout=0.0", "audio.n_mels=16")
    torch.manual_seed(0)
    model = build_model(cfg, 30, len(cfg.text.languages), None, None)
    engine = _engine(cfg, model)
    randomize_weights(model, 0)  # an untrained model's outputs barely depend on its inputs
    assert self_feed_probability(5, cfg.train) == 1.0
    engine._self_feed.fill_(1.0)  # (what a step at 5 sets)
    batch = random_batch(16, 30, [5, 9], [11, 23], [6, 12], n_languages=len(cfg.text.languages))
    model.eval()
    a, b = engine.loss(batch), engine.loss(batch)
    assert torch.equal(a["loss"], b["loss"])
    assert torch.equal(a["loss"], compute_losses_of(model, batch, cfg))  # == plain teacher forcing
    model.train()
    assert not torch.allclose(engine.loss(batch)["mel_l1"], a["mel_l1"])  # own predictions fed


def compute_losses_of(model, batch, cfg):
    from myxtts.model.losses import compute_losses

    return compute_losses(model(batch), batch, cfg.train)["loss"]


def test_nonfinite_steps_are_skipped_on_device_and_counted(micro_store, tmp_path):
    from myxtts.data.feed.loader import build_loader

    cfg = micro_config(tmp_path, "train.max_steps=10")
    loader, _ = build_loader(micro_store, cfg)
    batch = next(iter(loader))
    torch.manual_seed(0)
    model = build_model(cfg, 64, 1, None, None)
    engine = _engine(cfg, model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    poisoned = dict(batch, mel=batch["mel"].clone())
    poisoned["mel"][0, 0, 0] = float("nan")
    engine.step([poisoned])
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), f"{k} changed on a non-finite step"
    engine.step([batch])
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())
    values = engine.read()
    assert values["nonfinite_steps"] == 1.0 and values["nonfinite_run_peak"] == 1.0
    assert engine.nonfinite_counts() == (1, 0)


def test_gradient_accumulation_sums_micro_batches(micro_store, tmp_path):
    from myxtts.data.feed.loader import build_loader
    from myxtts.model.losses import compute_losses

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
    engine = _engine(cfg, model)
    grads = {}
    hooks = [p.register_post_accumulate_grad_hook(lambda p, n=n: grads.__setitem__(n, p.grad.clone()))
             for n, p in model.named_parameters()]
    engine.step([b1, b2])
    for h in hooks:
        h.remove()
    for n, g in expected.items():
        torch.testing.assert_close(grads[n], g, rtol=1e-4, atol=1e-6)


def test_accumulating_two_halves_equals_one_step_on_the_whole_batch(tmp_path, one_thread):
    """grad_accum_steps=2 over the two halves of a batch (equal real frames, text and
    reference lengths, so each half's frame-weighted mean weighs the same) is one step on
    the whole batch: the same gradients reach the optimizer and the same losses and gradient
    norm are read back. (Weights after AdamW are not compared: a parameter whose gradient is
    ~0, like an attention key bias, moves by +-lr on rounding noise alone.)"""
    n_mels, n_tokens = 80, 40
    lengths = dict(token_lengths=[9, 7, 9, 7], mel_lengths=[30, 22, 30, 22], ref_lengths=[16, 12, 16, 12])
    whole = random_batch(n_mels, n_tokens, **lengths, n_frames=32, n_text=16, seed=3)
    halves = [{k: v[:2] for k, v in whole.items()}, {k: v[2:] for k, v in whole.items()}]
    common = ("model.dropout=0", "model.prenet_dropout=0", "train.warmup_steps=0", "train.grad_clip=0")
    cfg_big = micro_config(tmp_path, *common)
    cfg_acc = micro_config(tmp_path, *common, "train.grad_accum_steps=2")
    torch.manual_seed(0)
    models = {"big": build_model(cfg_big, n_tokens, 1, None, None),
              "acc": build_model(cfg_acc, n_tokens, 1, None, None)}
    models["acc"].load_state_dict(models["big"].state_dict())
    grads: dict[str, dict[str, torch.Tensor]] = {"big": {}, "acc": {}}
    for key, model in models.items():  # the gradient the optimizer sees (after the last backward)
        for n, prm in model.named_parameters():
            prm.register_post_accumulate_grad_hook(
                lambda prm, n=n, key=key: grads[key].__setitem__(n, prm.grad.clone()))
    big, acc = _engine(cfg_big, models["big"]), _engine(cfg_acc, models["acc"])
    big.step([whole])
    acc.step(halves)
    read_big, read_acc = big.read(), acc.read()
    for key in ("loss", "mel_l1", "post_l1", "stop", "guided", "grad_norm"):
        assert read_acc[key] == pytest.approx(read_big[key], rel=1e-5), key
    assert grads["acc"].keys() == grads["big"].keys() and grads["big"]
    for n, g in grads["big"].items():
        torch.testing.assert_close(grads["acc"][n], g, rtol=1e-4, atol=1e-7, msg=f"{n} differs")


def test_nonfinite_counts_continue_after_a_restart(tmp_path, one_thread):
    """What a checkpoint records of the non-finite counters (its own entry) is what a
    restarted engine continues from: the total, the row, and the row's peak in the next
    read."""
    from myxtts.artifacts import checkpoint as ck

    cfg = micro_config(tmp_path, "audio.n_mels=80")
    engine = _engine(cfg, build_model(cfg, 40, 1, None, None))
    state = engine.state_dict()
    assert state[ck.NONFINITE] == {"steps": 0, "in_row": 0}
    engine.load_state_dict({**state, ck.NONFINITE: {"steps": 5, "in_row": 2}})
    assert engine.nonfinite_counts() == (5, 2) and engine.read() == {}
    engine.step([random_batch(80, 40, [9, 7], [30, 22], [16, 12], seed=1)])  # a finite step
    values = engine.read()
    assert (values["nonfinite_steps"], values["nonfinite_run_peak"]) == (5.0, 2.0)
    assert engine.nonfinite_counts() == (5, 0)
    assert engine.state_dict()[ck.NONFINITE] == {"steps": 5, "in_row": 0}


def test_a_trial_puts_the_accumulators_back_in_place(tmp_path, one_thread):
    """What the warm-up and the memory probe rely on: steps taken inside a trial leave no
    trace in what is read back afterwards, and the live tensors stay where they are."""
    cfg = micro_config(tmp_path, "train.self_feed=0.5", "train.self_feed_after=1")
    batch = random_batch(80, 40, [9, 7], [30, 22], [16, 12], seed=1)
    torch.manual_seed(0)
    model = build_model(cfg, 40, 1, None, None)
    twin = build_model(cfg, 40, 1, None, None)
    twin.load_state_dict(model.state_dict())
    engine, plain = _engine(cfg, model), _engine(cfg, twin)
    for e in (engine, plain):
        torch.manual_seed(1)
        e.step([batch])
    totals = engine._totals
    where = [t.data_ptr() for t in (*totals._sums.values(), *totals._counters(),
                                    engine._self_feed)]
    with engine.trial():
        engine.run([batch, batch])  # what a warm-up runs (no schedule step)
        engine._self_feed.fill_(0.9)
        totals.load_nonfinite_counts(7, 3)
        assert engine.read() != {}  # the read itself clears the sums: the trial refills them
    assert [t.data_ptr() for t in (*totals._sums.values(), *totals._counters(),
                                   engine._self_feed)] == where
    assert engine.nonfinite_counts() == plain.nonfinite_counts() == (0, 0)
    assert torch.equal(engine._self_feed, plain._self_feed)
    assert engine.read() == plain.read()


def test_a_trial_runs_the_raw_module_and_puts_the_wrapper_back(tmp_path, monkeypatch):
    import myxtts.train.engine.engine as engine_module

    cfg = micro_config(tmp_path)
    model = build_model(cfg, 40, 1, None, None)
    wrapper = torch.nn.Sequential(model)  # stands in for DistributedDataParallel
    monkeypatch.setattr(engine_module, "wrap_ddp", lambda module, dist: wrapper)
    engine = _engine(cfg, model)
    assert engine._runner is wrapper
    with engine.trial():
        assert engine._runner is model
    assert engine._runner is wrapper
    with pytest.raises(RuntimeError), engine.trial():
        raise RuntimeError("a failed warm-up")
    assert engine._runner is wrapper


def test_the_mode_is_planned_in_one_place(tmp_path):
    from myxtts.config import ConfigError
    from myxtts.train.engine.mode import StepMode, StepPlan, plan_step

    cpu = torch.device("cpu")
    assert plan_step(micro_config(tmp_path), cpu, False, True) == StepPlan(False, False)
    assert plan_step(micro_config(tmp_path, "train.compile=on"), cpu, False, True).mode == "compiled"
    with pytest.raises(ConfigError, match="train.cuda_graphs=on but training runs on cpu"):
        plan_step(micro_config(tmp_path, "train.cuda_graphs=on"), cpu, False, True)
    assert [StepMode.of(c, g) for c, g in [(False, False), (True, False), (True, True), (False, True)]] \
        == ["eager", "compiled", "graphed", "graphed"]
    assert StepPlan(compile=True, graphs=True).mode is StepMode.GRAPHED
    engine = _engine(micro_config(tmp_path), build_model(micro_config(tmp_path), 40, 1, None, None))
    assert engine.mode is StepMode.EAGER and f"{engine.mode} step" == "eager step"


def test_checkpointed_blocks_with_dropout_are_captured_only_uncompiled(tmp_path, monkeypatch):
    """The plan for a GPU (planned on any machine: nothing here touches CUDA): compiled blocks
    draw recomputed dropout from generators a capture does not record, so with activation
    checkpointing, dropout and graphs the blocks run eagerly; before torch 2.10 a capture
    cannot rewind the generator at all, so the step is not captured."""
    import myxtts.train.engine.mode as mode
    from myxtts.config import ConfigError
    from myxtts.train.engine.mode import StepPlan, plan_step

    gpu = torch.device("cuda")
    sets = ["train.precision=bf16", "train.activation_checkpointing=true", "model.dropout=0.1"]
    assert plan_step(micro_config(tmp_path, *sets[:1]), gpu, False, True) == StepPlan(True, True)
    plan = plan_step(micro_config(tmp_path, *sets), gpu, False, True)
    assert (plan.compile, plan.graphs) == (False, True) and "train.cuda_graphs=off" in plan.note
    no_dropout = plan_step(micro_config(tmp_path, *sets[:2], "model.dropout=0"), gpu, False, True)
    assert no_dropout == StepPlan(True, True)  # nothing random is recomputed
    off = plan_step(micro_config(tmp_path, *sets, "train.cuda_graphs=off"), gpu, False, True)
    assert off == StepPlan(True, False)
    monkeypatch.setattr(mode, "torch_version", lambda: (2, 9))
    old = plan_step(micro_config(tmp_path, *sets), gpu, False, True)
    assert (old.compile, old.graphs) == (True, False) and "torch >= 2.10" in old.note
    with pytest.raises(ConfigError, match="needs torch >= 2.10"):
        plan_step(micro_config(tmp_path, *sets, "train.cuda_graphs=on"), gpu, False, True)
