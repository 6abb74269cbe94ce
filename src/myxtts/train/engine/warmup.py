"""Before step 1, every bucket shape runs once: nothing compiles, captures or runs out of
memory later in the run.

``warm_up`` runs the step on each bucket's worst case (the task's ``worst_case``: every item
at the padded shape, the most a batch of that bucket can ask of the GPU), compiling the
blocks and measuring its peak memory, then captures the step's CUDA graphs, largest peak
first, one progress line per shape. It runs on the real model and optimizer (a copy would
double the memory measured) inside the engine's ``trial()`` (``snapshot.TrialStep``),
which puts weights, AdamW state, the step's accumulators and the random streams back IN
PLACE: training starts as if no warm-up had run, and the captured graphs still point at
the live tensors. The graphs come back in the report; the engine keeps them
(``TrainEngine.warm_up``).

What a failed capture does (:func:`_capture_shape`): out of memory is retried at the same
size (the allocator's cache released), then once at 3/4 of the batch, never below the
bucket's floor (3/4 of its FIRST plan, whatever earlier attempts shrank it to); any other
failure, or a shape that does not fit even so, drops EVERY graph and the run trains
uncaptured, with one warning -- a shape left uncaptured would run beside the graphs' pool
with memory nothing budgeted. After a failure the device must pass the capture's check
(``graphs.CudaCapture.problem``: the capture stream, the random generator, an allocation,
the cache), else the run stops naming ``train.cuda_graphs=off``.
"""


from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from myxtts.data.batch import BatchShape
from myxtts.train.engine.budget import three_quarters
from myxtts.train.engine.compile import compiled_graphs
from myxtts.train.engine.graphs import StepGraphs
from myxtts.train.engine.mode import StepMode
from myxtts.train.engine.snapshot import TrialStep
from myxtts.train.engine.task import WorstCase
from myxtts.train.errors import TrainError, error_summary, is_out_of_memory

log = logging.getLogger(__name__)


@dataclass
class WarmupReport:
    """What the warm-up did: per shape seconds, graphs compiled, shapes captured, the peak
    bytes of each shape's uncaptured step (0 on a CPU); why capturing stopped (None: every
    shape was captured or none was asked for), the buckets an out-of-memory capture
    shrank (planned shape -> the batch size that was captured) and the graphs captured
    (None: none), for the engine to replay (``TrainEngine.warm_up`` takes them out of the
    report it returns: their lifetime is the engine's)."""

    seconds: float = 0.0
    shape_seconds: list[float] = field(default_factory=list)
    graphs_compiled: int = 0
    shapes_captured: int = 0
    peaks: dict[BatchShape, int] = field(default_factory=dict)
    fragmentation: int = 0  # reserved beyond allocated at a shape's peak, the largest
    capture_error: str | None = None
    resized: dict[BatchShape, int] = field(default_factory=dict)
    graphs: StepGraphs | None = None


def _describe(shape: BatchShape) -> str:
    return f"{shape.batch} x {shape.frames} frames, text {shape.text}"


class CaptureAbandoned(Exception):
    """Capturing stops: every graph is dropped and the run trains uncaptured."""


def warm_up(step: TrialStep, shapes: list[BatchShape], worst_case: WorstCase,
            new_graphs: Callable[[], StepGraphs] | None = None,
            echo: Callable[[str], None] = log.info,
            floors: dict[BatchShape, int] | None = None) -> WarmupReport:
    """Run every training shape's ``worst_case`` (longest first) through ``step`` and, with
    ``new_graphs`` (makes empty graphs of ``step``'s own step: ``TrainEngine.warm_up``
    passes it), capture each shape's CUDA graphs; the report holds them (None: nothing
    captured). They are made
    here, not passed in, so that dropping them frees their pool at once (an argument stays
    referenced by the caller until the call returns). The training state is restored
    afterwards; a compile failure leaves the step eager (``TrainEngine.loss``). ``floors``:
    the smallest batch an out-of-memory capture may shrink each shape to (default 3/4 of
    the shape's batch; the engine passes 3/4 of the first plan).

    Two passes, for memory: first every shape runs uncaptured (compiling it, proving its
    worst case fits and measuring its peak), then, with the allocator's cache released,
    every shape is captured, largest peak first: the pool the graphs share is laid out for
    the largest, and the others reuse it. Interleaved, a shape's uncaptured activations
    would sit beside the pool the earlier captures keep reserved: about twice the memory of
    one step."""
    report = WarmupReport()
    t_start, g_start = time.perf_counter(), compiled_graphs()
    graphs = new_graphs() if new_graphs is not None else None
    order = sorted(shapes, key=lambda s: (s.frames, s.text, s.batch), reverse=True)
    total = len(order) * (2 if graphs is not None else 1)
    with step.trial():
        for i, shape in enumerate(order, 1):
            t0 = time.perf_counter()
            report.peaks[shape], frag = _run_worst_case(step, shape, worst_case)
            report.fragmentation = max(report.fragmentation, frag)
            report.shape_seconds.append(time.perf_counter() - t0)
            echo(f"warm-up {i}/{total}: {'compiled' if step.compiled else 'ran'} a batch of "
                 f"{_describe(shape)} in {report.shape_seconds[-1]:.1f} s")
        _release(step.device)
        by_peak = sorted(order, key=lambda s: report.peaks[s], reverse=True)  # stable: frames
        try:
            for i, shape in enumerate(by_peak if graphs is not None else [], len(order) + 1):
                t0 = time.perf_counter()
                floor = (floors or {}).get(shape, three_quarters(shape.batch))
                done = _capture_shape(step, graphs, shape, floor, worst_case, report)
                report.shape_seconds.append(time.perf_counter() - t0)
                echo(f"warm-up {i}/{total}: captured a batch of {_describe(done)} as a CUDA "
                     f"graph in {report.shape_seconds[-1]:.1f} s")
        except CaptureAbandoned:
            graphs = None  # every graph dropped: their pool is freed below
            report.resized.clear()
    if graphs is not None and not len(graphs):
        graphs = None  # nothing captured: the plain step, without the graphs' lookup
    _release(step.device)
    report.seconds = time.perf_counter() - t_start
    report.graphs_compiled = compiled_graphs() - g_start
    report.shapes_captured = len(graphs) if graphs is not None else 0
    report.graphs = graphs
    return report


