"""Checkpoints written in the background, so a save costs the training step a copy, not
seconds of serialising, hashing and writing.

Why: a base-sized run (weights, AdamW state and the moving average: ~1.7 GB) saved the way
``artifacts.checkpoint.save`` writes it -- ``torch.save`` into memory, a second pass to
hash every entry, then the write -- keeps the training thread busy for seconds every
``train.ckpt_every`` steps while the GPU waits. :class:`BackgroundSaver` splits a save in two:

1. on the training thread, :func:`host_snapshot`: every tensor of the checkpoint copied to
   host memory as it is now (on a GPU into pinned buffers reused from save to save, on a
   side stream that first waits for the queued steps; the training stream then waits for
   the copies on the GPU -- no host sync -- before the next step changes a weight in place;
   on a CPU a plain copy). Training goes on at once;
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from myxtts.artifacts.runs import CheckpointManager


class HostBuffers:
    """Pinned host tensors reused across saves, one per checkpoint entry (same shape and
    dtype from save to save, so after the first save no host memory is allocated)."""

    def __init__(self) -> None:
        self._buffers: dict[tuple, torch.Tensor] = {}

    def get(self, key: tuple, like: torch.Tensor) -> torch.Tensor:
        buf = self._buffers.get(key)
        if buf is None or buf.shape != like.shape or buf.dtype != like.dtype:
            buf = torch.empty(like.shape, dtype=like.dtype, device="cpu", pin_memory=True)
            self._buffers[key] = buf
        return buf


def host_snapshot(state: Any, device: torch.device | None, buffers: HostBuffers | None = None,
                  stream: Any = None) -> tuple[Any, Callable[[], None]]:
    """A copy of ``state`` (nested dicts, lists and tuples of tensors and plain values) with
    every tensor in host memory, and a function that waits until the copies are done. On a
    CUDA ``device`` the copies of its tensors go into ``buffers`` (pinned) on ``stream``,
    which first waits for the current stream's queued work, and the current stream then
    waits for the copies (GPU-side waits: the host does not wait here)."""
    cuda = device is not None and device.type == "cuda"
    event = None

    def copy(value: Any, key: tuple) -> Any:
        if isinstance(value, torch.Tensor):
            t = value.detach()
            if t.device.type == "cuda" and buffers is not None:
                out = buffers.get(key, t)
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
        return copy(state, ()), lambda: None
    stream = stream or torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        out = copy(state, ())
        event = torch.cuda.Event()
        event.record(stream)
    torch.cuda.current_stream(device).wait_event(event)  # later steps write after the copy
    return out, event.synchronize


class BackgroundSaver:
    """Saves through ``manager`` in a background thread (module docstring)."""

    def __init__(self, manager: CheckpointManager, device: torch.device | None = None) -> None:
        self.manager, self.device = manager, device
        self._buffers = HostBuffers()
        self._stream = (torch.cuda.Stream(device)
                        if device is not None and device.type == "cuda" else None)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def save(self, state: dict[str, Any], step: int, val_loss: float | None = None,
             is_best: bool = False) -> Path:
        """Start saving ``state`` as the checkpoint of ``step``; returns the path it will
        have. Waits for the previous save first (and raises its failure)."""
        self.wait()
        snapshot, ready = host_snapshot(state, self.device, self._buffers, self._stream)

        def write() -> None:
            try:
                ready()
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

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
