"""Shared-memory batch slots: how a loader worker's finished batch reaches the training process.

Why: by default a worker's batch reaches the main process through a NEW shared-memory
segment per tensor per batch; creating, faulting in, mapping and unmapping ~10 MB of fresh
pages every batch costs far more than assembling the batch (measured: ~25 ms vs ~3 ms per
LJSpeech batch on a 2-core VM). Here each worker owns a few preallocated shared slots,
builds every batch straight into a free one (``Slots.write``: a store's batch is built there,
``dataset.StoreBatches``; an on-the-fly collate function's batch is copied in,
:class:`SlotCollator`) and sends only a descriptor.

What the training process does with a slot's batch:
- training on the CPU: hands out tensors that ARE the slot (no copy; a 5 MB copy per batch
  cost 0.8 ms, as much as building the batch). The slot goes back to its worker once
  nothing holds any of the batch's arrays (``buffers.unreferenced``, what ``BufferPool``
  reuses its buffers by), checked at every batch taken;
- training on a GPU: copies the batch into pinned memory (an asynchronous copy to the GPU
  needs it) and gives the slot back at once.

Who writes what: a slot's header is 0 (free), -1 (being written) or the batch's sequence
number. Only the worker moves a slot from free to written, only the training process moves
it back to free, so a worker never writes a slot whose batch is still held or not yet taken.
A worker whose slots are all held (a consumer that keeps every batch, ``list(loader)``)
sends a batch of its own memory instead: slower, never wrong. Batches a pass dropped
unread (a pass left early) are reclaimed when a later batch of the same worker arrives:
each worker's batches arrive in the order it made them.
"""

from __future__ import annotations

import functools
import math
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import DataLoader, get_worker_info

from myxtts.config import ConfigError
from myxtts.data.batch import Batch, BatchShape, numpy_dtype, round_up
from myxtts.data.feed.buffers import Specs, unreferenced

PREFETCH_PER_WORKER = 2  # tasks (a batch, or a group of them) requested ahead from each worker
# Slots beyond a worker's batches in flight: the batches the training process holds (the
# one in use, the one before it until the next is taken, a feed's prefetch). Fewer free
# slots cost speed, never correctness (see the module doc).
HELD_SLOTS = 3


def slots_per_worker(group: int = 1) -> int:
    """Shared slots each worker owns when ``group`` batches travel per task."""
    return group * PREFETCH_PER_WORKER + HELD_SLOTS


SHM = Path("/dev/shm")  # where the slots live on Linux (torch's shared memory)


def check_shared_memory(per_slot: int, group: int, workers: int, shm: Path = SHM) -> None:
    """Before any worker starts: the slots ``workers`` workers own fit the free shared
    memory, else a ConfigError in one line with the fix (the check ``myxtts doctor``
    makes). Without it the first worker to fill a slot dies of a bus error mid-epoch."""
    if workers == 0 or not shm.is_dir():
        return
    need = per_slot * slots_per_worker(group) * workers
    free = shutil.disk_usage(shm).free
    if need > free:
        raise ConfigError(f"{shm} has {free / 2**20:.0f} MiB free, and {workers} loader "
                          f"worker(s) need ~{need / 2**20:.0f} MiB of shared batch slots "
                          f"({slots_per_worker(group)} of {per_slot / 2**20:.1f} MiB each); use "
                          f"--num-workers 0 (no shared memory), or a larger {shm} (Docker: "
                          f"docker run --shm-size=8g)")


ALIGN = 64  # byte alignment of every tensor inside a slot
FREE, WRITING = 0, -1  # header values; a written slot holds its batch's sequence number (> 0)


def slot_bytes(plan: Any, n_mels: int, ref_frames: int, transfer: bool = False) -> int:
    """Bytes of the largest batch of a bucket plan (``buckets.BucketPlan``)."""
    return max(BatchShape(batch, l_text, t_mel, ref_frames, n_mels).nbytes(ALIGN, transfer)
               for t_mel, l_text, batch in zip(plan.boundaries, plan.text_caps, plan.batch_sizes))


