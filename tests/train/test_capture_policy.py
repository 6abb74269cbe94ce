"""What a failed CUDA graph capture does, modelled on the CPU with a recording capture
(tests/train/graph_recorder.py) that fails on demand: out of memory retries the same size,
then 3/4 of the batch (never less); any other failure, or a shape that fits at neither,
drops every graph and the run trains uncaptured after one warning; a device left unusable
stops the run naming train.cuda_graphs=off. Shapes are captured largest measured peak
first; the floors (3/4 of the first plan) hold across every attempt. (What a failed CUDA
capture leaves behind: tests/train/test_capture_recovery.py.)"""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
import torch

from myxtts.data.batch import BatchShape
from myxtts.model.dummy import worst_case_batch
from myxtts.train.engine import warmup
from myxtts.train.engine.graphs import StepGraphs
from myxtts.train.errors import TrainError, is_out_of_memory
from tests.train.graph_recorder import RecordingCapture
from tests.train.test_graphs import N_MELS, N_TOKENS, _batches, _pair

# batch 4 can shrink to 3 (3/4); SHAPES[1] of test_graphs is batch 2
BIG, SMALL = BatchShape(4, 16, 24, 12, N_MELS), BatchShape(2, 16, 48, 12, N_MELS)
OOM = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


class FailingCapture(RecordingCapture):
    """Records like ``RecordingCapture``; the micro-step capture of a batch of one of
    ``batches`` utterances raises ``error`` the first ``times`` times. ``order``: the batch
    size of every micro-step capture attempted, in order."""

    def __init__(self, batches: tuple[int, ...] = (), error: Exception = OOM,
                 times: int = 0) -> None:
        super().__init__()
        self.batches, self.error, self.times, self.order = batches, error, times, []

    def __call__(self, fn):
        size = getattr(fn, "batch_size", None)
        if size is not None:
            self.order.append(size)
            if size in self.batches and self.times > 0:
                self.times -= 1
                raise self.error
        return super().__call__(fn)


@pytest.fixture(autouse=True)
def sized_micro(monkeypatch):
    """Tag each micro-step function with its batch size, so the capture can fail one."""
    real = StepGraphs.capture

    def capture(self, batch):
        inner, first = self._capture, [True]

        def tagged(fn):
            if first[0]:
                fn.batch_size = int(batch["mel"].shape[0])
                first[0] = False
            return inner(fn)
        self._capture = tagged
        try:
            real(self, batch)
        finally:
            self._capture = inner
    monkeypatch.setattr(StepGraphs, "capture", capture)


def _ready(engine, shape) -> bool:
    return engine._graphs is not None and engine._graphs.ready(
        [worst_case_batch(shape, N_TOKENS, 1, "cpu")])


def test_out_of_memory_once_is_retried_at_the_planned_size(tmp_path, one_thread):
    _, (_, engine) = _pair(tmp_path)
    capture = FailingCapture((4,), OOM, times=1)
    report = engine.warm_up([BIG, SMALL], engine.task.worst_case,
                            capture=capture, echo=lambda s: None)
    assert capture.order == [2, 4, 4] and report.resized == {}  # longer first (equal peaks)
    assert report.shapes_captured == 2 and _ready(engine, BIG) and _ready(engine, SMALL)


def test_out_of_memory_twice_captures_three_quarters_of_the_batch_never_less(tmp_path,
                                                                             one_thread):
    _, (_, engine) = _pair(tmp_path)
    capture = FailingCapture((4,), OOM, times=2)
    report = engine.warm_up([BIG, SMALL], engine.task.worst_case,
                            capture=capture, echo=lambda s: None)
    assert capture.order == [2, 4, 4, 3]
    assert report.resized == {BIG: 3} and report.shapes_captured == 2
    assert _ready(engine, replace(BIG, batch=3)) and not _ready(engine, BIG)


@pytest.mark.parametrize("failure", ["oom", "other"])
def test_a_shape_that_cannot_be_captured_drops_every_graph_with_one_warning(
        tmp_path, one_thread, caplog, failure):
    """BIG fails after SMALL was captured: SMALL's graph goes too (a shape left uncaptured
    would run beside the pool with memory nothing budgeted), one warning says so, and the
    run trains uncaptured exactly as the eager step does."""
    _, (eager, engine) = _pair(tmp_path)
    error = OOM if failure == "oom" else RuntimeError(
        "CUDA error: operation not permitted when stream is capturing")
    capture = FailingCapture((4, 3), error, times=99)
    with caplog.at_level(logging.WARNING, logger="myxtts.train.engine.warmup"):
        report = engine.warm_up([BIG, SMALL], engine.task.worst_case,
                                capture=capture, echo=lambda s: None)
    said = [r.getMessage() for r in caplog.records]
    assert capture.order == ([2, 4, 4, 3] if failure == "oom" else [2, 4])
    assert len(said) == 1 and "training without CUDA graphs" in said[0]
    assert ("even at 3/4" in said[0]) == (failure == "oom") and "4 x 24 frames" in said[0]
    assert engine._graphs is None and engine.mode == "eager" and report.shapes_captured == 0
    assert report.capture_error and not report.resized
    for i in range(3):  # training goes on, uncaptured, equal to the eager step
        batches = _batches(i, 1)
        eager.step(batches)
        engine.step(batches)
    assert engine.uncaptured_steps is None  # not graphed: no lookup, nothing counted
    for a, b in zip(eager.model.parameters(), engine.model.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=5e-5)


