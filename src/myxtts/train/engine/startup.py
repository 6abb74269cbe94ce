"""Everything the engine does before step 1 for a set of bucket shapes, in one sequence.

:func:`start_up` runs, on a GPU or with compiled blocks:

1. the room a graphed run keeps beside its graphs (:func:`graphs_reserve`: the largest
   validation forward and a data role on the training GPU, ``budget.side_reserve``);
2. ``data.batch_frames=auto`` on a GPU: each bucket's largest batch that fits, less that
   room (``budget.auto_batch_sizes``, cached in the run folder);
3. the warm-up of every shape (``TrainEngine.warm_up``: compile, capture the CUDA graphs,
   which the engine keeps; an out-of-memory capture shrinks its bucket, never below 3/4 of
   its plan);
4. after a graphed warm-up, the graphs' pool plus the room beside it plus the warm-up's
   measured fragmentation (reserved beyond allocated at a shape's peak) must fit the GPU's
   share; else every bucket shrinks, never below 3/4 of its plan, and the warm-up captures
   again; when no capture within that fits (three tries), the run goes without CUDA graphs
   at the planned sizes, said in one warning.

The floors (3/4 of each bucket's plan, :func:`budget.three_quarters`) are those of the
first plan in every attempt: an attempt that starts from sizes an earlier one shrank still
stops where the plan's floor is, never at 3/4 of 3/4.

It returns each bucket's final batch size; the caller builds its loader with them. On a
CPU with eager blocks nothing runs and the planned sizes come back unchanged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import torch

from myxtts.data.batch import BatchShape
from myxtts.train.distributed import DistInfo, agree
from myxtts.train.engine.budget import (
    GIB,
    CudaMemory,
    auto_batch_sizes,
    shrink_for_graphs,
    side_reserve,
    three_quarters,
)
from myxtts.train.engine.graphs import Capture, CudaCapture
from myxtts.train.engine.mode import StepMode
from myxtts.train.engine.snapshot import TrialStep
from myxtts.train.engine.task import WorstCase
from myxtts.train.engine.warmup import WarmupReport
from myxtts.train.errors import TrainError
from myxtts.train.memory import MemoryCaps

log = logging.getLogger(__name__)

CAPTURE_TRIES = 3  # warm-ups whose graphs may be shrunk and captured again before stopping


class StartingStep(TrialStep, Protocol):
    """The engine as :func:`start_up` drives it (``TrainEngine`` satisfies it): a trial step
    (``snapshot.TrialStep``) that warms up its bucket shapes and keeps the CUDA graphs it
    captures (``warm_up``: ``warmup.warm_up``'s report, the graphs taken out), and says
    how its steps run now (``mode``)."""

    @property
    def mode(self) -> StepMode: ...
    def warm_up(self, shapes: list[BatchShape], worst_case: WorstCase,
                capture: Capture | None = None, echo: Callable[[str], None] = log.info,
                floors: dict[BatchShape, int] | None = None) -> WarmupReport: ...


@dataclass(frozen=True)
class Workload:
    """What the engine starts up for. ``shapes``: each train bucket's padded shape, in bucket
    order, its ``batch`` the planned size; ``worst_case``: the task's worst-case batch of a
    shape (``task.StepTask.worst_case``: what the probe, the warm-up and the capture run);
    ``val_shape``: the largest validation batch (None: no validation); ``data_role``: makes
    the data role's largest feature batch when it runs on the training GPU (None
    otherwise); ``run_dir``: where measured batch sizes are cached."""

    shapes: list[BatchShape]
    worst_case: WorstCase
    val_shape: BatchShape | None = None
    data_role: Callable[[], object] | None = None
    run_dir: Path | None = None


@dataclass
class Startup:
    """What :func:`start_up` did: each bucket's batch size (in ``Workload.shapes``'
    order) and the plan it started from (the measured or configured sizes, before any
    shrinking for the graphs), the last warm-up's report (None: none ran), the room kept
    beside the graphs and the seconds the batch sizes took (measured or read from the run
    folder)."""

    sizes: list[int]
    planned: list[int]
    report: WarmupReport | None = None
    reserve_bytes: int = 0
    sizing_s: float = 0.0


def start_up(step: StartingStep, work: Workload, graphs: bool, dist: DistInfo) -> Startup:
    """Steps 1-4 of the module docstring for ``step`` (``graphs``: the plan captures them)."""
    cfg, cuda = step.cfg, step.device.type == "cuda"
    sizes = [s.batch for s in work.shapes]
    if not (step.compiled or cuda):
        return Startup(sizes, list(sizes))
    echo = log.info if dist.rank == 0 else (lambda _: None)
    started = time.perf_counter()
    reserve = graphs_reserve(step, work) if graphs and cuda else 0
    if cfg.data.batch_frames == "auto" and cuda:
        sizes = auto_batch_sizes(step, work.shapes, sizes, cfg, work.run_dir or Path("."),
                                 work.worst_case, dist, echo=echo, reserve=reserve)
    sizing_s = time.perf_counter() - started
    report, plan = None, sizes
    floors = [three_quarters(b) for b in plan]
    for attempt in range(CAPTURE_TRIES):
        shapes = [replace(s, batch=b) for s, b in zip(work.shapes, sizes)]
        report = warm_up_buckets(step, shapes, work, dist, graphs, floors)
        sizes = [report.resized.get(s, s.batch) for s in shapes]
        smaller = _shrink_beside_graphs(step, sizes, floors, reserve + report.fragmentation)
        if smaller is None:
            break
        if smaller == sizes or attempt == CAPTURE_TRIES - 1:
            # no capture within 3/4 of the plan fits beside validation and the data role: the
            # whole run goes uncaptured at the planned sizes (planned for the plain step)
            log.warning("the CUDA graphs do not fit beside validation, samples and the data "
                        "role (%.1f GiB) even at 3/4 of the planned batch sizes: this run "
                        "trains without CUDA graphs (--set train.cuda_graphs=off says so up "
                        "front)", reserve / GIB)
            sizes = plan
            shapes = [replace(s, batch=b) for s, b in zip(work.shapes, sizes)]
            report = warm_up_buckets(step, shapes, work, dist, False, floors)
            sizes = [report.resized.get(s, s.batch) for s in shapes]
            break
        sizes = smaller
    return Startup(sizes, plan, report, reserve, sizing_s)


def graphs_reserve(step: TrialStep, work: Workload) -> int:
    """Bytes a graphed run needs beside the graphs' pool (``budget.side_reserve``): the
    largest validation batch's forward and, on the fly with features on the training GPU,
    the data role's largest batch. Measured with the random streams put back after."""
    with torch.random.fork_rng(devices=[step.device]):
        return side_reserve(step, work.val_shape, work.worst_case, CudaMemory(step.device),
                            work.data_role)


