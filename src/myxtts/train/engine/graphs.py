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

import warnings
from collections.abc import Callable
from typing import Any

import torch

from myxtts.train.engine.step import TrainStep

Replay = Callable[[], None]
Capture = Callable[[Callable[[], None]], Replay]  # runs/records fn once, returns its replay


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

    A capture that fails leaves nothing behind (:func:`end_failed_capture`): torch's
    ``graph.__exit__`` raises from ``capture_end()`` before it puts the thread's stream
    back, and may raise before the caching allocator hears that the capture ended (it
    would then keep routing this stream's allocations to the pool: freed blocks never
    reused, prefetched batches leaking until out of memory).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device)
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
            end_failed_capture(self.device, current, self.pool)
            raise
        current.wait_stream(self.stream)
        return graph.replay


def end_failed_capture(device: torch.device, stream: torch.cuda.Stream, pool: Any) -> None:
    """After a capture raised: ``stream`` is the thread's current stream again, and the
    caching allocator's capture into ``pool`` is over (torch's private call: no public one
    ends it; where it already ended, the allocator refuses the call, which is fine)."""
    torch.cuda.set_stream(stream)
    for name in ("_cuda_endAllocateToPool", "_cuda_endAllocateCurrentStreamToPool"):
        end = getattr(torch._C, name, None)
        if end is None:
            continue
        try:
            end(device.index if device.index is not None else torch.cuda.current_device(),
                pool)
        except RuntimeError:  # "not currently recording to" the pool: it had ended
            pass
        break


class StepGraphs:
    """The captured graphs of one ``TrainStep`` and how to replay a step with them.

    A replay is correct because the step keeps these rules: every tensor it writes lives
    outside the graph and is updated in place; what changes between steps (learning rate,
    self-feed probability, skip flag) is read from device memory; nothing reads a device
    value on the host. Dropout draws new numbers at every replay (each replay advances the
    generator's Philox offset): a graphed run matches an eager one in distribution.

    ``capture``: how to capture (``CudaCapture`` on a GPU; tests pass a recorder).
    """

    def __init__(self, step: TrainStep, capture: Capture) -> None:
        self.step = step
        self._capture = capture
        self.n_micro = step.cfg.train.grad_accum_steps
        self.micro: dict[tuple, tuple[Replay, dict[str, torch.Tensor]]] = {}
        self._update: Replay | None = None
        # each parameter group's learning rate, read by the captured update from the device
        self.lr = [torch.zeros((), dtype=torch.float32, device=step.device)
                   for _ in step.opt.param_groups]

    def __len__(self) -> int:
        """Bucket shapes captured."""
        return len(self.micro)

    def _graphs_for(self, batches: list[dict[str, torch.Tensor]]) -> list | None:
        """Each batch's (replay, static inputs), or None if any shape was not captured."""
        if self._update is None or len(batches) != self.n_micro:
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
        with self.step.capturable_lr(self.lr):
            replay = self._capture(lambda: self.step.micro(static, self.n_micro))
            if self._update is None:
                self._update = self._capture(self.step.update)
        self.micro[shape_key(batch)] = (replay, static)

    def replay(self, batches: list[dict[str, torch.Tensor]]) -> bool:
        """One step if every batch's shape was captured (else False, and nothing ran): this
        step's learning rate and batches into the static tensors, then the graphs (kernel
        launches only: no host sync)."""
        graphs = self._graphs_for(batches)
        if graphs is None:
            return False
        self.step.load_lr(self.lr)
        for batch, (run, static) in zip(batches, graphs):
            for k, v in batch.items():
                static[k].copy_(v)
            run()
            self.step.mark("forward+backward")  # one graph: the two cannot be told apart
        self._update()  # type: ignore[misc]  # (set whenever _graphs_for found graphs)
        self.step.mark("optimizer")
        return True
