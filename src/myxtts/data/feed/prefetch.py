"""Copy upcoming batches to the GPU while the current one computes.

Why: a host->device copy issued on the compute stream serialises with the model (the GPU
idles during the copy, and a blocking copy stalls the Python thread). Here the next
``num_batches`` batches are copied on a side CUDA stream from pinned memory with
``non_blocking=True``; the compute stream waits on each copy's event (a GPU-side wait, no
host sync), and every moved tensor is ``record_stream``-ed on the compute stream so the
caching allocator does not reuse its memory while kernels that read it are queued. On the
CPU the prefetcher is a pass-through. :class:`PrefetchFeed` is the store path's
``feed.DeviceFeed``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from myxtts.data.batch import Batch, to_model_dtypes
from myxtts.data.feed.protocol import real_frames


def _map_tensors(obj: Any, fn: Any) -> Any:
    """Apply ``fn`` to every tensor inside dicts / lists / tuples; other values pass."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_map_tensors(v, fn) for v in obj]
    if isinstance(obj, tuple):
        mapped = [_map_tensors(v, fn) for v in obj]
        return type(obj)(*mapped) if hasattr(obj, "_fields") else tuple(mapped)
    return obj


def _each_tensor(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _each_tensor(v)
    elif isinstance(obj, list | tuple):
        for v in obj:
            yield from _each_tensor(v)


class DevicePrefetcher:
    """Iterate ``iterable`` with its batches already on ``device``.

    On CUDA up to ``num_batches`` batches are in flight: when batch k is handed out, the
    copy of batch k+num_batches is issued, so it overlaps the compute of batch k.
    Each ``iter()`` starts a fresh pass over ``iterable`` (one epoch of a DataLoader).
    ``transform`` runs on each batch on the device, on the copy stream (the trainer's casts
    the float16 mels to float32 there). ``copy_log`` receives a (start, end) CUDA event pair
    per batch around its copy and transform (``myxtts profile``; training passes none).
    """

    def __init__(self, iterable: Iterable[Any], device: str | torch.device,
                 num_batches: int = 2, transform: Callable[[Any], Any] | None = None,
                 copy_log: list[tuple[Any, Any]] | None = None) -> None:
        if num_batches < 1:
            raise ValueError(f"num_batches must be >= 1 (data.prefetch_batches), got {num_batches}")
        self.iterable = iterable
        self.device = torch.device(device)
        self.num_batches = int(num_batches)
        self.transform = transform
        self.copy_log = copy_log

    def __len__(self) -> int:
        return len(self.iterable)  # type: ignore[arg-type]  # TypeError if it has none

    def __iter__(self) -> Iterator[Any]:
        if self.device.type == "cuda":
            return self._cuda_iter()
        if self.device.type == "cpu":
            batches: Iterable[Any] = self.iterable
        else:
            batches = (_map_tensors(b, lambda t: t.to(self.device)) for b in self.iterable)
        return iter(batches) if self.transform is None else map(self.transform, batches)

    def _cuda_iter(self) -> Iterator[Any]:
        device = self.device
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        copy_stream = torch.cuda.Stream(device)
        source = iter(self.iterable)
        # Each entry: (batch on device, copy-done event, host batch kept alive until used).
        # Tensors already on the GPU are passed through by .to() (no copy, no stream hop).
        queue: deque[tuple[Any, torch.cuda.Event, Any]] = deque()

        def to_device(t: torch.Tensor) -> torch.Tensor:
            if t.device.type == "cpu" and not t.is_pinned():
                t = t.pin_memory()  # non_blocking H2D is only truly async from pinned memory
            return t.to(device, non_blocking=True)

        def issue() -> bool:
            try:
                host = next(source)
            except StopIteration:
                return False
            timed = self.copy_log is not None
            with torch.cuda.stream(copy_stream):
                if timed:
                    start = torch.cuda.Event(enable_timing=True)
                    start.record(copy_stream)
                moved = _map_tensors(host, to_device)
                if self.transform is not None:
                    moved = self.transform(moved)
                done = torch.cuda.Event(enable_timing=timed)
                done.record(copy_stream)
            if timed:
                self.copy_log.append((start, done))
            queue.append((moved, done, host))
            return True

        for _ in range(self.num_batches):
            if not issue():
                break
        while queue:
            moved, done, _host = queue.popleft()
            compute = torch.cuda.current_stream(device)
            compute.wait_event(done)  # GPU-side wait; the host does not block
            for t in _each_tensor(moved):
                if t.device.type == "cuda":
                    t.record_stream(compute)
            issue()  # overlap the next copy with this batch's compute
            yield moved


class _Counted:
    """Re-iterable: each pass of ``loader`` as ``(batch, real frames)`` pairs."""

    def __init__(self, loader: Iterable[Batch]) -> None:
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[tuple[Batch, int]]:
        for batch in self.loader:
            yield batch, real_frames(batch)


def _model_dtypes(pair: tuple[Batch, int]) -> tuple[Batch, int]:
    batch, frames = pair
    return to_model_dtypes(batch), frames  # type: ignore[return-value]


class PrefetchFeed:
    """``feed.DeviceFeed`` of a host-side loader (the store path): each pass copies the
    loader's batches to ``device`` ahead of use (:class:`DevicePrefetcher`, ``num_batches``
    in flight) and casts them to the model's dtypes on the copy stream. Nothing runs between
    passes, so ``close`` has nothing to stop and there are no slots to report."""

    def __init__(self, loader: Iterable[Batch], device: str | torch.device, num_batches: int = 2,
                 copy_log: list[tuple[Any, Any]] | None = None) -> None:
        self.prefetcher = DevicePrefetcher(_Counted(loader), device, num_batches, _model_dtypes,
                                           copy_log)

    def __iter__(self) -> Iterator[tuple[Batch, int]]:
        return iter(self.prefetcher)

    def close(self) -> None:
        pass

    def occupancy(self) -> float | None:
        return None