class SlotRef(NamedTuple):
    """What a worker sends for a batch it wrote into a slot."""

    worker: int
    slot: int
    seq: int
    layout: tuple[tuple[str, torch.dtype, tuple[int, ...], int], ...]  # key, dtype, shape, offset


Build = Callable[[Callable[[Specs], dict[str, np.ndarray] | None] | None], Batch | None]


class Slots:
    """Every loader worker's shared batch slots (allocated in the training process before the
    workers start: they inherit the segments). Worker side :meth:`write`, training-process
    side :meth:`take` (:meth:`receive` for a whole pass of a DataLoader)."""

    def __init__(self, slot_bytes: int, group: int = 1) -> None:
        self.slot_bytes = int(slot_bytes)
        self.slots = slots_per_worker(group)
        self.buffers: torch.Tensor | None = None  # uint8 [workers, slots, slot_bytes], shared
        self.headers: torch.Tensor | None = None  # int64 [workers, slots], shared
        self._count = 0  # batches written by this process (a worker)
        self._held: dict[tuple[int, int], tuple[np.ndarray, ...]] = {}  # training process
        self._np: tuple[np.ndarray, np.ndarray] | None = None  # this process's numpy views

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_held", "_np")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._held, self._np = {}, None

    def allocate(self, workers: int, slots: int | None = None) -> None:
        """Called in the main process before the workers start (they inherit the segments)."""
        slots = self.slots if slots is None else slots
        self.buffers = torch.empty((workers, slots, self.slot_bytes), dtype=torch.uint8).share_memory_()
        self.headers = torch.zeros((workers, slots), dtype=torch.int64).share_memory_()
        self._held, self._np = {}, None

    def _views(self) -> tuple[np.ndarray, np.ndarray]:
        if self._np is None:
            self._np = (self.buffers.numpy(), self.headers.numpy())
        return self._np

    # ------------------------------------------------------------ worker side

    def write(self, build: Build) -> Batch | SlotRef | None:
        """``build(alloc)``'s batch in this worker's next free slot: ``alloc(specs)`` (every
        field's shape and dtype) gives the slot's arrays to build in, or None where they do not
        fit. Returns the batch's ``SlotRef``, or the batch in memory of its own where no slot
        is free (every slot held by the training process) or it did not fit; outside a worker
        (or before the slots exist) ``build(None)``'s batch."""
        info = get_worker_info()
        if info is None or self.buffers is None:
            return build(None)
        buffers, headers = self._views()
        header = headers[info.id]
        free = np.flatnonzero(header == FREE)
        if not len(free):  # every slot held by the training process: memory of its own
            return _owned(build(None))
        k = int(free[0])
        header[k] = WRITING
        slot = buffers[info.id, k]
        layout: list[tuple[str, torch.dtype, tuple[int, ...], int]] = []
        try:
            batch = build(lambda specs: _place(slot, specs, layout))
        except BaseException:
            header[k] = FREE  # the error reaches the training process; the slot stays usable
            raise
        if batch is None or not layout:  # nothing to send, or larger than a slot
            header[k] = FREE
            return batch if batch is None else _owned(batch)
        self._count += 1
        header[k] = self._count
        return SlotRef(info.id, k, self._count, tuple(layout))

    # ------------------------------------------------------------ training-process side

    def take(self, ref: SlotRef, pin: bool) -> Batch:
        """The batch ``ref`` names: copied into pinned memory (``pin``; the slot is free
        again at once), else the slot's own memory, held until the consumer drops it."""
        buffers, headers = self._views()
        header = headers[ref.worker]
        if int(header[ref.slot]) != ref.seq:
            raise RuntimeError(f"loader slot {ref.worker}/{ref.slot} was overwritten before it was "
                               f"read (internal error; set data.num_workers=0 to bypass)")
        self._release_dropped()
        self._reclaim_skipped(ref)
        slot = buffers[ref.worker, ref.slot]
        views = {key: slot[off:off + math.prod(shape) * dtype.itemsize]
                 .view(numpy_dtype(dtype)).reshape(shape) for key, dtype, shape, off in ref.layout}
        if not pin:
            self._held[ref.worker, ref.slot] = tuple(views.values())
            return {key: torch.from_numpy(a) for key, a in views.items()}  # type: ignore[return-value]
        # CUDA's caching host allocator recycles pinned blocks
        batch = {key: torch.empty(a.shape, dtype=dtype, pin_memory=True)
                 for (key, dtype, _, _), a in zip(ref.layout, views.values())}
        for key, a in views.items():
            np.copyto(batch[key].numpy(), a)
        header[ref.slot] = FREE
        return batch  # type: ignore[return-value]

    def _release_dropped(self) -> None:
        """Give back every held slot whose batch the consumer no longer references."""
        if not self._held:
            return
        headers = self._views()[1]
        for key in [key for key, arrays in self._held.items() if unreferenced(arrays)]:
            del self._held[key]
            headers[key] = FREE

    def _reclaim_skipped(self, ref: SlotRef) -> None:
        """Free this worker's slots whose batches were made before ``ref``'s and never taken
        (dropped with a pass left early): its batches arrive in the order it made them."""
        header = self._views()[1][ref.worker]
        for k in np.flatnonzero((header > 0) & (header < ref.seq)).tolist():
            if (ref.worker, k) not in self._held:
                header[k] = FREE

    def held(self) -> int:
        """Slots whose batches the consumer still holds (as of the last batch taken)."""
        return len(self._held)

    def receive(self, dataloader: DataLoader, pin: bool, grouped: bool = False
                ) -> Iterator[Batch | None]:
        """One pass of ``dataloader``, whose workers write into these slots, batches taken out
        of them (``grouped``: each task's result is a list of several batches'). The slots are
        allocated on the first pass, before the workers start."""
        if self.buffers is None:
            self.allocate(dataloader.num_workers)
        for task in dataloader:
            for out in task if grouped else (task,):
                if isinstance(out, SlotRef):  # else a batch in memory of its own, or None
                    yield self.take(out, pin)
                elif pin and out is not None:
                    yield {k: v.pin_memory() for k, v in out.items()}  # type: ignore[misc]
                else:
                    yield out


