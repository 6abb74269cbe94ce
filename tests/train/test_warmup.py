"""The warm-up runs steps on the real model and leaves no trace: training afterwards is bit for
bit the training without it (fresh or mid-run), dropout included."""

from __future__ import annotations

import pytest
import torch

from myxtts.data.batch import BatchShape, check_batch
from myxtts.model.dummy import worst_case_batch
from tests.helpers import micro_config
from tests.train.test_graphs import N_MELS, N_TOKENS, SHAPES, _batches, engine_for


@pytest.mark.parametrize("steps_before", [0, 3])
def test_training_after_a_warm_up_equals_training_without(tmp_path, one_thread, steps_before):
    """Dropout, scheduled sampling and frame dropout on (the random streams must be put
    back too); warm-up either before step 1 or after a few steps (AdamW state present)."""
    cfg = micro_config(tmp_path, f"audio.n_mels={N_MELS}", "model.dropout=0.1",
                       "model.frame_dropout=0.2", "train.self_feed=0.5", "train.self_feed_after=1")
    plain, warmed = engine_for(cfg), engine_for(cfg)
    torch.manual_seed(1)
    for i in range(steps_before):
        rng = torch.get_rng_state()
        plain.step(_batches(i, 1))
        torch.set_rng_state(rng)
        warmed.step(_batches(i, 1))
    rng = torch.get_rng_state()
    report = warmed.warm_up(SHAPES, warmed.task.worst_case, echo=lambda s: None)
    assert len(report.shape_seconds) == len(SHAPES)
    assert torch.equal(torch.get_rng_state(), rng)
    for i in range(steps_before, steps_before + 4):
        rng = torch.get_rng_state()
        plain.step(_batches(i, 1))
        torch.set_rng_state(rng)
        warmed.step(_batches(i, 1))
    assert plain.read() == warmed.read()
    for (name, a), b in zip(plain.model.state_dict().items(), warmed.model.state_dict().values()):
        assert torch.equal(a, b), f"{name} differs after a warm-up"
    for pa, pb in zip(plain._opt.state.values(), warmed._opt.state.values()):
        for k in pa:
            assert torch.equal(pa[k], pb[k]), f"AdamW {k} differs after a warm-up"


def test_a_trial_restores_in_place(tmp_path, one_thread):
    """Restoring writes into the live tensors (a captured graph keeps pointing at them)."""
    cfg = micro_config(tmp_path, f"audio.n_mels={N_MELS}")
    engine = engine_for(cfg)
    engine.step(_batches(0, 1))
    params = [p.data_ptr() for p in engine.model.parameters()]
    before = [p.clone() for p in engine.model.parameters()]
    with engine.trial():
        engine.run(_batches(1, 1))
        assert any(not torch.equal(a, b) for a, b in zip(before, engine.model.parameters()))
    assert [p.data_ptr() for p in engine.model.parameters()] == params
    assert all(torch.equal(a, b) for a, b in zip(before, engine.model.parameters()))


def test_the_worst_case_batch_fills_its_shape():
    shape = BatchShape(3, 16, 48, 12, N_MELS)
    batch = worst_case_batch(shape, N_TOKENS, 2, "cpu")
    assert check_batch(batch) == shape
    assert batch["mel_lengths"].tolist() == [48] * 3 and batch["token_lengths"].tolist() == [16] * 3
    assert batch["ref_lengths"].tolist() == [12] * 3 and int(batch["tokens"].min()) >= 4
    again = worst_case_batch(shape, N_TOKENS, 2, "cpu")
    assert all(torch.equal(batch[k], again[k]) for k in batch)  # private, fixed generator


def test_a_bucket_that_does_not_fit_stops_before_step_1_naming_it(tmp_path, one_thread,
                                                                   monkeypatch):
    from myxtts.train.errors import TrainError

    cfg = micro_config(tmp_path, f"audio.n_mels={N_MELS}", "data.batch_frames=3000")
    engine = engine_for(cfg)

    def micro(batch, n_micro, last=True):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB")

    monkeypatch.setattr(engine, "_micro", micro)
    with pytest.raises(TrainError, match=r"out of GPU memory before step 1 .*\(2 x 48 frames, "
                                         r"text 16, .*data.batch_frames=3000\); lower --batch-frames"):
        engine.warm_up(SHAPES, engine.task.worst_case, echo=lambda s: None)


def test_fragmentation_is_each_shapes_own_not_the_cache_a_heavier_one_left(monkeypatch):
    """The warm-up's first pass runs the longest shape first. The reserved memory beyond
    allocated at a shape's peak is measured after releasing the cache, so the blocks the
    heavier shape left cached are not counted as the lighter one's fragmentation (which
    would shrink batches or drop graphs for nothing). Modelled allocator: a shape needs
    its peak plus its own slack reserved; freed blocks stay cached until released."""
    from types import SimpleNamespace

    from myxtts.train.engine import warmup

    class Allocator:
        needs = {4: (100, 10), 2: (20, 5)}  # batch -> (peak allocated, its own slack)

        def __init__(self) -> None:
            self.cached = self.peak_allocated = self.peak_reserved = 0

        def run(self, batches) -> None:
            allocated, slack = self.needs[int(batches[0]["mel"].shape[0])]
            self.peak_allocated = max(self.peak_allocated, allocated)
            self.cached = max(self.cached, allocated + slack)  # cached blocks are reused
            self.peak_reserved = max(self.peak_reserved, self.cached)

        def reset_peak(self, device=None) -> None:
            self.peak_allocated, self.peak_reserved = 0, self.cached

    memory = Allocator()
    for name, value in {"reset_peak_memory_stats": memory.reset_peak,
                        "synchronize": lambda device=None: None,
                        "empty_cache": lambda: setattr(memory, "cached", 0),
                        "max_memory_allocated": lambda device=None: memory.peak_allocated,
                        "max_memory_reserved": lambda device=None: memory.peak_reserved}.items():
        monkeypatch.setattr(torch.cuda, name, value)
    step = SimpleNamespace(device=torch.device("cuda"), run=memory.run,
                           cfg=SimpleNamespace(train=SimpleNamespace(grad_accum_steps=1)))
    heavy, light = BatchShape(4, 16, 48, 12, N_MELS), BatchShape(2, 16, 24, 12, N_MELS)
    on_cpu = lambda shape, device: worst_case_batch(shape, N_TOKENS, 1, "cpu")  # noqa: E731
    assert warmup._run_worst_case(step, heavy, on_cpu) == (100, 10)
    assert warmup._run_worst_case(step, light, on_cpu) == (20, 5)  # not 110 - 20
