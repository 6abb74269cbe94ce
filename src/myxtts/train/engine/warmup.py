"""Before step 1, every bucket shape runs once: nothing compiles, captures or runs out of
memory later in the run.

``warm_up`` runs the step on each bucket's worst case (every utterance at the padded shape:
the most a batch of that bucket can ask of the GPU), compiling the blocks and capturing the
step's CUDA graphs, one progress line per shape; a failed capture costs its shape only. It
runs on the real model and optimizer (a copy would double the memory measured) inside a
:class:`StateSnapshot`, which puts weights, AdamW state, the step's accumulators and the
random streams back IN PLACE: training starts as if no warm-up had run, and the captured
graphs still point at the live tensors.
"""


from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from myxtts.data.batch import BatchShape
from myxtts.model.dummy import worst_case_batch
from myxtts.train.engine.compile import compiled_graphs
from myxtts.train.engine.graphs import Capture, StepGraphs
from myxtts.train.engine.mode import StepMode
from myxtts.train.engine.snapshot import StateSnapshot
from myxtts.train.engine.step import TrainStep
from myxtts.train.errors import TrainError, error_summary, is_out_of_memory

log = logging.getLogger(__name__)


@dataclass
class WarmupReport:
    """What the warm-up did: per shape seconds, graphs compiled, shapes captured; the shapes
    whose capture failed (description -> cause) and the buckets whose batch an out-of-memory
    capture shrank (planned shape -> the batch size that was captured)."""

    seconds: float = 0.0
    shape_seconds: list[float] = field(default_factory=list)
    graphs_compiled: int = 0
    shapes_captured: int = 0
    capture_error: str | None = None  # the first failure's cause
    uncaptured: dict[str, str] = field(default_factory=dict)
    resized: dict[BatchShape, int] = field(default_factory=dict)


def _describe(shape: BatchShape) -> str:
    return f"{shape.batch} x {shape.frames} frames, text {shape.text}"


def warm_up(step: TrainStep, shapes: list[BatchShape], n_tokens: int, n_languages: int,
            capture: Capture | None = None, echo: Callable[[str], None] = log.info
            ) -> WarmupReport:
    """Run every training shape (longest first) through ``step`` and, with ``capture``
    (``graphs.CudaCapture``), capture its CUDA graphs. The training state is restored
    afterwards. A failed capture costs its shape only (:func:`_capture_shape`); a compile
    failure leaves the step eager (``TrainStep.loss``).

    Two passes, for memory: first every shape runs uncaptured (compiling it and proving its
    worst case fits), then, with the allocator's cache released, every shape is captured,
    largest first. Interleaved, a shape's uncaptured activations would sit beside the pool
    the earlier captures keep reserved: about twice the memory of one step."""
    report = WarmupReport()
    t_start, g_start = time.perf_counter(), compiled_graphs()
    graphs = StepGraphs(step, capture) if capture is not None else None
    step.use_graphs(graphs)  # the step runs as it will once captured
    order = sorted(shapes, key=lambda s: (s.frames, s.text, s.batch), reverse=True)
    total = len(order) * (2 if capture is not None else 1)
    with StateSnapshot(step):
        for i, shape in enumerate(order, 1):
            t0 = time.perf_counter()
            _run_worst_case(step, shape, n_tokens, n_languages)
            report.shape_seconds.append(time.perf_counter() - t0)
            echo(f"warm-up {i}/{total}: {'compiled' if step.compiled else 'ran'} a batch of "
                 f"{_describe(shape)} in {report.shape_seconds[-1]:.1f} s")
        _release(step.device)
        for i, shape in enumerate(order if graphs is not None else [], len(order) + 1):
            t0 = time.perf_counter()
            done = _capture_shape(step, graphs, shape, n_tokens, n_languages, report)
            report.shape_seconds.append(time.perf_counter() - t0)
            if done is not None:
                echo(f"warm-up {i}/{total}: captured a batch of {_describe(done)} as a CUDA "
                     f"graph in {report.shape_seconds[-1]:.1f} s")
    if graphs is not None and not len(graphs):
        step.use_graphs(None)  # nothing captured: the plain step, without the graphs' lookup
        log.warning("no CUDA graph was captured; training with the %s step",
                    StepMode.of(step.compiled, graphed=False))
    _release(step.device)
    report.seconds = time.perf_counter() - t_start
    report.graphs_compiled = compiled_graphs() - g_start
    report.shapes_captured = len(step.graphs) if step.graphs is not None else 0
    return report


def _capture_shape(step: TrainStep, graphs: StepGraphs, shape: BatchShape, n_tokens: int,
                   n_languages: int, report: WarmupReport) -> BatchShape | None:
    """Capture ``shape``; returns the shape captured, or None. After any failure the device
    must pass :func:`device_problem` (else the run stops: a capture invalidated by a sync can
    leave the random generator marked as capturing, and every later step would fail). Out of
    memory shrinks the bucket's batch by a quarter and tries again (shapes are captured in
    frame order and the pool is laid out for the first, so a later one can run out); any
    other cause leaves that shape uncaptured, with one warning naming shape and cause."""
    planned = shape
    while True:
        try:
            if shape != planned:  # a new batch size: run (and compile) it outside a capture
                _run_worst_case(step, shape, n_tokens, n_languages)
                _release(step.device)
            graphs.capture(worst_case_batch(shape, n_tokens, n_languages, step.device))
            return shape
        except Exception as e:
            cause = error_summary(e)
            report.capture_error = report.capture_error or cause
            _release(step.device)
            problem = device_problem(step.device)
            if problem is not None:
                raise TrainError(f"the GPU is unusable after a failed CUDA graph capture of a "
                                 f"batch of {_describe(shape)} ({cause}; then: {problem}); "
                                 f"restart with --set train.cuda_graphs=off") from e
            if is_out_of_memory(e) and shape.batch > 1:
                smaller = replace(shape, batch=max(1, shape.batch * 3 // 4))
                log.warning("capturing a batch of %s ran out of GPU memory; that bucket "
                            "trains with %d utterances per batch", _describe(shape),
                            smaller.batch)
                report.resized[planned] = smaller.batch
                shape = smaller
                continue
            report.uncaptured[_describe(shape)] = cause
            log.warning("CUDA graph capture failed for a batch of %s (%s); that shape trains "
                        "uncaptured (the other shapes keep their graphs)", _describe(shape),
                        cause)
            return None


def device_problem(device: torch.device) -> str | None:
    """What fails on ``device`` now, or None: a random draw, a small allocation and a sync
    (what every training step needs after a failed capture). None on the CPU."""
    if device.type != "cuda":
        return None
    try:
        torch.randn(16, device=device)
        torch.empty(1 << 20, dtype=torch.uint8, device=device)
        torch.cuda.synchronize(device)
    except Exception as e:
        return error_summary(e)
    return None


def _run_worst_case(step: TrainStep, shape: BatchShape, n_tokens: int, n_languages: int) -> None:
    """One uncaptured step on the worst case of ``shape``; out of memory is a TrainError
    naming the bucket and the fix."""
    batch = worst_case_batch(shape, n_tokens, n_languages, step.device)
    try:
        step.run([batch] * step.cfg.train.grad_accum_steps)
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
        import gc

        gc.collect()
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
