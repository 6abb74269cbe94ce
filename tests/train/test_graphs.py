"""The graphed step, replayed the way a CUDA graph replays it (tests/train/graph_recorder.py),
equals the eager step; and the step never reads a device value on the host."""

from __future__ import annotations

import logging

import pytest
import torch

from myxtts.data.batch import BatchShape
from myxtts.model.dummy import random_batch
from myxtts.model.xtts import build_model
from myxtts.train.distributed import DistInfo
from myxtts.train.engine import TrainEngine
from tests.helpers import micro_config
from tests.train.graph_recorder import HostReadError, RecordingCapture, assert_no_host_reads

N_MELS, N_TOKENS = 16, 30
SHAPES = [BatchShape(3, 16, 24, 12, N_MELS), BatchShape(2, 16, 48, 12, N_MELS)]


def engine_for(cfg, compile_model: bool = False, backend=None) -> TrainEngine:
    """An engine on the CPU, for one process, on a model seeded alike every time."""
    torch.manual_seed(0)
    return TrainEngine(cfg, build_model(cfg, N_TOKENS, 1, None, None), torch.device("cpu"),
                       DistInfo(), compile_model=compile_model, compile_backend=backend)


def _pair(tmp_path, *overrides):
    """Two engines on identical models: one stays eager, one gets graphs."""
    cfg = micro_config(tmp_path, f"audio.n_mels={N_MELS}", "model.dropout=0",
                       "model.prenet_dropout=0", "train.warmup_steps=4", *overrides)
    return cfg, [engine_for(cfg) for _ in range(2)]


def _batches(seed: int, accum: int) -> list[dict[str, torch.Tensor]]:
    """Real-looking batches (ragged lengths) of the two shapes."""
    out = []
    for i in range(accum):
        s = SHAPES[(seed + i) % 2]
        gen = torch.Generator().manual_seed(seed * 10 + i)
        mel = torch.randint(s.frames // 2, s.frames + 1, (s.batch,), generator=gen).tolist()
        tok = torch.randint(4, s.text + 1, (s.batch,), generator=gen).tolist()
        out.append(random_batch(N_MELS, N_TOKENS, tok, mel, [s.ref_frames] * s.batch,
                                n_text=s.text, n_frames=s.frames, n_ref=s.ref_frames,
                                seed=seed * 10 + i))
    return out


@pytest.mark.parametrize("overrides", [
    (),  # plain: warmup lr schedule, clipping
    ("train.self_feed=0.5", "train.self_feed_after=2", "train.grad_accum_steps=2"),
    ("train.ema_decay=0",),  # without the weight average (the default updates it inside
                             # the update graph)
])
@pytest.mark.slow
def test_replayed_graphs_equal_the_eager_step(tmp_path, one_thread, overrides):
    """Over 8 steps with a changing learning rate (warm-up), scheduled sampling ramping up
    and gradient accumulation: the same losses read back and the same weights. A poisoned
    batch is skipped by both. The replay runs no Python of the step, so a baked-in value or
    a rebound tensor would show here."""
    cfg, (eager, graphed) = _pair(tmp_path, *overrides)
    accum = cfg.train.grad_accum_steps
    recorder = RecordingCapture()
    report = graphed.warm_up(SHAPES, graphed.task.worst_case, capture=recorder, echo=lambda s: None)
    assert report.shapes_captured == 2 and report.capture_error is None
    assert report.graphs is None and graphed.mode == "graphed"  # the engine keeps them
    assert recorder.captures == 3  # one micro graph per shape + the update
    for i in range(8):
        batches = _batches(i, accum)
        if i == 5:
            batches[0]["mel"][0, 0, 0] = float("nan")
        assert graphed._graphs.ready(batches)
        rng = torch.get_rng_state()  # both draw the same self-feed choices
        eager.step(batches)
        torch.set_rng_state(rng)
        graphed.step(batches)
        if i % 4 == 3:
            a, b = eager.read(), graphed.read()
            assert a.keys() == b.keys()
            for k in a:
                assert b[k] == pytest.approx(a[k], rel=1e-5, abs=1e-7, nan_ok=True), k
    assert graphed.nonfinite_counts() == eager.nonfinite_counts() == (1, 0)
    # Within 5 % of one step's size (lr 1e-3): the graphed AdamW reads its lr from a float32
    # tensor, the eager one a double, so weights differ by an ulp after step 1, and a key bias
    # (zero gradient: softmax ignores it) walks on that noise. A stale lr, a lost
    # accumulation or a skipped update would differ by a whole step.
    for (name, a), b in zip(eager.model.state_dict().items(), graphed.model.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=5e-5, msg=f"{name} differs")
    if eager._ema is not None:  # 7 updates: the poisoned step moved no average
        assert float(graphed._ema.updates) == float(eager._ema.updates) == 7.0
        for name, a, b in zip(eager._ema.names, eager._ema.shadow, graphed._ema.shadow):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=5e-5, msg=f"average of {name}")


def test_a_shape_without_a_graph_runs_uncaptured(tmp_path, one_thread):
    cfg, (eager, graphed) = _pair(tmp_path)
    graphed.warm_up(SHAPES[:1], graphed.task.worst_case,
                    capture=RecordingCapture(), echo=lambda s: None)
    other = _batches(1, 1)  # the second shape: not captured
    assert not graphed._graphs.ready(other)
    eager.step(other)
    graphed.step(other)
    for a, b in zip(eager.model.parameters(), graphed.model.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=5e-5)


def test_the_step_reads_nothing_back_on_the_host(tmp_path, one_thread):
    """No .item(), no bool(tensor), no tensor made from host data inside a step (each would
    be a host sync per step on a GPU, and impossible to capture)."""
    cfg, (engine, _) = _pair(tmp_path, "train.self_feed=0.5", "model.frame_dropout=0.2",
                             "train.ema_decay=0.999")
    assert engine._ema is not None
    batches = _batches(0, 1)
    engine.step(batches)  # first step: allocations
    assert_no_host_reads(lambda: engine.step(batches))
    with pytest.raises(HostReadError):  # the detector itself works
        assert_no_host_reads(lambda: engine._totals.found_inf.item())


def test_a_step_whose_shape_has_no_graph_is_counted_and_said_once(tmp_path, one_thread, caplog):
    """A graphed run that meets an uncaptured shape runs the plain step beside the graphs'
    pool: counted (logged as train/uncaptured_steps) and named in one warning."""
    _, (_, graphed) = _pair(tmp_path)
    assert graphed.uncaptured_steps is None  # not graphed
    graphed.warm_up(SHAPES[:1], graphed.task.worst_case,
                    capture=RecordingCapture(), echo=lambda s: None)
    captured, other = _batches(0, 1), _batches(1, 1)  # SHAPES[0], SHAPES[1]
    with caplog.at_level(logging.WARNING, logger="myxtts.train.engine.graphs"):
        graphed.step(captured)
        assert graphed.uncaptured_steps == 0
        for _ in range(3):
            graphed.step(other)
    assert graphed.uncaptured_steps == 3
    said = [r.getMessage() for r in caplog.records if "no captured CUDA graph" in r.getMessage()]
    assert said == [said[0]] and "2 utterances x 48 frames, text 16" in said[0]