def test_shapes_are_captured_largest_measured_peak_first(tmp_path, one_thread, monkeypatch):
    _, (_, engine) = _pair(tmp_path)
    real = warmup._run_worst_case
    peaks = {BIG: 100, SMALL: 500}  # the longer, thinner bucket needs more

    def measured(step_, shape, worst_case):
        real(step_, shape, worst_case)
        return peaks[shape], peaks[shape] // 10  # (and what the allocator reserved beyond)

    monkeypatch.setattr(warmup, "_run_worst_case", measured)
    capture = FailingCapture()
    report = engine.warm_up([BIG, SMALL], engine.task.worst_case,
                            capture=capture, echo=lambda s: None)
    assert capture.order == [2, 4] and report.peaks == peaks and report.fragmentation == 50


def test_a_device_left_unusable_stops_the_run_naming_the_switch(tmp_path, one_thread):
    _, (_, engine) = _pair(tmp_path)
    capture = FailingCapture((2,), RuntimeError("operation not permitted when stream is "
                                                "capturing"), times=1)
    capture.problem = lambda: "the capture stream is still capturing"
    with pytest.raises(TrainError, match=r"unusable after a failed CUDA graph capture of a batch "
                       r"of 2 x 48 frames.*still capturing.*--set train.cuda_graphs=off"):
        engine.warm_up([BIG, SMALL], engine.task.worst_case, capture=capture, echo=lambda s: None)


def test_an_attempt_that_starts_shrunk_keeps_the_floor_of_the_first_plan(tmp_path, one_thread):
    """A later attempt (after the graphs did not fit beside validation) starts from a batch
    an earlier one shrank: 4 of a plan of 5, whose floor is 4 (3/4 of 5, rounded up).
    Out of memory twice there drops the graphs; it never captures 3 (3/4 of 3/4)."""
    _, (_, engine) = _pair(tmp_path)
    capture = FailingCapture((4, 3), OOM, times=2)
    report = engine.warm_up([BIG, SMALL], engine.task.worst_case,
                            capture=capture, echo=lambda s: None,
                     floors={BIG: 4, SMALL: 2})
    assert capture.order == [2, 4, 4] and report.shapes_captured == 0 and engine._graphs is None


def test_every_start_up_attempt_gets_the_floors_of_the_first_plan(monkeypatch):
    """start_up's attempts (capture, shrink beside the graphs, capture again): each
    warm-up is given 3/4 of the FIRST plan as its floors, and the sizes never go below."""
    from types import SimpleNamespace

    from myxtts.train.distributed import DistInfo
    from myxtts.train.engine import startup
    from myxtts.train.engine.budget import shrink_for_graphs
    from myxtts.train.engine.warmup import WarmupReport

    plan = [16, 8]
    shapes = [BatchShape(b, 16, 24 * (k + 1), 12, N_MELS) for k, b in enumerate(plan)]
    seen = []

    def warm_up_buckets(step, shapes_now, work, dist, graphs, floors):
        seen.append(([s.batch for s in shapes_now], list(floors)))
        report = WarmupReport()
        first = shapes_now[0]  # an out-of-memory capture shrinks the first bucket, to its floor
        report.resized[first] = max(floors[0], -(-first.batch * 3 // 4))
        return report

    def shrink(step, sizes, floors, reserve):  # graphs never fit beside validation
        return shrink_for_graphs(sizes, floors, reserved=100, reserve=50, cap=100)

    monkeypatch.setattr(startup, "warm_up_buckets", warm_up_buckets)
    monkeypatch.setattr(startup, "_shrink_beside_graphs", shrink)
    step = SimpleNamespace(compiled=True, device=torch.device("cpu"),
                           cfg=SimpleNamespace(data=SimpleNamespace(batch_frames=1200)))
    work = startup.Workload(shapes, lambda shape, device: {})  # (warm-up replaced above)
    done = startup.start_up(step, work, True, DistInfo())
    assert [floors for _, floors in seen] == [[12, 6]] * len(seen) and len(seen) >= 3
    assert all(b >= f for sizes, floors in seen for b, f in zip(sizes, floors))
    assert done.planned == plan and all(b >= f for b, f in zip(done.sizes, [12, 6]))


def test_out_of_memory_is_seen_as_the_context_of_a_capture_error():
    """torch's graph.__exit__ raises its own error from capture_end() while the OOM of the
    captured code is being handled: the OOM is only the new error's __context__."""
    try:
        try:
            raise OOM
        except torch.cuda.OutOfMemoryError:
            raise RuntimeError("CUDA error: operation failed due to a previous error") from None
    except RuntimeError as e:
        assert not is_out_of_memory(e)  # "from None": the context is suppressed on purpose
    try:
        try:
            raise OOM
        except torch.cuda.OutOfMemoryError:
            raise RuntimeError("CUDA error: operation failed due to a previous error")  # noqa: B904
    except RuntimeError as e:
        assert is_out_of_memory(e)
