"""``data.batch_frames: auto``: the largest batch per bucket that fits the GPU, found before
step 1, so a run never runs out of memory at step 10,000 on an unlucky batch.

Per bucket because a step's memory grows faster than its frames (attention is quadratic);
measured because activation memory depends on model, precision, compile mode, torch and GPU
in ways no formula tracks. Each bucket's worst case runs a full step at sizes found by
doubling, then bisection (:func:`largest_fitting`); a size fits when it does not run out of
memory and peaks within ``data.auto_batch_memory_share`` of what this run may use, less what
must stay free beside the CUDA graphs (:func:`side_reserve`). Under DDP all ranks take the
smallest size per bucket. The answer is cached in the run folder (``auto_batch.json``), keyed
by everything it depends on; anything else measures again, naming what changed.
"""


from __future__ import annotations

import gc
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from myxtts.data.batch import BatchShape
from myxtts.system import atomic_write
from myxtts.train.distributed import agree
from myxtts.train.engine.mode import StepMode
from myxtts.train.engine.snapshot import TrialStep
from myxtts.train.engine.task import WorstCase
from myxtts.train.errors import TrainError, is_out_of_memory
from myxtts.train.memory import MemoryCaps

log = logging.getLogger(__name__)

CACHE_NAME = "auto_batch.json"
UNCAPPED = 4096  # the doubling's ceiling when data.max_batch_size = 0
BISECT_TOLERANCE = 1 / 16  # stop bisecting within ~6 % of the largest fitting size
GIB = 2**30


def largest_fitting(fits: Callable[[int], bool], start: int, cap: int) -> int:
    """Largest ``b`` in [1, cap] with ``fits(b)`` (assumed true up to some size, false
    above), or 0 if not even 1 fits. Doubles from ``start`` until a size fails (or the cap
    fits), then bisects between the last fit and the first failure until they are within
    :data:`BISECT_TOLERANCE`; ``fits`` runs O(log) times, never twice on one size."""
    b = min(max(1, start), cap)
    if fits(b):
        lo, hi = b, None
        while lo < cap:
            b = min(2 * lo, cap)
            if not fits(b):
                hi = b
                break
            lo = b
        if hi is None:
            return lo
    else:
        lo, hi = 0, b
    while hi - lo > max(1, int(lo * BISECT_TOLERANCE)):
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


