"""One stream of batches across epochs for a DataLoader with workers, cut into passes.

Why: a DataLoader's persistent workers still stop at every pass's end: the last batches
are built by fewer workers than there are, the next pass starts only when the training
process asks for it, and its first batches arrive together after a full batch time. On a
corpus of a few hundred batches per epoch that bubble is small; on a small one (a
fine-tuning set, a validation split, a benchmark) it costs as much as the batches. Here the
DataLoader iterates :class:`BatchStream`, the sampler's plan epoch after epoch without end,
and :class:`StreamPasses` hands it out one sampler pass at a time: the workers are already
building the next epoch while the training process takes the last batches of this one.
Where a batch is cheap (a store's), several travel as one task (``group``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import Dataset

from myxtts.data.feed.sampler import BucketBatchSampler


class BatchGroup(list):
    """Several consecutive batches travelling as one DataLoader task (``BatchStream``'s
    ``group``): their ``(epoch, batch)`` index lists on the way to a worker, what the dataset
    and the collate function make of each on the way back."""


class BatchStream:
    """Batch sampler of a DataLoader with workers: ``(epoch, batch)`` of consecutive passes
    without end, from ``start`` = (epoch, position) on (the sampler's own plan, epoch by
    epoch); with ``group`` > 1, ``group`` of them at a time as a :class:`BatchGroup` (one
    task: a worker's queue round trip costs ~0.2 ms of CPU, as much as a quarter of a
    store batch). ``len``: one pass's batches."""

    def __init__(self, sampler: BucketBatchSampler, group: int = 1) -> None:
        if group < 1:
            raise ValueError(f"group must be >= 1, got {group}")
        self.sampler, self.group, self.start = sampler, int(group), (0, 0)

    def _batches(self) -> Iterator[tuple[int, list[int]]]:
        epoch, position = self.start
        while True:
            for batch in self.sampler.batches(epoch)[position:]:
                yield epoch, batch
            epoch, position = epoch + 1, 0

    def __iter__(self) -> Iterator[Any]:
        batches = self._batches()
        if self.group == 1:
            yield from batches
        else:
            while True:
                yield BatchGroup(next(batches) for _ in range(self.group))

    def __len__(self) -> int:
        return len(self.sampler)


class Grouped(Dataset):
    """``dataset`` for a DataLoader over a grouped :class:`BatchStream`: each task's batches
    fetched in turn (``dataset.__getitems__`` each) into a :class:`BatchGroup`."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __getitems__(self, group: BatchGroup) -> BatchGroup:
        return BatchGroup(self.dataset.__getitems__(task) for task in group)

    def __len__(self) -> int:
        return len(self.dataset)


class StreamPasses:
    """Passes of ``sampler`` taken from ``receive()``, an iterator over a DataLoader whose
    batch sampler is ``stream``. The sampler's own pass runs in step, one batch list per batch
    handed out (its epoch, ``state_dict``); a pass the stream did not predict (``set_epoch``,
    a resume, the previous pass left unfinished) restarts the stream there, dropping what
    the workers had begun."""

    def __init__(self, sampler: BucketBatchSampler, stream: BatchStream,
                 receive: Callable[[], Iterator[Any]]) -> None:
        self.sampler, self.stream, self.receive = sampler, stream, receive
        self._live: Iterator[Any] | None = None  # the workers' stream, across passes
        self._next: tuple[int, int] | None = None  # (epoch, position) it continues with

    def one_pass(self) -> Iterator[Any]:
        """The sampler's next pass, from the stream."""
        start = (self.sampler.epoch, self.sampler.resume_position)
        steps = iter(self.sampler)
        if self._live is None or self._next != start:
            self.stream.start = start
            self._live = self.receive()
        self._next = None  # until this pass is taken to its end
        for position, _ in enumerate(steps, start[1] + 1):
            if position == len(self.sampler):
                self._next = (start[0] + 1, 0)
            yield next(self._live)
