"""The seam between the data pipeline and the training device: :class:`DeviceFeed`.

A training loader (:class:`TrainLoader`: ``StoreLoader`` or ``OnTheFlyLoader``) builds its
feed with ``device_feed(device)`` (store: ``prefetch.CopyFeed``; on the fly:
``ring.SlotRing``), so the trainer never needs to know which path made it. Each
``iter(feed)`` is one pass and yields ``(batch, real_frames)``: the batch on the training
device in the model's dtypes, and its real mel frames counted on the host before the batch
reaches the device (:func:`real_frames`), so throughput figures never read a device tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple, Protocol, runtime_checkable

import torch

from myxtts.data.batch import Batch


@runtime_checkable
class DeviceFeed(Protocol):
    """Batches on the training device, one pass per ``iter()``; see the module docstring."""

    def __iter__(self) -> Iterator[tuple[Batch, int]]:
        """One pass: ``(batch on the device, real mel frames)``."""
        ...

    def close(self) -> None:
        """Stop whatever runs ahead (a producer thread, copies in flight) and drop what it
        made; the feed is not iterated again."""
        ...

    def occupancy(self) -> float | None:
        """Batches waiting ready whenever the trainer asked for one, averaged since the last
        call (the progress bar's ``data_ready_slots``); None where nothing runs ahead."""
        ...


class FeatureWork(NamedTuple):
    """The heaviest job of a data role that computes features on a device: ``run()`` makes
    the features of the loader's largest batch on ``device`` (memory checks run it once)."""

    device: torch.device
    run: Callable[[], object]


@runtime_checkable
class TrainLoader(Protocol):
    """A loader the trainer takes batches from: host-side batches (one epoch per pass, for
    validation and inspection) and the feed that puts them on the training device."""

    @property
    def num_workers(self) -> int:
        """Loader worker processes (0: batches are made in the training process)."""
        ...

    def feature_work(self) -> FeatureWork | None:
        """The data role's largest batch of feature work, or None where the loader computes
        no features (a prepared store)."""
        ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Batch]: ...

    def device_feed(self, device: torch.device, *, hold: int = 1,
                    copy_log: list | None = None) -> DeviceFeed:
        """The trainer's feed on ``device``. ``hold``: batches the trainer keeps at once
        (gradient accumulation); ``copy_log``: receives (start, end) timing events per copied
        batch (``myxtts profile``)."""
        ...


def real_frames(batch: Batch) -> int:
    """Real mel frames of a host-side batch (a CPU sum of B lengths, no device read)."""
    return int(batch["mel_lengths"].sum())
