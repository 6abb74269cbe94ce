"""What a failed CUDA graph capture leaves behind, and how the engine cleans it up, on a CPU
model of torch's CUDA runtime (tests/train/cuda_model.py): the thread's stream put back,
the allocator's capture ended and its use of the pool given back (the pool freed when no
graph holds it, and never begun on again), the capture stream checked (not the stream just
restored), and torch 2.11's generator, which refuses every draw after a failed capture,
mended by a capture that succeeds, with its random state as before. Then the warm-up over
the same model: a run whose captures all fail trains uncaptured, or stops in one line
naming train.cuda_graphs=off when the device cannot be mended."""

from __future__ import annotations

import gc

import pytest
import torch

from myxtts.train.engine import graphs
from myxtts.train.engine.graphs import CudaCapture
from myxtts.train.errors import TrainError
from tests.train.cuda_model import STUCK, CudaModel
from tests.train.test_graphs import SHAPES, _batches, _pair

CPU = torch.device("cpu")  # the model's "GPU": tensors stay on the CPU, the runtime is modelled


@pytest.fixture
def cuda(monkeypatch) -> CudaModel:
    model = CudaModel(monkeypatch)
    monkeypatch.setattr(graphs, "_draws", model.draw)
    return model


def _capture(model: CudaModel) -> CudaCapture:
    capture = CudaCapture(CPU)
    capture._stream_ready = True  # (the first capture's uncaptured run is not the point)
    return capture


def test_a_first_capture_that_fails_frees_its_pool_and_the_next_one_takes_a_new_pool(cuda):
    capture = _capture(cuda)
    pool = capture.pool
    cuda.end_fails = 1
    with pytest.raises(RuntimeError, match="not permitted"):
        capture(lambda: None)
    assert cuda.current is cuda.default  # the thread's stream is the one before the capture
    assert cuda.underway == []  # no capture is underway for the allocator any more
    assert cuda.uses[pool] == 0  # the use the capture counted is given back: freeable
    assert capture.pool != pool  # a capture never begins on a pool whose uses reached 0
    replay = capture(lambda: None)  # (torch would assert here on the old pool)
    assert cuda.uses[capture.pool] == 1 and capture.captured == 1
    del replay  # the graph goes, and its use with it
    gc.collect()
    assert cuda.uses[capture.pool] == 0


def test_a_later_capture_that_fails_leaves_the_earlier_graphs_their_pool(cuda):
    capture = _capture(cuda)
    pool = capture.pool
    replay = capture(lambda: None)
    cuda.end_fails = 1
    with pytest.raises(RuntimeError):
        capture(lambda: None)
    assert cuda.uses[pool] == 1 and cuda.underway == [] and capture.pool == pool
    retry = capture(lambda: None)  # the retry shares the pool with the first graph
    assert cuda.uses[pool] == 2
    del replay, retry
    gc.collect()
    assert cuda.uses[pool] == 0


def test_a_capture_torch_ended_itself_is_not_released_twice(cuda):
    """The captured code raised (out of memory, say) but the capture itself ended: torch
    took the pool off its list, and the graph object gives its use back when it goes."""
    capture = _capture(cuda)

    def oom():
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    pool = capture.pool
    with pytest.raises(torch.cuda.OutOfMemoryError):
        capture(oom)
    gc.collect()
    assert cuda.underway == [] and cuda.uses[pool] == 0
    assert not any(entry[0] == "release" for entry in cuda.log)
    assert capture.pool != pool  # the retry must not begin on a pool whose uses reached 0
    replay = capture(lambda: None)
    assert cuda.uses[capture.pool] == 1 and replay is not None


def test_the_health_check_looks_at_the_capture_stream(cuda):
    capture = _capture(cuda)
    cuda.stream_check_fails = 1
    with pytest.raises(RuntimeError, match="same stream"):
        capture(lambda: None)
    assert cuda.current is cuda.default and not torch.cuda.is_current_stream_capturing()
    assert capture.problem() == "the capture stream is still capturing"


def test_torch_2_11s_generator_is_mended_with_its_random_state_kept(cuda):
    capture = _capture(cuda)
    cuda.rng = (7, 1000)
    cuda.end_fails = 1
    with pytest.raises(RuntimeError):
        capture(lambda: None)
    assert cuda.draw(CPU) == STUCK and cuda.rng == (7, 1000)  # every dropout would raise
    assert capture.problem() is None
    assert not cuda.marked and cuda.rng == (7, 1000)  # seed and offset as before the check
    assert cuda.draw(CPU) is None
    assert all(uses == 0 for pool, uses in cuda.uses.items() if pool[0] == "private")


def test_a_generator_that_cannot_be_mended_is_named(cuda):
    capture = _capture(cuda)
    cuda.end_fails = 1
    with pytest.raises(RuntimeError):
        capture(lambda: None)
    cuda.heal_fails = True
    assert "not permitted" in capture.problem()


def test_newer_torch_needs_no_mending(monkeypatch):
    model = CudaModel(monkeypatch, torch211=False)
    monkeypatch.setattr(graphs, "_draws", model.draw)
    capture = _capture(model)
    model.end_fails = 1
    with pytest.raises(RuntimeError):
        capture(lambda: None)
    assert capture.problem() is None
    assert not any(entry[0] == "begin" and entry[1][0] == "private" for entry in model.log)


@pytest.mark.parametrize("mendable", [True, False])
def test_a_warm_up_whose_captures_fail_trains_uncaptured_or_stops_naming_the_switch(
        tmp_path, one_thread, cuda, mendable, monkeypatch):
    """The real micro-step syncs while it is captured (what a stray ``.item()`` does): that
    capture fails, every graph is dropped and the run goes on uncaptured with a generator
    that draws again, equal to the eager step; or, where the device cannot be mended, one
    line naming the switch."""
    _, (eager, engine) = _pair(tmp_path)
    micro = engine._micro

    def syncing(batch, n_micro, last=True):
        torch.cuda.synchronize()
        return micro(batch, n_micro, last)

    monkeypatch.setattr(engine, "_micro", syncing)
    if not mendable:
        cuda.heal_fails = True
        with pytest.raises(TrainError, match=r"unusable after a failed CUDA graph capture.*"
                                             r"--set train.cuda_graphs=off"):
            engine.warm_up(SHAPES, engine.task.worst_case,
                           capture=CudaCapture(CPU), echo=lambda s: None)
        return
    report = engine.warm_up(SHAPES, engine.task.worst_case,
                            capture=CudaCapture(CPU), echo=lambda s: None)
    assert report.capture_error and report.shapes_captured == 0 and engine.mode == "eager"
    assert cuda.draw(CPU) is None and cuda.underway == [] and cuda.current is cuda.default
    monkeypatch.setattr(engine, "_micro", micro)
    gc.collect()
    assert all(uses == 0 for uses in cuda.uses.values())  # nothing keeps a pool
    for i in range(2):
        eager.step(_batches(i, 1))
        engine.step(_batches(i, 1))
    for a, b in zip(eager.model.parameters(), engine.model.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=5e-5)