class CudaMemory:
    """What the probe needs to know about a CUDA device's memory (tests pass a stand-in)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        props = torch.cuda.get_device_properties(device)
        self.name, self.total = props.name, int(props.total_memory)
        # What this process can have: the free memory plus what its allocator already holds.
        # The rest belongs to other processes (another run, a notebook), and a budget that
        # counted it would climb to the real out-of-memory edge.
        free, _ = torch.cuda.mem_get_info(device)
        self.available = min(self.total, int(free) + int(torch.cuda.memory_reserved(device)))

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self) -> int:
        torch.cuda.synchronize(self.device)
        return int(torch.cuda.max_memory_allocated(self.device))

    def allocated(self) -> int:
        return int(torch.cuda.memory_allocated(self.device))

    def release(self) -> None:
        gc.collect()
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()


@dataclass
class Probe:
    """Runs a bucket's worst case (``worst_case(shape, device)``, the task's) through
    ``step`` at a given batch size: ``fits(shape)`` (inside ``step.trial()``). ``peaks``
    remembers the peak bytes of every size that ran."""

    step: TrialStep
    memory: Any
    limit: int
    worst_case: WorstCase

    def __post_init__(self) -> None:
        self.peaks: dict[BatchShape, int] = {}

    def fits(self, shape: BatchShape) -> bool:
        self.memory.reset_peak()
        failed = False
        try:
            batch = self.worst_case(shape, self.step.device)
            self.step.run([batch])
            self.peaks[shape] = self.memory.peak()
        except Exception as e:
            if not is_out_of_memory(e):
                raise
            failed = True  # handled outside the except block: its traceback holds tensors
        batch = None
        if failed:  # (the step left no partial state: TrialStep.run)
            self.memory.release()
            return False
        return self.peaks[shape] <= self.limit


def cache_key(step: TrialStep, memory: Any, shapes: list[BatchShape], cfg: Any, distributed: bool
              ) -> dict[str, Any]:
    """Everything the measured sizes depend on."""
    return {"gpu": memory.name, "gpu_memory_bytes": memory.total, "torch": torch.__version__,
            "model": _plain(cfg.model), "precision": str(step.dtype).replace("torch.", ""),
            "step": str(StepMode.of(step.compiled, graphed=False)),  # graphs: the next key
            "cuda_graphs": cfg.train.cuda_graphs, "distributed": distributed,
            "activation_checkpointing": cfg.train.activation_checkpointing,
            "self_feed": cfg.train.self_feed > 0,  # a second decoder pass
            "memory_fraction": cfg.data.auto_batch_memory_share,
            "train_memory_fraction": cfg.train.device_memory_cap,
            "max_batch_size": cfg.data.max_batch_size,
            "buckets": [[s.frames, s.text, s.ref_frames, s.n_mels] for s in shapes]}


def _plain(section: Any) -> dict[str, Any]:
    return asdict(section)


def read_cache(path: Path, key: dict[str, Any]) -> tuple[list[int] | None, str | None]:
    """``(sizes, None)`` if ``path`` holds sizes measured under ``key``; else ``(None,
    reason)`` (None reason: no cache yet)."""
    if not path.is_file():
        return None, None
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        old, sizes = saved["key"], [int(s) for s in saved["batch_sizes"]]
    except (ValueError, KeyError, TypeError) as e:
        return None, f"{path} cannot be read ({type(e).__name__}: {e})"
    for name, value in key.items():
        if old.get(name) != value:
            return None, (f"{path} was measured with {name} = {_short(old.get(name))}, this run "
                          f"has {_short(value)}")
    if len(sizes) != len(key["buckets"]):
        return None, f"{path} has {len(sizes)} sizes for {len(key['buckets'])} buckets"
    return sizes, None


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def write_cache(path: Path, key: dict[str, Any], sizes: list[int], peaks: list[int | None]) -> None:
    blob = {"key": key, "batch_sizes": sizes,
            "peak_gib": [None if p is None else round(p / GIB, 3) for p in peaks]}
    atomic_write(path, json.dumps(blob, indent=1) + "\n")


def format_table(shapes: list[BatchShape], sizes: list[int], peaks: list[int | None],
                 header: str) -> str:
    lines = [header, f"{'bucket':>6} {'T_mel':>6} {'L_text':>6} {'batch':>6} {'frames':>7} "
                     f"{'peak GiB':>8}"]
    for k, (s, b, p) in enumerate(zip(shapes, sizes, peaks)):
        peak = "-" if p is None else f"{p / GIB:.1f}"
        lines.append(f"{k:>6} {s.frames:>6} {s.text:>6} {b:>6} {b * s.frames:>7} {peak:>8}")
    return "\n".join(lines)


def measure(probe: Probe, shapes: list[BatchShape], start_sizes: list[int], cap: int,
            describe: str, echo: Callable[[str], None] = log.info
            ) -> tuple[list[int], list[int | None]]:
    """Per bucket (longest first) the largest fitting batch size and its peak bytes, with a
    progress line per bucket (the first steps compile, which takes a while). The next
    shorter bucket starts its search at the frames the longer one fitted."""
    sizes: list[int] = [0] * len(shapes)
    peaks: list[int | None] = [None] * len(shapes)
    frames_fitted = None
    order = sorted(range(len(shapes)), key=lambda i: shapes[i].frames, reverse=True)
    with probe.step.trial():  # without DDP's all-reduce: ranks try different sizes
        for done, k in enumerate(order, 1):
            s = shapes[k]
            start = start_sizes[k] if frames_fitted is None else max(1, frames_fitted // s.frames)
            tried: list[int] = []
            t0 = time.perf_counter()

            def fits(n: int, s: BatchShape = s, tried: list[int] = tried) -> bool:
                tried.append(n)
                return probe.fits(replace(s, batch=n))

            b = largest_fitting(fits, start, cap)
            if b == 0:
                raise TrainError(
                    f"bucket {k} ({s.frames} mel frames, {s.text} text tokens): not even one "
                    f"utterance fits in {describe}; lower data.max_duration_s, use a smaller "
                    f"--model-size, turn on train.activation_checkpointing, or raise "
                    f"data.auto_batch_memory_share / train.device_memory_cap ({describe})")
            sizes[k], peaks[k] = b, probe.peaks.get(replace(s, batch=b))
            frames_fitted = b * s.frames
            echo(f"auto batch sizes {done}/{len(order)}: bucket {k} ({s.frames} frames) fits "
                 f"{b} utterances (tried {', '.join(map(str, tried))}; "
                 f"{time.perf_counter() - t0:.1f} s)")
    probe.memory.release()
    return sizes, peaks


def auto_batch_sizes(step: TrialStep, shapes: list[BatchShape], start_sizes: list[int], cfg: Any,
                     run_dir: Path, worst_case: WorstCase, dist: Any,
                     memory: Any = None, echo: Callable[[str], None] = log.info,
                     reserve: int = 0) -> list[int]:
    """The batch size of every bucket (``shapes``: each bucket's padded shape, batch
    ignored; ``start_sizes``: where each search starts, e.g. the planning budget's sizes;
    ``worst_case``: the task's worst-case batch of a shape):
    from ``run_dir``'s cache when it matches, else measured. Under DDP (``dist.enabled``)
    the ranks agree on the smallest size per bucket. Prints the per-bucket table.
    ``reserve``: bytes that must stay free beside the step (:func:`side_reserve`)."""
    memory = memory or CudaMemory(step.device)
    cap = cfg.data.max_batch_size or UNCAPPED
    training = MemoryCaps(step.device, None, cfg.train.device_memory_cap, 0.0).training_share()
    share = cfg.data.auto_batch_memory_share * training
    limit = int(min(share * memory.total, cfg.data.auto_batch_memory_share * memory.available))
    capped = f", capped at train.device_memory_cap={cfg.train.device_memory_cap}" \
        if cfg.train.device_memory_cap else ""
    others = memory.total - memory.available
    if others > 0.02 * memory.total:
        capped += f"; {others / GIB:.1f} GiB held by other processes"
    kept = ""
    if reserve:
        limit -= reserve
        kept = (f" less {reserve / GIB:.1f} GiB kept beside the CUDA graphs for validation, "
                f"samples and the data role")
    describe = (f"{limit / GIB:.1f} GiB ({share:.0%} of {memory.name}, {memory.total / GIB:.1f} "
                f"GiB{capped}{kept}) with the {cfg.model.preset} preset in "
                f"{str(step.dtype).replace('torch.', '')}")
    key = {**cache_key(step, memory, shapes, cfg, dist.enabled),
           "reserve_gib": round(reserve / GIB, 1)}
    path = run_dir / CACHE_NAME
    sizes, reason = read_cache(path, key)
    if dist.enabled:  # all ranks measure if any must (none waits in a collective meanwhile)
        have = torch.tensor([0 if sizes is None else 1], device=step.device)
        torch.distributed.all_reduce(have, op=torch.distributed.ReduceOp.MIN)
        if int(have.item()) == 0:
            sizes, reason = None, reason or "another rank has no cached sizes"
    peaks: list[int | None] = [None] * len(shapes)
    measured = sizes is None
    if measured:
        if reason:
            echo(f"auto batch sizes: {reason}; measuring again")
        echo(f"auto batch sizes: measuring each bucket's worst case on {describe}")
        probe = Probe(step, memory, limit, worst_case)
        failure = None
        try:
            sizes, peaks = measure(probe, shapes, start_sizes, cap, describe, echo)
        except TrainError as e:  # e.g. a bucket that does not fit: every rank stops with it
            failure = e
        agree(dist, failure)
        key = {**cache_key(step, memory, shapes, cfg, dist.enabled),  # compile failed: eager
               "reserve_gib": round(reserve / GIB, 1)}
    if dist.enabled:
        agreed = torch.tensor(sizes, dtype=torch.int64, device=step.device)
        torch.distributed.all_reduce(agreed, op=torch.distributed.ReduceOp.MIN)
        sizes = [int(s) for s in agreed.tolist()]
    if measured and dist.rank == 0:
        write_cache(path, key, sizes, peaks)
    source = "measured" if measured else f"from {path}"
    echo(format_table(shapes, sizes, peaks, f"auto batch sizes ({source}; {describe}, cap "
                                            f"{cap} utterances):"))
    return sizes


def side_reserve(step: TrialStep, val_shape: BatchShape | None, worst_case: WorstCase,
                 memory: Any, data_role: Callable[[], None] | None = None) -> int:
    """Bytes a graphed run needs beside the graphs' pool, which stays reserved for the whole
    run: the peak of one validation forward on ``val_shape``'s ``worst_case`` (blocks
    eager, no gradients; sample synthesis runs the same blocks on a few utterances, one
    frame at a time, and needs less) plus the peak of ``data_role`` (the on-the-fly features of the
    largest batch, when they are made on the training GPU)."""
    runs: list[Callable[[], None]] = []
    if val_shape is not None:
        batch = worst_case(val_shape, step.device)
        runs.append(lambda: _validation_forward(step, batch))
    if data_role is not None:
        runs.append(data_role)
    need = 0
    for run in runs:
        memory.release()
        base = memory.allocated()
        memory.reset_peak()
        run()
        need += max(0, memory.peak() - base)
    memory.release()
    return need


def _validation_forward(step: TrialStep, batch: dict[str, torch.Tensor]) -> None:
    """One forward as validation runs it (eval mode, blocks eager, no gradients), on the
    trained weights (swapping the average in would measure nothing more)."""
    with step.evaluating(raw_weights=True), torch.no_grad():
        step.loss(batch)


def three_quarters(size: int) -> int:
    """The smallest a bucket's batch may become when its graph does not fit: 3/4 of its
    planned size, rounded up (a smaller batch would cost more steps than the graph saves)."""
    return -(-size * 3 // 4)


def shrink_for_graphs(sizes: list[int], floors: list[int], reserved: int, reserve: int,
                      cap: int) -> list[int] | None:
    """After the warm-up: the graphs' pool (``reserved`` bytes, all this process's allocator
    holds then) plus what runs beside it (``reserve``) must fit in ``cap``. None if they do;
    else every bucket's batch scaled down by the share that is over (and by at least a
    quarter), never below its ``floors`` entry (:func:`three_quarters` of its FIRST plan,
    whatever an earlier attempt left: a size found below its floor comes back at it), for
    the warm-up to capture again. Sizes that come back unchanged are at their floors
    already: no capture the plan allows fits, and the caller drops the graphs."""
    if reserved + reserve <= cap:
        return None
    scale = min(0.75, max(0.0, cap - reserve) / max(1, reserved))
    return [max(f, min(b, int(b * scale))) for b, f in zip(sizes, floors)]
