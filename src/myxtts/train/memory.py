"""Memory caps per GPU role: ``train.device_memory_cap`` and ``data.data_device_memory_cap``.

Why: a GPU of a desktop often also drives a display, runs a second job or holds the data
role's features; a cap keeps this run inside its share. The caps go through
``torch.cuda.set_per_process_memory_fraction`` (the allocator raises out-of-memory past the
share; the auto batch budget catches that while it measures). A cap is per process and
device, so two roles on one GPU get the sum of their shares, and training plans its batches
within its own. Each check is a one-line error naming the key: a cap on a role not on a GPU,
shares over 1.0 on one device, and (before step 1) a data role whose largest feature batch
does not fit its share; the training role is proved by the auto budget and the warm-up.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from myxtts.config import Config, ConfigError
from myxtts.data.feed.protocol import FeatureWork

log = logging.getLogger(__name__)
GIB = 2**30


@dataclass(frozen=True)
class MemoryCaps:
    """Resolved caps: ``train`` / ``data`` are shares of their device (0 = none);
    ``data_device`` is None when no data role runs on a GPU."""

    train_device: torch.device
    data_device: torch.device | None
    train: float
    data: float

    @property
    def shared(self) -> bool:
        return self.data_device is not None and self.data_device == self.train_device

    def training_share(self) -> float:
        """Share of the training GPU the training step may plan for (1.0 without a cap)."""
        return self.train or 1.0

    def per_device(self) -> dict[torch.device, float]:
        """The process-wide fraction to set on each device."""
        caps: dict[torch.device, float] = {}
        if self.train:
            caps[self.train_device] = self.train
        if self.data and self.data_device is not None:
            caps[self.data_device] = caps.get(self.data_device, 0.0) + self.data
        return caps


def resolve_caps(cfg: Config, train_device: torch.device,
                 data_device: torch.device | None) -> MemoryCaps:
    """Check the two shares against where the roles run (``data_device``: the on-the-fly
    data role's device; None for a prepared store)."""
    t, d = cfg.train.device_memory_cap, cfg.data.data_device_memory_cap
    if train_device.type == "cuda" and train_device.index is None:
        train_device = torch.device("cuda", torch.cuda.current_device())
    if data_device is not None and data_device.type == "cuda" and data_device.index is None:
        data_device = torch.device("cuda", torch.cuda.current_device())
    if t and train_device.type != "cuda":
        raise ConfigError(f"train.device_memory_cap={t} caps a GPU's memory, but training runs "
                          f"on {train_device}; remove it (or train on a GPU)")
    if d and (data_device is None or data_device.type != "cuda"):
        where = ("this run reads a prepared store (no data role on a GPU)" if data_device is None
                 else f"data.data_device is {data_device}")
        raise ConfigError(f"data.data_device_memory_cap={d} caps the on-the-fly data GPU's "
                          f"memory, but {where}; remove it")
    caps = MemoryCaps(train_device, data_device, t, d)
    if caps.shared and d and not t:
        raise ConfigError(f"data.data_device_memory_cap={d} on the training GPU ({train_device}) "
                          f"needs train.device_memory_cap too: both roles share one process cap there "
                          f"(their sum); set both, or neither")
    if caps.shared and t + d > 1.0:
        raise ConfigError(f"train.device_memory_cap={t} + data.data_device_memory_cap={d} = "
                          f"{t + d:g} > 1.0 on {train_device}, which both roles share; lower them so they add "
                          f"up to at most 1.0")
    return caps


def apply_caps(caps: MemoryCaps) -> None:
    for device, share in caps.per_device().items():
        torch.cuda.set_per_process_memory_fraction(min(1.0, share), device)
        total = torch.cuda.get_device_properties(device).total_memory
        log.info("memory cap on %s: %.0f%% (%.1f GiB)", device, 100 * share, share * total / GIB)


def check_feature_memory(work: FeatureWork | None, caps: MemoryCaps) -> int:
    """Run the data role's largest batch of feature work (``TrainLoader.feature_work``) and
    refuse a ``data.data_device_memory_cap`` it does not fit. Returns the peak bytes the
    features took (0 when the data role is not capped on a GPU)."""
    device = caps.data_device
    if not caps.data or device is None or work is None:
        return 0
    limit = int(caps.data * torch.cuda.get_device_properties(device).total_memory)
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    try:
        batch = work.run()
        del batch
        torch.cuda.synchronize(device)
        need = torch.cuda.max_memory_allocated(device) - before
    except torch.cuda.OutOfMemoryError:
        need = None
    torch.cuda.empty_cache()
    if need is None or need > limit:
        shown = "more than that" if need is None else f"{need / GIB:.2f} GiB"
        raise ConfigError(f"data.data_device_memory_cap={caps.data} gives the data role "
                          f"{limit / GIB:.2f} GiB on {device}, but the features of the largest "
                          f"bucket take {shown}; raise data.data_device_memory_cap or lower "
                          f"data.batch_frames / data.max_batch_size")
    return int(need)