class SlotCollator:
    """``collate_fn`` for loader workers: the wrapped collate function's batch (or None),
    copied into this worker's next free slot of ``slots``."""

    def __init__(self, collator: Callable[[Any], Batch | None], slots: Slots) -> None:
        self.collator, self.slots = collator, slots

    def __call__(self, items: Any) -> Batch | SlotRef | None:
        return self.slots.write(functools.partial(self._copied, items))

    def _copied(self, items: Any, alloc: Callable[[Specs], dict[str, np.ndarray] | None] | None
                ) -> Batch | None:
        batch = self.collator(items)
        if batch is not None and alloc is not None:
            arrays = alloc({key: (tuple(t.shape), t.dtype) for key, t in batch.items()})
            if arrays is not None:
                for key, t in batch.items():
                    # numpy copies: one thread, no OpenMP pool wake-up (torch's copy_ with a
                    # busy second core measures 15x slower than memcpy speed).
                    np.copyto(arrays[key], t.numpy())
        return batch


def _place(slot: np.ndarray, specs: Specs, layout: list) -> dict[str, np.ndarray] | None:
    """Views of ``slot`` for these fields, each ``ALIGN``-aligned, their layout appended to
    ``layout``; None where they do not fit (cannot happen with the sampler's shapes)."""
    sizes = [math.prod(shape) * dt.itemsize for shape, dt in specs.values()]
    if sum(round_up(n, ALIGN) for n in sizes) > len(slot):
        return None
    arrays, offset = {}, 0
    for (key, (shape, dt)), n in zip(specs.items(), sizes):
        arrays[key] = slot[offset:offset + n].view(numpy_dtype(dt)).reshape(shape)
        layout.append((key, dt, tuple(shape), offset))
        offset += round_up(n, ALIGN)
    return arrays


def _owned(batch: Batch | None) -> Batch | None:
    """A batch in memory of its own (collators may build into pooled buffers they reuse)."""
    return None if batch is None else {k: v.clone() for k, v in batch.items()}  # type: ignore[return-value]
