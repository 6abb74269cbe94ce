"""What every trainer's run shares: the folder lock, the stop signal, seeding and the result.

Every recipe (``train.recipe``: ``myxtts train``, ``myxtts train-vocoder``) runs through
``locked_run`` (one writer per run folder), stops at a step boundary on SIGINT/SIGTERM
(``StopFlag``), seeds Python, NumPy and torch the same way (``seed_everything``), checks
the weights before every save (``check_finite_weights``), takes each step's batches from
its feed, timed as data wait (``next_micro``), and returns a ``TrainResult``.
"""

from __future__ import annotations

import logging
import os
import random
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from myxtts.data.batch import Batch
from myxtts.observe.meters import StepTimer
from myxtts.system import FolderError, folder_lock
from myxtts.train.errors import TrainError

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    step: int
    output_dir: Path
    last_checkpoint: Path | None
    best_val_loss: float
    stopped_by: int | None = None  # the signal that stopped the run (it saved first), if one
    skipped_steps: int = 0  # steps skipped for a non-finite loss or gradient, in the whole run

    @property
    def stopped_by_signal(self) -> bool:
        return self.stopped_by is not None


class StopFlag:
    """SIGINT/SIGTERM, and SIGHUP (the terminal closed) unless the run was started to ignore it
    (``nohup``), set a flag; the loop saves a checkpoint and exits at a step boundary."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopFlag:
        hangup = getattr(signal, "SIGHUP", None)  # not on Windows
        for s in (signal.SIGINT, signal.SIGTERM, hangup):
            if s is None or (s == hangup and signal.getsignal(s) is signal.SIG_IGN):
                continue
            try:
                self._old[s] = signal.signal(s, self._handle)
            except ValueError:  # not the main thread (e.g. inside some test runners)
                pass
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None:  # second signal: stop now
            raise KeyboardInterrupt
        self.signum = signum
        log.warning("received %s: saving a checkpoint at the end of this step",
                    signal.Signals(signum).name)

    def __exit__(self, *exc: Any) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


def locked_run(output_dir: str | Path, command: str, fn: Any, *args: Any) -> Any:
    """``fn(*args)`` while this process holds the run folder's lock (``system.folder_lock``):
    a second run into the same folder is a one-line error naming the running one. Under
    DDP rank 0 alone writes the folder, so it alone holds the lock."""
    if int(os.environ.get("RANK", "0")) != 0:
        return fn(*args)
    try:
        with folder_lock(output_dir, command):
            return fn(*args)
    except FolderError as e:
        raise TrainError(f"{e} (--output-dir)") from None


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def check_finite_weights(modules: list[torch.nn.Module], step: int, fix: str) -> None:
    """TrainError naming the step unless every weight of ``modules`` is finite (one host read,
    at checkpoints only): weights that overflowed are never saved as a checkpoint to resume
    or synthesise from. ``fix`` says what to change (the learning rate key, its value)."""
    params = [p.detach() for m in modules for p in m.parameters()]
    bad = int(torch.stack([(~torch.isfinite(p)).sum() for p in params]).sum()) if params else 0
    if bad:
        total = sum(p.numel() for p in params)
        raise TrainError(f"{bad} of {total} weights are non-finite at step {step}; not saved "
                         f"(the last checkpoint stays the newest). The updates diverged: {fix}")


def next_micro(stream: Iterator[tuple[Batch, int]], timer: StepTimer, accum: int,
               stopped: Callable[[], bool] | None = None) -> tuple[list[Batch], int] | None:
    """The micro-batches of one optimizer step (``train.grad_accum_steps``) from ``stream``
    and their real frames, each fetch timed as data wait. None when ``stopped()`` says so
    between two micro-batches: a long accumulation cycle is not waited out after a signal."""
    micro, frames = [], 0
    for k in range(accum):
        if k and stopped is not None and stopped():
            return None
        timer.wait_begin()
        batch, n_frames = next(stream)
        timer.wait_end()
        micro.append(batch)
        frames += n_frames
    return micro, frames


def counted_passes(feed: Any, record: Any) -> Iterator[tuple[Batch, int]]:
    """Endless passes of a device ``feed`` (each starts where its sampler stands: the
    record's position), advancing ``record``'s data position (``batches_consumed``,
    ``epoch``) as batches are handed out, so a checkpoint taken between steps resumes at
    the next batch; the feed is closed when the generator is."""
    try:
        while True:
            for batch, frames in feed:
                record.batches_consumed += 1
                yield batch, frames
            record.epoch += 1
            record.batches_consumed = 0
    finally:
        feed.close()
