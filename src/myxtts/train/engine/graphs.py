"""CUDA graphs of the training step: one replay per bucket shape instead of thousands of
kernel launches, so the host never limits a GPU that runs kernels faster than Python
launches them.

Per bucket shape one *micro* graph (forward and backward of one micro-batch read from static
input buffers) and once the *update* graph (unscale, clip, the non-finite flag, fused AdamW,
zeroing the gradients). A step copies its batches into the static buffers (device to device,
microseconds; the prefetcher stays unaware of graphs) and replays about a dozen launches
whatever the model's depth. All graphs share one memory pool that holds one step's
activations whatever the number of shapes. What makes a replay correct is listed on
:class:`StepGraphs`; ``tests/train/test_graphs.py`` replays a recorded step on the CPU and
compares it with the eager step.
"""


from __future__ import annotations

import contextlib
import gc
import logging
import warnings
from collections.abc import Callable, Iterator
from typing import Protocol

import torch

from myxtts.model.cuda_capture import end_failed_capture
from myxtts.train.errors import error_summary

log = logging.getLogger(__name__)

Replay = Callable[[], None]


class Capture(Protocol):
    """How :class:`StepGraphs` captures: ``capture(fn)`` runs/records ``fn`` once and returns
    its replay; after a capture raised, ``problem()`` says what is left wrong with the
    device (None: training may go on uncaptured)."""

    def __call__(self, fn: Callable[[], None]) -> Replay: ...
    def problem(self) -> str | None: ...


def shape_key(batch: dict[str, torch.Tensor]) -> tuple:
    """What a captured graph is specific to: every field's shape and dtype."""
    return tuple((k, tuple(v.shape), v.dtype) for k, v in sorted(batch.items()))