def _shrink_beside_graphs(step: StartingStep, sizes: list[int], floors: list[int], reserve: int
                          ) -> list[int] | None:
    """After a graphed warm-up: None if the graphs' pool plus ``reserve`` (the room beside
    them and the fragmentation margin) fit the training GPU's share; else smaller batch
    sizes, never below ``floors`` (said in one warning when they are smaller), for the
    warm-up to capture again or to run without the graphs (the next warm-up drops them and
    frees their pool before it measures anything)."""
    if step.mode != StepMode.GRAPHED or step.device.type != "cuda":
        return None
    memory = CudaMemory(step.device)
    share = MemoryCaps(step.device, None, step.cfg.train.device_memory_cap, 0.0).training_share()
    cap = int(min(share * memory.total, memory.available))
    pool = int(torch.cuda.memory_reserved(step.device))
    smaller = shrink_for_graphs(sizes, floors, pool, reserve, cap)
    if smaller is not None and smaller != sizes:
        log.warning("after the warm-up the CUDA graphs hold %.1f GiB and validation, samples, "
                    "the data role and a fragmentation margin need %.1f GiB beside them: more "
                    "than the %.1f GiB this run may use; batch sizes %s -> %s, capturing again",
                    pool / GIB, reserve / GIB, cap / GIB, sizes, smaller)
    return smaller


def warm_up_buckets(step: StartingStep, shapes: list[BatchShape], work: Workload, dist: DistInfo,
                    graphs: bool, floors: list[int]) -> WarmupReport:
    """Every bucket shape before step 1: compile and capture now, with a progress line per
    shape, instead of pausing the run later, and prove on a GPU that each bucket's worst case
    fits (``TrainEngine.warm_up``). Under DDP the ranks warm up without DDP's gradient hooks
    (a trial step's), like the auto budget's probe: a rank that runs out of memory must not
    leave the others waiting in an all-reduce; every rank then stops with its error
    (``agree``). ``floors``: each bucket's smallest batch (in ``shapes``' order)."""
    unique = sorted(set(shapes), key=lambda s: s.frames)
    floor_of: dict[BatchShape, int] = {}
    for shape, floor in zip(shapes, floors):  # (buckets of one shape: the lowest floor)
        floor_of[shape] = min(floor, floor_of.get(shape, floor))
    echo = log.info if dist.rank == 0 else (lambda _: None)
    report, failure = None, None
    try:
        report = step.warm_up(unique, work.worst_case,
                              capture=CudaCapture(step.device) if graphs else None, echo=echo,
                              floors=floor_of)
    except TrainError as e:
        failure = e
    agree(dist, failure)
    assert report is not None
    frag = (f"; {report.fragmentation / GIB:.2f} GiB reserved beyond allocated at the peaks"
            if step.device.type == "cuda" else "")
    echo(f"warm-up: {len(unique)} bucket shapes in {report.seconds:.1f} s "
         f"({report.graphs_compiled} graphs compiled, {report.shapes_captured} shapes captured "
         f"as CUDA graphs{frag}); {step.mode} step")
    return report