def _capture_shape(step: TrialStep, graphs: StepGraphs, shape: BatchShape, floor: int,
                   worst_case: WorstCase, report: WarmupReport) -> BatchShape:
    """Capture ``shape`` (the module docstring's rules), shrinking it to no fewer than
    ``floor`` utterances; returns the shape captured or raises :class:`CaptureAbandoned`
    (after one warning) or a TrainError (the device is left unusable)."""
    smaller = replace(shape, batch=max(floor, three_quarters(shape.batch)))
    tries = [shape, shape] + ([smaller] if smaller.batch < shape.batch else [])
    for k, attempt in enumerate(tries):
        try:
            graphs.capture(worst_case(attempt, step.device))
            if attempt != shape:
                report.resized[shape] = attempt.batch
                log.warning("capturing a batch of %s ran out of GPU memory; that bucket trains "
                            "with %d utterances per batch", _describe(shape), attempt.batch)
            return attempt
        except Exception as e:
            cause = error_summary(e)
            oom = is_out_of_memory(e)
        # (handled outside the except block: its traceback holds tensors)
        problem = graphs.problem()  # (which releases the allocator's cache)
        if problem is not None:
            raise TrainError(f"the GPU is unusable after a failed CUDA graph capture of a "
                             f"batch of {_describe(attempt)} ({cause}; then: {problem}); "
                             f"restart with --set train.cuda_graphs=off")
        report.capture_error = report.capture_error or cause
        if not oom or k == len(tries) - 1:
            why = ("does not fit beside the graphs' pool even at 3/4 of its planned batch"
                   if oom else f"failed ({cause})")
            log.warning("CUDA graph capture of a batch of %s %s; training without CUDA graphs "
                        "(the %s step)", _describe(shape), why,
                        StepMode.of(step.compiled, graphed=False))
            raise CaptureAbandoned(cause)
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def _run_worst_case(step: TrialStep, shape: BatchShape, worst_case: WorstCase
                    ) -> tuple[int, int]:
    """One uncaptured step on the worst case of ``shape``: its peak allocated bytes, and how
    far the allocator's reserved memory peaked beyond that (this shape's fragmentation);
    (0, 0) on a CPU. The cache is released first: cached blocks a heavier shape left would
    count as this one's reserve and inflate the margin the engine keeps beside the graphs.
    Out of memory is a TrainError naming the bucket and the fix."""
    cuda = step.device.type == "cuda"
    if cuda:
        _release(step.device)
        torch.cuda.reset_peak_memory_stats(step.device)
    batch = worst_case(shape, step.device)
    try:
        step.run([batch] * step.cfg.train.grad_accum_steps)
        if cuda:
            torch.cuda.synchronize(step.device)
            peak = int(torch.cuda.max_memory_allocated(step.device))
            return peak, max(0, int(torch.cuda.max_memory_reserved(step.device)) - peak)
        return 0, 0
    except Exception as e:
        if not is_out_of_memory(e):
            raise
        data = step.cfg.data
        fix = (f"lower --set data.auto_batch_memory_share (now {data.auto_batch_memory_share})"
               if data.batch_frames == "auto" else "lower --batch-frames, or use --set "
               "data.batch_frames=auto to measure what fits")
        if step.cfg.train.device_memory_cap:
            fix += f", or raise train.device_memory_cap (now {step.cfg.train.device_memory_cap})"
        raise TrainError(f"out of GPU memory before step 1 on the worst case of a bucket "
                         f"({_describe(shape)}, data.batch_frames={data.batch_frames}); "
                         f"{fix}") from e


def _release(device: torch.device) -> None:
    """Give cached blocks back to CUDA (after a warm-up or a failed capture), so the graphs'
    pool and the training step start from a clean allocator."""
    if device.type == "cuda":
        gc.collect()
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