class CudaCapture:
    """Captures a function as a CUDA graph in a memory pool shared by all its captures.

    Before its first capture the function runs once on the capture stream (torch's recipe:
    lazy per-stream and per-thread initialisations, such as the cuBLAS workspace, happen
    outside a capture). Later captures skip that run: each shape already ran uncaptured in
    the warm-up's first pass, and an uncaptured run beside the pool the earlier captures hold
    would need twice the memory. The run changes the training state like any step; the
    warm-up restores it afterwards.

    A capture that fails leaves nothing behind (:func:`end_failed_capture`). torch's
    ``graph.__exit__`` raises from ``capture_end()`` at the failing ``cudaStreamEndCapture``,
    before it puts the thread's stream back, before the caching allocator hears that the
    capture ended and before the graph counts as captured. Left so, the allocator keeps a
    capture "underway": it defers every freed block that a side stream used (each
    prefetched, ``record_stream``-ed batch) and never releases its cache to retry an
    allocation that ran out of memory; and the pool keeps the use the capture counted, so
    its memory (the largest shape's activations) is never freed. :meth:`problem` then
    checks the device, and mends torch 2.11's generator (:func:`unstick_generator`).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.index = device.index if device.index is not None else torch.cuda.current_device()
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device)
        self.captured = 0  # captures that succeeded into self.pool (each holds one use)
        self._stream_ready = False

    def __call__(self, fn: Callable[[], None]) -> Replay:
        graph = torch.cuda.CUDAGraph()
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        if not self._stream_ready:
            with torch.cuda.stream(self.stream), warnings.catch_warnings():
                # this run is uncaptured on purpose: torch's one-time "capturable=True but
                # not capturing" performance warning does not apply
                warnings.filterwarnings("ignore", message=".*capturable=True.*")
                fn()
            self._stream_ready = True
        try:
            with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
                fn()
        except BaseException:
            end_failed_capture(self.index, current, self.pool)
            if not self.captured:
                # no graph holds the pool: once the failed one goes, its uses are 0 and the
                # allocator frees it when its blocks are; a capture must not begin on it
                # before that (torch asserts), so the next one takes a new pool
                self.pool = torch.cuda.graph_pool_handle()
            raise
        self.captured += 1
        current.wait_stream(self.stream)
        return graph.replay

    def problem(self) -> str | None:
        """After a capture raised: what is wrong with the device, or None. The capture
        stream still capturing; torch 2.11's generator left refusing draws and not mended
        by :func:`unstick_generator`; or a random draw, an allocation, a sync or releasing
        the allocator's cache failing (what every training step needs; an allocator that
        still believes a capture is under way fails the release)."""
        try:
            with torch.cuda.stream(self.stream):
                if torch.cuda.is_current_stream_capturing():
                    return "the capture stream is still capturing"
            stuck = unstick_generator(self.device, self.stream)
            if stuck is not None:
                return stuck
            torch.randn(16, device=self.device)
            torch.empty(1 << 20, dtype=torch.uint8, device=self.device)
            gc.collect()
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
        except Exception as e:
            return error_summary(e)
        return None


def _draws(device: torch.device) -> str | None:
    """None if a random draw on ``device`` works; the error if it fails."""
    try:
        torch.empty(4, device=device).uniform_()
    except RuntimeError as e:
        return str(e)
    return None


def unstick_generator(device: torch.device, stream: torch.cuda.Stream) -> str | None:
    """torch 2.11: after a failed capture the default CUDA generator keeps a "capturing"
    mark that only a successful end of a capture clears, and refuses every uncaptured draw
    ("Offset increment outside graph capture encountered unexpectedly"), so dropout outside
    a graph, and the training step with it, fail. Where a draw fails, a capture that
    succeeds clears the mark: one of a single in-place kernel, with no draw, on ``stream``
    (its own pool, freed with it). The generator keeps its state object, so graphs captured
    before still advance it; its seed and offset are put back from before the check (a draw
    that works moves the offset), so a resumed run stays exact. Returns None when draws
    work (afterwards), else why not. Newer torch keeps capture state per capture: the draw
    works and nothing else happens."""
    saved = torch.cuda.get_rng_state(device)
    try:
        if _draws(device) is None:
            return None
        scratch = torch.zeros(1, device=device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            scratch.add_(1)
        del graph
        failed = _draws(device)
        if failed is not None:
            return f"the CUDA random generator refuses draws ({failed.splitlines()[0]})"
    finally:
        torch.cuda.set_rng_state(saved, device)
    return None


@contextlib.contextmanager
def capturable_lr(opt: torch.optim.Optimizer, lr: list[torch.Tensor]) -> Iterator[None]:
    """Inside the ``with`` (a CUDA graph capture), ``opt`` reads each group's learning rate
    from the device tensors ``lr`` (filled with the current values), so a replay uses what
    :func:`load_lr` wrote before it, not the value of capture time. The groups get their
    floats back afterwards: the schedule, the checkpoint and uncaptured steps see what they
    always see."""
    groups = opt.param_groups
    saved = [(g["lr"], g.get("capturable", False)) for g in groups]
    load_lr(opt, lr)
    for g, t in zip(groups, lr):
        g["lr"], g["capturable"] = t, True
    try:
        yield
    finally:
        for g, (value, capturable) in zip(groups, saved):
            g["lr"], g["capturable"] = value, capturable


def load_lr(opt: torch.optim.Optimizer, lr: list[torch.Tensor]) -> None:
    """This step's learning rates (``opt``'s groups) into the device tensors a captured
    update reads."""
    for t, group in zip(lr, opt.param_groups):
        t.fill_(float(group["lr"]))


class StepGraphs:
    """The captured graphs of the engine's step and how to replay a step with them.

    A replay is correct because the step keeps these rules: every tensor it writes lives
    outside the graph and is updated in place; what changes between steps (learning rate,
    self-feed probability, skip flag) is read from device memory; nothing reads a device
    value on the host. Dropout draws new numbers at every replay (each replay advances the
    generator's Philox offset): a graphed run matches an eager one in distribution.

    ``capture``: how to capture (``CudaCapture`` on a GPU; tests pass a recorder).
    ``optimizer``: the AdamW whose learning rates a replay reads from ``device`` memory;
    ``n_micro``: micro-batches per step. The step's parts, which the engine hands over:
    ``micro(batch, n_micro)`` (forward and backward of one micro-batch) and ``update()``
    (clip, skip or apply AdamW, the weight average, the counters) are captured;
    ``mark(phase)`` (a profiler's phase ends) and ``before_writes()`` (a checkpoint's host
    copy in flight ends first) run around a replay; ``describe(batch)`` names a batch's
    sizes in the warning of a step that found no graph (the task's).
    """

    def __init__(self, capture: Capture, optimizer: torch.optim.Optimizer,
                 device: torch.device, n_micro: int, *,
                 micro: Callable[[dict[str, torch.Tensor], int], None],
                 update: Callable[[], None], mark: Callable[[str], None],
                 before_writes: Callable[[], None],
                 describe: Callable[[dict[str, torch.Tensor]], str]) -> None:
        self._capture, self._opt, self.n_micro = capture, optimizer, n_micro
        self._micro_step, self._update_step = micro, update
        self._mark, self._before_writes, self._describe = mark, before_writes, describe
        self.micro: dict[tuple, tuple[Replay, dict[str, torch.Tensor]]] = {}
        self._update_replay: Replay | None = None
        self.uncaptured = 0  # steps that found no graph for their shape (replay() said False)
        # each parameter group's learning rate, read by the captured update from the device
        self.lr = [torch.zeros((), dtype=torch.float32, device=device)
                   for _ in optimizer.param_groups]

    def __len__(self) -> int:
        """Bucket shapes captured."""
        return len(self.micro)

    def problem(self) -> str | None:
        """After a capture raised: what is left wrong with the device (``Capture.problem``)."""
        return self._capture.problem()

    def _graphs_for(self, batches: list[dict[str, torch.Tensor]]) -> list | None:
        """Each batch's (replay, static inputs), or None if any shape was not captured."""
        if self._update_replay is None or len(batches) != self.n_micro:
            return None
        found = [self.micro.get(shape_key(b)) for b in batches]
        return None if None in found else found

    def ready(self, batches: list[dict[str, torch.Tensor]]) -> bool:
        """True when every batch's shape has a graph (``replay`` would run them)."""
        return self._graphs_for(batches) is not None

    def capture(self, batch: dict[str, torch.Tensor]) -> None:
        """Capture the micro-step for ``batch``'s shape (and the update, the first time).

        The step must have run uncaptured before (its sums, gradients and AdamW state then
        exist and stay where they are), and the caller restores the training state
        afterwards: capturing may run the step (``CudaCapture``'s first run, a recorder's)."""
        static = {k: v.detach().clone() for k, v in batch.items()}
        with capturable_lr(self._opt, self.lr):
            replay = self._capture(lambda: self._micro_step(static, self.n_micro))
            if self._update_replay is None:
                self._update_replay = self._capture(self._update_step)
        self.micro[shape_key(batch)] = (replay, static)

    def replay(self, batches: list[dict[str, torch.Tensor]]) -> bool:
        """One step if every batch's shape was captured: this step's learning rate and
        batches into the static tensors, then the graphs (kernel launches only: no host
        sync). Else False, and nothing ran: the caller runs the step uncaptured, beside the
        memory pool the graphs hold (about twice one step's memory), so such a step is
        counted (:attr:`uncaptured`, logged as ``train/uncaptured_steps``, 0 in a healthy
        run) and the first is said in a warning naming its shape."""
        graphs = self._graphs_for(batches)
        if graphs is None:
            self.uncaptured += 1
            if self.uncaptured == 1:
                log.warning("a batch of %s has no captured CUDA graph: this step runs "
                            "uncaptured beside the graphs' memory pool (later ones are counted "
                            "in train/uncaptured_steps)",
                            ", ".join(dict.fromkeys(self._describe(b) for b in batches)))
            return False
        load_lr(self._opt, self.lr)
        for batch, (run, static) in zip(batches, graphs):
            for k, v in batch.items():
                static[k].copy_(v)
            run()
            self._mark("forward+backward")  # one graph: the two cannot be told apart
        self._before_writes()  # a checkpoint's host copy in flight ends first
        self._update_replay()  # type: ignore[misc]  # (set whenever _graphs_for found graphs)
        self._mark("optimizer")
        return True
