"""The feed of host-side batches: counted on the host, copied to the device ahead of use,
cast to the model's dtypes there.

Why: a host->device copy issued on the compute stream serialises with the model (the GPU
idles during the copy, and a blocking copy stalls the Python thread). Here the next
``ahead`` batches are copied on a side CUDA stream from pinned memory with
``non_blocking=True``; the compute stream waits on each copy's event (a GPU-side wait, no
host sync), and every moved tensor is ``record_stream``-ed on the compute stream so the
caching allocator does not reuse its memory while kernels that read it are queued. The cast
(``data.batch.to_model_dtypes``: the float16 mels a store batch travels in) runs on the copy
stream too. On the CPU nothing is copied: the batches pass through, cast. :class:`CopyFeed`
is the store path's ``protocol.DeviceFeed``; validation and the vocoder feed from it too.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from myxtts.data.batch import Batch, to_model_dtypes
from myxtts.data.feed.protocol import real_frames


class CopyFeed:
    """``protocol.DeviceFeed`` of host batches: each ``iter()`` is one pass of ``source``
    (a re-iterable of batch dicts, e.g. one epoch of a loader), yielding ``(batch on device
    in the model's dtypes, real mel frames)``.

    On CUDA up to ``ahead`` batches are in flight: when batch k is handed out, the copy of
    batch k+ahead is issued, so it overlaps the compute of batch k. Other devices copy
    in place (``tensor.to``). ``frames`` counts a host batch's real mel frames before it is
    copied (default ``real_frames``; None: not counted, 0 reported). ``copy_log`` receives a
    (start, end) CUDA event pair per batch around its copy and cast (``myxtts profile``;
    training passes none). Values that are not tensors pass as they are.
    """

    def __init__(self, source: Iterable[Batch], device: str | torch.device, ahead: int = 2,
                 copy_log: list[tuple[Any, Any]] | None = None,
                 frames: Callable[[Batch], int] | None = real_frames) -> None:
        if ahead < 1:
            raise ValueError(f"a feed copies at least 1 batch ahead (data.prefetch_batches), "
                             f"got {ahead}")
        self.source, self.ahead, self.copy_log, self.frames = source, int(ahead), copy_log, frames
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._stream: torch.cuda.Stream | None = None  # the side stream (first CUDA pass)
        # the current pass's (device batch, real frames, copy-done event, host batch)
        self._queue: deque[tuple[Batch, int, Any, Batch]] = deque()
        self._ready: list[int] = []  # copies done whenever the trainer asked (occupancy)

    def __iter__(self) -> Iterator[tuple[Batch, int]]:
        device, count = self.device, self.frames
        if device.type != "cuda":
            for host in self.source:
                n = count(host) if count is not None else 0
                moved = host if device.type == "cpu" else {
                    k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in host.items()}
                yield to_model_dtypes(moved), n
            return
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
        copy, source = self._stream, iter(self.source)
        queue = self._queue = deque()  # this pass's copies (a pass left early drops its own)
        timed, issue, handing = self.copy_log is not None, self.ahead, None
        while True:
            # issue copies: `ahead` at the start, then one per batch handed out (batch
            # k+ahead's copy is issued before batch k is handed out: it overlaps k's compute)
            for host in itertools.islice(source, issue):
                n = count(host) if count is not None else 0
                with torch.cuda.stream(copy):
                    if timed:
                        start = torch.cuda.Event(enable_timing=True)
                        start.record(copy)
                    # non_blocking H2D is only truly async from pinned memory; tensors
                    # already on the GPU pass through .to() (no copy, no stream hop)
                    moved = to_model_dtypes({k: (v if v.is_cuda or v.is_pinned() else
                                                 v.pin_memory()).to(device, non_blocking=True)
                                             if isinstance(v, torch.Tensor) else v
                                             for k, v in host.items()})
                    done = torch.cuda.Event(enable_timing=timed)
                    done.record(copy)
                if timed:
                    self.copy_log.append((start, done))
                queue.append((moved, n, done, host))  # the host batch lives until handed out
            if handing is not None:
                yield handing
            if not queue:
                return
            self._ready.append(sum(1 for entry in queue if entry[2].query()))
            moved, n, done, _held = queue.popleft()  # the host batch: alive until the next
            compute = torch.cuda.current_stream(device)
            compute.wait_event(done)  # GPU-side wait; the host does not block
            for t in moved.values():
                if isinstance(t, torch.Tensor) and t.is_cuda:
                    t.record_stream(compute)
            handing, issue = (moved, n), 1

    def occupancy(self) -> float | None:
        """Batches whose copies had finished whenever the trainer asked for one, averaged
        since the last call (``ahead``: the copies stay ahead of the step; 0: the step waits
        for its batch's copy). None on the CPU, where nothing is copied ahead."""
        if self.device.type != "cuda":
            return None
        ready, self._ready = self._ready, []
        return sum(ready) / len(ready) if ready else 0.0

    def close(self) -> None:
        """Drop the batches copied ahead (their device memory) once their copies are done."""
        if self._stream is not None:
            self._stream.synchronize()
        self._queue.clear()
