"""The weights' moving average (train.ema_decay): its arithmetic, the skip flag, that it
never changes training, checkpoints, validation and synthesis with and without it."""

from __future__ import annotations

import pytest
import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.artifacts.averaged import averaged_state
from myxtts.config import ConfigError
from myxtts.model.xtts import build_model
from myxtts.train.distributed import DistInfo
from myxtts.train.engine import TrainEngine
from myxtts.train.engine.ema import WeightAverage
from tests.helpers import micro_config
from tests.train.test_graphs import N_TOKENS, _batches

CPU = torch.device("cpu")


def _engine(tmp_path, *overrides) -> TrainEngine:
    cfg = micro_config(tmp_path, "audio.n_mels=16", "model.dropout=0", "model.prenet_dropout=0",
                       *overrides)
    torch.manual_seed(0)
    return TrainEngine(cfg, build_model(cfg, N_TOKENS, 1, None, None), CPU, DistInfo(),
                       compile_model=False)


def test_the_average_follows_its_formula_and_a_skipped_step_moves_nothing():
    lin = torch.nn.Linear(3, 2)
    avg = WeightAverage(lin, 0.5)
    start = [s.clone() for s in avg.shadow]
    with torch.no_grad():
        for p in lin.parameters():
            p.add_(1.0)
    avg.update(torch.tensor(0.0))  # ramp: min(0.5, 1/10) = 0.1 -> weight 0.9
    for s0, s, p in zip(start, avg.shadow, lin.parameters()):
        torch.testing.assert_close(s, s0 + 0.9 * (p.detach() - s0))
    moved = [s.clone() for s in avg.shadow]
    with torch.no_grad():
        for p in lin.parameters():
            p.add_(1.0)
    avg.update(torch.tensor(1.0))  # skipped: no move, not counted
    assert all(torch.equal(a, b) for a, b in zip(moved, avg.shadow))
    assert float(avg.updates) == 1.0
    for _ in range(40):  # the ramp reaches the configured decay
        avg.update(torch.tensor(0.0))
    assert float(avg._weight) == pytest.approx(0.5)


def test_the_average_never_changes_training_and_skips_a_poisoned_step(tmp_path, one_thread):
    """Weights and losses of a run with the average equal those of one without, bit for
    bit (the average only reads the weights); a non-finite step moves neither."""
    plain, kept = _engine(tmp_path / "a", "train.ema_decay=0"), _engine(tmp_path / "b",
                                                                       "train.ema_decay=0.9")
    assert plain._ema is None and kept._ema is not None
    for i in range(5):
        batches = _batches(i, 1)
        if i == 3:
            batches[0]["mel"][0, 0, 0] = float("nan")
        before = [s.clone() for s in kept._ema.shadow]
        plain.step(batches)
        kept.step(batches)
        if i == 3:
            assert all(torch.equal(a, b) for a, b in zip(before, kept._ema.shadow))
    assert plain.read() == pytest.approx(kept.read(), nan_ok=True)
    for a, b in zip(plain.model.parameters(), kept.model.parameters()):
        assert torch.equal(a, b)
    assert float(kept._ema.updates) == 4.0
    assert any(not torch.equal(s, p) for s, p in zip(kept._ema.shadow, kept._ema.params))


def test_a_trial_puts_the_average_back(tmp_path, one_thread):
    engine = _engine(tmp_path, "train.ema_decay=0.9")
    engine.step(_batches(0, 1))
    saved = [s.clone() for s in engine._ema.shadow]
    with engine.trial():
        engine.run(_batches(1, 1))
    assert all(torch.equal(a, b) for a, b in zip(saved, engine._ema.shadow))
    assert float(engine._ema.updates) == 1.0


