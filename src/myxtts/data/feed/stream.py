"""One stream of batches across epochs for a DataLoader with workers, cut into passes.

Why: a DataLoader's persistent workers still stop at every pass's end: the last batches
are built by fewer workers than there are, the next pass starts only when the training
process asks for it, and its first batches arrive together after a full batch time. On a
corpus of a few hundred batches per epoch that bubble is small; on a small one (a
fine-tuning set, a validation split, a benchmark) it costs as much as the batches. Here the
DataLoader's batch sampler is a :class:`WorkerStream`, the sampler's plan epoch after epoch
without end, and the training process takes it one sampler pass at a time
(:class:`StreamPasses`): the workers are already building the next epoch while it takes the
last batches of this one. Where a batch is cheap (a store's), several travel as one task
(``group``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from myxtts.data.feed.sampler import BucketBatchSampler


class WorkerStream:
    """Batch sampler of a DataLoader with workers: ``(epoch, indices)`` of consecutive passes
    without end, from ``start`` = (epoch, position) on (the sampler's own plan, epoch by
    epoch). ``group`` 0: one ``(epoch, indices)`` per task (a dataset that takes one batch);
    ``group`` n: lists of n of them (one task: a worker's queue round trip costs ~0.2 ms of
    CPU, as much as a quarter of a store batch). ``len``: one pass's batches."""

    def __init__(self, sampler: BucketBatchSampler, group: int = 0) -> None:
        if group < 0:
            raise ValueError(f"group must be >= 0, got {group}")
        self.sampler, self.group, self.start = sampler, int(group), (0, 0)

    def _batches(self) -> Iterator[tuple[int, list[int]]]:
        epoch, position = self.start
        while True:
            for batch in self.sampler.batches(epoch)[position:]:
                yield epoch, batch
            epoch, position = epoch + 1, 0

    def __iter__(self) -> Iterator[Any]:
        batches = self._batches()
        if self.group == 0:
            yield from batches
        else:
            while True:
                yield [next(batches) for _ in range(self.group)]

    def __len__(self) -> int:
        return len(self.sampler)


class StreamPasses:
    """The training process's side of a :class:`WorkerStream`: the sampler's passes, taken
    from ``receive()`` (a new iteration of the DataLoader whose batch sampler ``stream`` is,
    one result per batch). Held by the loader, not by the stream: a batch sampler holding
    its DataLoader's live iterator would tie the two in a reference cycle, keeping the worker
    processes (and every file they inherited) alive until the garbage collector runs."""

    def __init__(self, stream: WorkerStream, receive: Callable[[], Iterator[Any]]) -> None:
        self.stream, self.receive = stream, receive
        self._live: Iterator[Any] | None = None  # the workers' results, across passes
        self._next: tuple[int, int] | None = None  # (epoch, position) they continue with

    def one_pass(self) -> Iterator[Any]:
        """The sampler's next pass, from the stream. The sampler's own pass runs in step, one
        batch list per batch handed out (its epoch, ``state_dict``); a pass the stream did
        not predict (``set_epoch``, a resume, the previous pass left unfinished) restarts the
        stream there, dropping what the workers had begun."""
        sampler = self.stream.sampler
        start = (sampler.epoch, sampler.resume_position)
        steps = iter(sampler)
        if self._live is None or self._next != start:
            self.stream.start = start
            self._live = self.receive()
        self._next = None  # until this pass is taken to its end
        for position, _ in enumerate(steps, start[1] + 1):
            if position == len(sampler):
                self._next = (start[0] + 1, 0)
            yield next(self._live)
