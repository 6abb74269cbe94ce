"""Checkpoints written in the background, so a save costs the training step a copy, not
seconds of serialising, hashing and writing.

Why: a base-sized run (weights, AdamW state and the moving average: ~1.7 GB) saved the way
``artifacts.checkpoint.save`` writes it -- ``torch.save`` into memory, a second pass to
hash every entry, then the write -- keeps the training thread busy for seconds every
``train.ckpt_every`` steps while the GPU waits. :class:`BackgroundSaver` splits a save in two:

1. on the training thread, :func:`host_snapshot`: every tensor of the checkpoint copied to
   host memory as it is now (on a GPU into page-locked buffers laid out once, on a side
   stream that first waits for the queued steps; a CPU makes a plain copy). Training goes
   on at once: the next step's forward and backward passes only read the weights and
   overlap the copy; what writes the saved tensors in place -- the update, swapping the
   weights' moving average in -- waits for the copies on the GPU first (no host sync);
2. in one background thread: wait for the copies, then ``CheckpointManager.save`` (the
   same format, checksum, atomic files, retention and pointers as a synchronous save).

At most one save is in flight: a new one first waits for the previous. A save that failed
(a full disk, say) is raised, as the one line the synchronous save would have given, by
the next call (``check`` at the next step, ``save`` or ``wait``); the previous checkpoint
survives as always. ``wait`` (at the end of a run and on a stop signal) returns once the
file is written.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from myxtts.artifacts.runs import CheckpointManager

ALIGN = 512  # bytes between the starts of two entries in a host chunk (any dtype's view)
CHUNK = 64 << 20  # bytes of one page-locked host chunk (a power of two: torch rounds to one)


def _cuda_tensors(value: Any, key: tuple = ()) -> Iterator[tuple[tuple, torch.Tensor]]:
    """(path, tensor) of every CUDA tensor in nested dicts, lists and tuples, in order."""
    if isinstance(value, torch.Tensor):
        if value.device.type == "cuda":
            yield key, value.detach()
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _cuda_tensors(v, (*key, k))
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from _cuda_tensors(v, (*key, i))


def _pinned(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


def _power_of_two(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


class HostBuffers:
    """Page-locked host memory for a checkpoint's GPU tensors, laid out by :meth:`reserve`
    ahead of the first save (so that save does not stall the training thread on the
    allocation and page-locking, about a second per GB) and reused while the checkpoint's
    tensors keep their paths, shapes and dtypes.

    torch's pinned allocator rounds every allocation up to a power of two: one buffer per
    entry, or one for the whole checkpoint, can cost up to twice its bytes. Here the entries
    (each taking a multiple of ``ALIGN`` bytes) are packed, largest first, into the first
    chunk of ``CHUNK`` bytes with room, and each chunk is allocated at the power of two that
    holds what it got: what is lost is the chunks' unfilled ends and the last chunk's
    rounding, not a doubling (an entry larger than a chunk gets a chunk of its own,
    rounded).
    ``alloc``: makes a page-locked byte tensor (tests pass a plain one)."""

    def __init__(self, alloc: Callable[[int], torch.Tensor] = _pinned) -> None:
        self._alloc = alloc
        self._layout: tuple = ()
        self._views: dict[tuple, torch.Tensor] = {}
        self._chunks: list[torch.Tensor] = []

    @property
    def nbytes(self) -> int:
        """Host bytes held (0 before the first layout)."""
        return sum(c.numel() for c in self._chunks)

    def reserve(self, items: list[tuple[tuple, torch.Tensor]]) -> None:
        """Lay the chunks out for these (path, tensor) pairs (nothing if they already are)."""
        layout = tuple((k, tuple(t.shape), t.dtype) for k, t in items)
        if layout == self._layout:
            return
        self.close()
        sizes = [-(-t.numel() * t.element_size() // ALIGN) * ALIGN for _, t in items]
        used: list[int] = []  # bytes taken in each chunk
        place: dict[int, tuple[int, int]] = {}  # entry -> (chunk, offset)
        for i in sorted(range(len(items)), key=lambda i: -sizes[i]):
            k = next((c for c, u in enumerate(used) if u + sizes[i] <= CHUNK), len(used))
            if k == len(used):
                used.append(0)
            place[i], used[k] = (k, used[k]), used[k] + sizes[i]
        self._chunks = [self._alloc(_power_of_two(u)) for u in used]
        for i, (key, t) in enumerate(items):
            k, offset = place[i]
            nbytes = t.numel() * t.element_size()
            self._views[key] = self._chunks[k][offset:offset + nbytes].view(t.dtype).view(t.shape)
        self._layout = layout

    def views(self, items: list[tuple[tuple, torch.Tensor]]) -> dict[tuple, torch.Tensor]:
        """The buffer of each (path, tensor) pair, by path (laid out anew if the tensors
        changed since :meth:`reserve`)."""
        self.reserve(items)
        return self._views

    def close(self) -> None:
        """Give the host memory back (no copy into it may be in flight)."""
        self._chunks, self._views, self._layout = [], {}, ()


def host_snapshot(state: Any, device: torch.device | None, buffers: HostBuffers | None = None,
                  stream: Any = None) -> tuple[Any, Any]:
    """A copy of ``state`` (nested dicts, lists and tuples of tensors and plain values) with
    every tensor in host memory, and the CUDA event that marks the end of the copies (None
    on a CPU, where the copy is done on return). On a CUDA ``device`` its tensors are
    copied into ``buffers`` on ``stream``, which first waits for the current stream's
    queued work; the host does not wait here. Whatever writes one of the copied tensors in
    place must wait for the event first (``stream.wait_event``: a GPU-side wait)."""
    cuda = device is not None and device.type == "cuda"
    targets = buffers.views(list(_cuda_tensors(state))) if cuda and buffers is not None else {}

    def copy(value: Any, key: tuple) -> Any:
        if isinstance(value, torch.Tensor):
            t = value.detach()
            out = targets.get(key)
            if out is not None and t.device.type == "cuda":
                out.copy_(t, non_blocking=True)
                return out
            return t.to("cpu", copy=True)
        if isinstance(value, dict):
            return {k: copy(v, (*key, k)) for k, v in value.items()}
        if isinstance(value, list | tuple):
            items = [copy(v, (*key, i)) for i, v in enumerate(value)]
            return items if isinstance(value, list) else tuple(items)
        return value

    if not cuda:
        return copy(state, ()), None
    stream = stream or torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        out = copy(state, ())
        event = torch.cuda.Event(blocking=True)  # the writer thread sleeps on it, not spins
        event.record(stream)
    return out, event


class BackgroundSaver:
    """Saves through ``manager`` in a background thread (module docstring)."""

    def __init__(self, manager: CheckpointManager, device: torch.device | None = None) -> None:
        self.manager, self.device = manager, device
        self._buffers = HostBuffers()
        self._stream = (torch.cuda.Stream(device)
                        if device is not None and device.type == "cuda" else None)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def reserve(self, state: dict[str, Any]) -> None:
        """Lay out the host buffers for checkpoints like ``state`` now, before training
        starts, instead of at the first save (a GPU run; nothing on a CPU)."""
        if self._stream is not None:
            self._buffers.reserve(list(_cuda_tensors(state)))

    def save(self, state: dict[str, Any], step: int, val_loss: float | None = None,
             is_best: bool = False, writes_after: Callable[[Any], None] | None = None) -> Path:
        """Start saving ``state`` as the checkpoint of ``step``; returns the path it will
        have. Waits for the previous save first (and raises its failure). On a GPU,
        ``writes_after`` is given the event that ends the copies: whatever writes the
        saved tensors in place must wait for it (``TrainEngine.after_copy``); without it,
        the current stream waits for the copies at once."""
        self.wait()
        snapshot, copied = host_snapshot(state, self.device, self._buffers, self._stream)
        if copied is not None:
            if writes_after is not None:
                writes_after(copied)
            else:
                torch.cuda.current_stream(self.device).wait_event(copied)

        def write() -> None:
            try:
                if copied is not None:
                    copied.synchronize()
                self.manager.save(snapshot, step, val_loss, is_best)
            except BaseException as e:  # reported by the training thread: check()
                self._error = e

        self._thread = threading.Thread(target=write, name=f"checkpoint-{step}", daemon=True)
        self._thread.start()
        return self.manager.path_of(step)

    def check(self) -> None:
        """Raise the failure of a save that ended since the last call (the one line a
        synchronous save would have raised); nothing if none failed."""
        if self._thread is not None and not self._thread.is_alive():
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def wait(self, report: bool = True) -> None:
        """Return once no save is in flight; raise the failure of the last one, if any
        (``report`` False: forget it, as a run that is already failing for another reason
        does)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if report:
            self.check()
        self._error = None

    def close(self, report: bool = True) -> None:
        """:meth:`wait`, then give the host buffers back (also when the last save failed)."""
        try:
            self.wait(report)
        finally:
            self._buffers.close()

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