def test_validation_weights_are_swapped_in_and_back_bit_for_bit(tmp_path, one_thread):
    engine = _engine(tmp_path, "train.ema_decay=0.9")
    for i in range(3):
        engine.step(_batches(i, 1))
    raw = [p.detach().clone() for p in engine.model.parameters()]
    avg = [s.clone() for s in engine._ema.shadow]
    with engine.evaluating():
        assert all(torch.equal(p, s) for p, s in zip(engine._ema.params, avg))
    with engine.evaluating(raw_weights=True):
        assert all(torch.equal(p, r) for p, r in zip(engine.model.parameters(), raw))
    assert all(torch.equal(p, r) for p, r in zip(engine.model.parameters(), raw))
    assert all(torch.equal(s, a) for s, a in zip(engine._ema.shadow, avg))


def test_a_checkpoint_keeps_the_average_and_loads_without_pickle(tmp_path, one_thread):
    engine = _engine(tmp_path, "train.ema_decay=0.9")
    for i in range(3):
        engine.step(_batches(i, 1))
    saved = engine.state_dict()
    ck.save(tmp_path / "c.pt", ck.compose(ck.TrainingProgress(step=3), saved, {}))
    loaded = ck.load(tmp_path / "c.pt")  # weights_only=True inside
    other = _engine(tmp_path / "o", "train.ema_decay=0.9")
    other.load_state_dict(loaded)
    average = other.state_dict()[ck.EMA]
    assert float(average["updates"]) == 3.0
    assert all(torch.equal(v, saved[ck.EMA]["weights"][k]) for k, v in average["weights"].items())
    # the averaged model state: averaged parameters, the rest as saved
    merged = averaged_state(loaded[ck.MODEL], loaded[ck.EMA])
    for name, s in saved[ck.EMA]["weights"].items():
        assert torch.equal(merged[name], s)
    assert averaged_state(loaded[ck.MODEL], None) is loaded[ck.MODEL]
    # a checkpoint without an average starts one from the restored weights
    plain = {k: v for k, v in saved.items() if k != ck.EMA}
    third = _engine(tmp_path / "t", "train.ema_decay=0.9")
    third.load_state_dict(ck.compose(ck.TrainingProgress(step=3), plain, {}))
    restarted = third.state_dict()[ck.EMA]
    assert float(restarted["updates"]) == 0.0
    assert all(torch.equal(v, saved[ck.MODEL][k]) for k, v in restarted["weights"].items())


def test_a_decay_outside_its_range_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"train.ema_decay must be in \[0, 1\)"):
        micro_config(tmp_path, "train.ema_decay=1.0")


def test_validation_evaluates_the_average(micro_store, tmp_path, one_thread):
    from myxtts.train.data import open_train_data
    from myxtts.train.validation import validation_loss

    cfg = micro_config(tmp_path, "train.ema_decay=0.5")
    data = open_train_data(cfg, micro_store, CPU, DistInfo(), None)
    torch.manual_seed(0)
    model = build_model(cfg, data.vocab_size, len(data.languages), data.mel_mean, data.mel_std)
    engine = TrainEngine(cfg, model, CPU, DistInfo(), compile_model=False)
    batches = iter(data.loader)
    for _ in range(3):
        engine.step([next(batches)])
    averaged = validation_loss(engine, data, CPU)
    raw = engine.state_dict()[ck.MODEL]
    # what validation evaluates: a model (keeping no average) with the average's weights
    plain = micro_config(tmp_path, "train.ema_decay=0")
    twin = TrainEngine(plain, build_model(plain, data.vocab_size, len(data.languages),
                                          data.mel_mean, data.mel_std), CPU, DistInfo(),
                       compile_model=False)
    twin.model.load_state_dict(averaged_state(raw, engine.state_dict()[ck.EMA]))
    by_hand = validation_loss(twin, data, CPU)
    assert averaged == by_hand
    with engine.evaluating(raw_weights=True):  # ... not the raw weights
        assert all(torch.equal(p, raw[n]) for n, p in engine.model.named_parameters())
    twin.model.load_state_dict(raw)
    assert validation_loss(twin, data, CPU) != averaged
