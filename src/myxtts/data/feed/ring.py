"""A ring of pre-allocated batch slots between a data role and the training device.

Why: with features computed on the fly, the data role (CPU or a GPU of its own) must run
beside the training step. A producer thread pulls loader batches, optionally transforms them
on the data device in a stream of its own, and copies each into one of K slots allocated
once on the training device (``data.ring_slots``, default 3: one trained on, one in
transfer, one being filled). No host sync per batch: "ready" and "released" CUDA events
order the copy and training streams; the host threads only pass slot numbers. Both roles on
the CPU use slots too (~1.5 % of a tiny CPU step, ``benchmarks/data_roles.py``), so CI tests
the bookkeeping the GPU path relies on. The producer runs ahead across epochs; a checkpoint
keeps the trainer's consumed batches, so resume is unaffected.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from myxtts.data.batch import to_model_dtypes
from myxtts.data.feed.protocol import real_frames

_END = object()  # end of one pass of the source


class SlotRing:
    """The on-the-fly path's ``feed.DeviceFeed``: ``iter(ring)`` is one pass of ``source``,
    yielding ``(batch, real_frames)`` (``frames`` counts the host item before ``transform``).

    ``hold``: handed-out batches the consumer uses at once (gradient accumulation); taking
    batch n releases batch n - hold, so the ring has ``slots + hold - 1`` slots. Slots grow
    to the largest batch seen; each batch is a contiguous view of its slot. ``copy_log``
    receives a (start, end) event pair per copy (``myxtts profile``)."""

    def __init__(self, source: Iterable[Any], device: torch.device, *, slots: int = 3,
                 hold: int = 1, transform: Callable[[Any, torch.device], dict] | None = None,
                 data_device: torch.device | None = None,
                 copy_log: list[tuple[Any, Any]] | None = None,
                 frames: Callable[[Any], int] = real_frames) -> None:
        if slots < 2:
            raise ValueError(f"a ring needs at least 2 slots (data.ring_slots), got {slots}")
        self.source, self.device = source, torch.device(device)
        self.data_device = torch.device(data_device) if data_device is not None else self.device
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if self.data_device.type == "cuda" and self.data_device.index is None:
            self.data_device = torch.device("cuda", torch.cuda.current_device())
        self.transform, self.hold, self.frames = transform, max(1, int(hold)), frames
        self.n_slots = int(slots) + self.hold - 1
        self._buffers: list[dict[str, torch.Tensor]] = [{} for _ in range(self.n_slots)]
        self._released: list[Any] = [None] * self.n_slots  # CUDA event per slot, or None
        self._free: queue.Queue[int] = queue.Queue()
        for i in range(self.n_slots):
            self._free.put(i)
        self._ready: queue.Queue[Any] = queue.Queue()
        self._held: deque[int] = deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cuda = self.device.type == "cuda"
        if self._cuda:
            self._compute = torch.cuda.current_stream(self.device)  # the trainer's stream
            self._copy = torch.cuda.Stream(self.device)
        self._data_stream = (torch.cuda.Stream(self.data_device)
                             if self.data_device.type == "cuda" else None)
        self.copy_log = copy_log  # (start, end) timing events per copy (``myxtts profile``)
        self._ready_counts: list[int] = []

    # ------------------------------------------------------------------ consumer side

    def __iter__(self) -> Iterator[tuple[dict[str, Any], int]]:
        """One pass of the source as ``(batch in its slot, real frames)``, the batch in the
        model's dtypes (the producer starts on the first call)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._produce, name="myxtts-data-ring",
                                            daemon=True)
            self._thread.start()
        while True:
            self._ready_counts.append(self._ready.qsize())  # before a slot is handed back
            if len(self._held) >= self.hold:
                self._release(self._held.popleft())
            item = self._ready.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                self.close()
                raise item
            slot, batch, event, n_frames = item
            if event is not None:
                self._compute.wait_event(event)  # GPU-side: the host does not wait
            self._held.append(slot)
            yield to_model_dtypes(batch), n_frames

    def _release(self, slot: int) -> None:
        if self._cuda:
            event = torch.cuda.Event()
            event.record(self._compute)  # after every step queued so far that read the slot
            self._released[slot] = event
        self._free.put(slot)

    def occupancy(self) -> float:
        """Mean number of filled slots waiting whenever the trainer asked for a batch, since
        the last call (0: the trainer waited for data; ``data.ring_slots - 1``: the data
        role is as far ahead as the slots the trainer does not hold allow)."""
        counts, self._ready_counts = self._ready_counts, []
        return sum(counts) / len(counts) if counts else 0.0

    def close(self) -> None:
        """Stop the producer (it finishes the batch in hand) and wait for it."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            while self._thread.is_alive():
                try:  # unblock a producer waiting for a free slot or stuck behind a full queue
                    self._free.put_nowait(-1)
                except queue.Full:
                    pass
                self._thread.join(timeout=0.05)
        if self._cuda:
            self._copy.synchronize()  # slot memory may be freed after this

    def __del__(self) -> None:
        self._stop.set()

    # ------------------------------------------------------------------ producer side

    def _produce(self) -> None:
        if self._cuda:  # the current GPU is per thread: without this, the DataLoader's pinning
            torch.cuda.set_device(self.device)  # and any stray call would open a context on GPU 0
        try:
            while not self._stop.is_set():
                produced_any = False
                for item in self.source:
                    if self._stop.is_set():
                        return
                    if item is None:  # every clip of the batch failed to load (warned)
                        continue
                    slot = self._free.get()
                    if slot < 0 or self._stop.is_set():
                        return
                    self._ready.put(self._fill(slot, item))
                    produced_any = True
                if not produced_any:
                    raise RuntimeError("a whole pass over the training data gave no batch (every "
                                       "clip of it failed to load: see the warnings above)")
                self._ready.put(_END)
        except BaseException as e:  # surfaces in the training thread
            self._ready.put(e)

    def _fill(self, slot: int, item: Any) -> tuple[int, dict[str, Any], Any, int]:
        n_frames = self.frames(item)  # on the host item, before any transform
        if self.transform is not None:
            if self._data_stream is not None:
                with torch.cuda.stream(self._data_stream):
                    item = self.transform(item, self.data_device)
            else:
                item = self.transform(item, self.data_device)
        if not self._cuda:
            return slot, self._copy_into(slot, item), None, n_frames
        if self._released[slot] is not None:
            self._copy.wait_event(self._released[slot])
        timed = self.copy_log is not None
        with torch.cuda.stream(self._copy):
            if timed:
                start = torch.cuda.Event(enable_timing=True)
                start.record(self._copy)
            if self._data_stream is not None and self._data_stream.device != self.device:
                with torch.cuda.stream(self._data_stream):  # cross-GPU copies order on both
                    batch = self._copy_into(slot, item)
            else:
                if self._data_stream is not None:  # same GPU: wait for the features, and
                    self._copy.wait_stream(self._data_stream)  # keep them until copied
                    for value in item.values():
                        if isinstance(value, torch.Tensor) and value.device.type == "cuda":
                            value.record_stream(self._copy)
                batch = self._copy_into(slot, item)
            event = torch.cuda.Event(enable_timing=timed)
            event.record(self._copy)
        if timed:
            self.copy_log.append((start, event))
        return slot, batch, event, n_frames

    def _copy_into(self, slot: int, item: dict[str, Any]) -> dict[str, Any]:
        buffers, out = self._buffers[slot], {}
        for key, value in item.items():
            if not isinstance(value, torch.Tensor):
                out[key] = value
                continue
            buf = buffers.get(key)
            if buf is None or buf.numel() < value.numel() or buf.dtype != value.dtype:
                buf = self._allocate(value)
                buffers[key] = buf
            view = buf[:value.numel()].view(value.shape)
            if value.device.type == "cpu" and self._cuda and not value.is_pinned():
                value = value.pin_memory()  # an async host->device copy needs pinned memory
            view.copy_(value, non_blocking=self._cuda)
            out[key] = view
        return out

    def _allocate(self, like: torch.Tensor) -> torch.Tensor:
        if not self._cuda:
            return torch.empty(like.numel(), dtype=like.dtype)
        # Allocated on the copy stream, which writes it first: the caching allocator hands a
        # stream only blocks freed on that same stream, whose earlier work is ordered before
        # the copy. (From the trainer's stream it could get a block a queued step still
        # reads -- the copy stream is not ordered after that step.) The trainer reads the
        # slot too: record_stream keeps the block from reuse until that reading is done.
        with torch.cuda.stream(self._copy):
            buf = torch.empty(like.numel(), dtype=like.dtype, device=self.device)
        buf.record_stream(self._compute)
        return buf
