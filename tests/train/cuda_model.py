"""A CPU model of the part of torch's CUDA runtime that graph capture touches, so what a
failed capture leaves behind is tested without a GPU.

What it models, as torch's sources have it (``torch/cuda/graphs.py``'s ``graph``,
``CUDAGraph::capture_begin/capture_end/reset``, the caching allocator's capture
bookkeeping, and torch 2.11's ``CUDAGeneratorState``):

* ``graph.__enter__`` makes the capture stream current, counts a use of the pool (a new
  pool: one use; an existing one: +1, and torch asserts it still had a use), puts the pool
  on the allocator's list of captures underway and, in torch 2.11, marks the generator
  "capturing";
* a sync while the current stream captures invalidates the capture (as CUDA does);
* ``graph.__exit__`` ends the capture. When ``cudaStreamEndCapture`` fails (an invalidated
  capture, or ``end_fails``), it raises there: the thread's stream stays the capture
  stream, the pool stays underway with its use counted, the generator stays marked. When
  the stream check before it fails (``stream_check_fails``), the stream is even still
  capturing. Otherwise the capture ends: the pool leaves the list, the generator's mark is
  cleared, the stream is put back, and the graph holds its use of the pool until it is
  destroyed (``CUDAGraph::reset``);
* ``_cuda_endAllocateToPool`` takes a pool off the list or raises "not currently
  recording"; ``_cuda_releasePool`` gives a use back (it must not go below zero);
* a random draw (:meth:`draw`, put in place of ``graphs._draws``) refuses while the
  generator is marked and no capture runs, as torch 2.11's ``increase()`` does, and moves
  the Philox offset otherwise.
"""

from __future__ import annotations

import contextlib
import itertools

import torch

STUCK = "Offset increment outside graph capture encountered unexpectedly."


class Stream:
    def __init__(self, name: str = "side", *a, **k) -> None:
        self.name = name

    def wait_stream(self, other) -> None:
        pass

    def __repr__(self) -> str:
        return f"Stream({self.name})"


class CudaModel:
    """Installs itself over torch's CUDA calls (``monkeypatch``); ``torch211``: the
    generator keeps a capture mark that only a successful capture clears."""

    def __init__(self, monkeypatch, torch211: bool = True) -> None:
        self.default = self.current = Stream("default")
        self.uses: dict[tuple, int] = {}  # pool -> uses counted by the allocator
        self.underway: list[tuple] = []  # pools a capture allocates into
        self.capturing: Stream | None = None
        self.invalidated = False  # the capture running now was broken (a sync inside it)
        self.torch211, self.marked = torch211, False
        self.rng = (7, 0)  # seed, Philox offset
        self.end_fails = 0  # the next N captures fail at cudaStreamEndCapture
        self.stream_check_fails = 0  # the next N fail before it: the stream keeps capturing
        self.heal_fails = False  # a capture of no random op fails too (the device is gone)
        self.log: list[tuple] = []
        self._ids = itertools.count(1)
        model = self

        class Graph:
            def __init__(self, *a, **k) -> None:
                self.pool = None

            def replay(self) -> None:
                model.log.append(("replay",))

            def __del__(self) -> None:  # CUDAGraph::reset: the capture ended, its use goes
                if self.pool is not None:
                    model.uses[self.pool] -= 1

        class GraphContext:
            def __init__(self, graph, pool=None, stream=None, **k) -> None:
                self.graph, self.stream = graph, stream
                self.pool = pool if pool is not None else ("private", next(model._ids))

            def __enter__(self) -> None:
                self.before = model.current
                model.current = self.stream
                if self.pool in model.uses:
                    assert model.uses[self.pool] > 0, "INTERNAL ASSERT FAILED: use_count > 0"
                    model.uses[self.pool] += 1
                else:
                    model.uses[self.pool] = 1
                model.underway.append(self.pool)
                model.capturing = self.stream
                model.marked = model.marked or model.torch211
                model.log.append(("begin", self.pool))

            def __exit__(self, *exc) -> None:
                if model.stream_check_fails:
                    model.stream_check_fails -= 1
                    raise RuntimeError("Capture must end on the same stream it began on.")
                if model.end_fails or model.heal_fails or model.invalidated:
                    model.end_fails = max(0, model.end_fails - 1)
                    model.capturing, model.invalidated = None, False  # EndCapture ends it
                    raise RuntimeError("CUDA error: operation not permitted when stream is "
                                       "capturing")
                model.capturing = None
                model.underway.remove(self.pool)
                model.marked = False
                self.graph.pool = self.pool
                model.current = self.before
                model.log.append(("end", self.pool))

        @contextlib.contextmanager
        def stream(s):
            before, model.current = model.current, s
            try:
                yield
            finally:
                model.current = before

        def end_allocate(device, pool) -> None:
            if pool not in model.underway:
                raise RuntimeError("endAllocatePool: not currently recording to mempool_id")
            model.underway.remove(pool)
            model.log.append(("end_allocate", pool))

        def release_pool(device, pool) -> None:
            model.uses[pool] -= 1
            assert model.uses[pool] >= 0, "INTERNAL ASSERT FAILED: uc >= 0"
            model.log.append(("release", pool))

        def set_stream(s) -> None:
            model.current = s

        def synchronize(device=None) -> None:
            if model.capturing is not None and model.capturing is model.current:
                model.invalidated = True

        cuda = torch.cuda
        for name, value in {
            "graph_pool_handle": lambda: ("pool", next(model._ids)),
            "Stream": Stream, "current_stream": lambda device=None: model.current,
            "default_stream": lambda device=None: model.default,
            "set_stream": set_stream, "stream": stream, "CUDAGraph": Graph,
            "graph": GraphContext, "current_device": lambda: 0,
            "is_current_stream_capturing": lambda: model.capturing is not None
            and model.capturing is model.current,
            "synchronize": synchronize, "empty_cache": lambda: None,
            "get_rng_state": lambda device=None: torch.tensor(model.rng),
            "set_rng_state": lambda state, device=None: setattr(
                model, "rng", tuple(int(x) for x in state)),
        }.items():
            monkeypatch.setattr(cuda, name, value)
        monkeypatch.setattr(torch._C, "_cuda_endAllocateToPool", end_allocate, raising=False)
        monkeypatch.setattr(torch._C, "_cuda_releasePool", release_pool, raising=False)

    def draw(self, device) -> str | None:
        """A random draw on the device (``graphs._draws``): the error, or None."""
        if self.marked and self.capturing is None:
            return STUCK
        self.rng = (self.rng[0], self.rng[1] + 4)
        return None
