"""torchrun / DDP in a few lines: detect from the environment, one process per GPU.

Launch with ``torchrun --nproc_per_node=2 -m myxtts.cli.main train STORE ...`` (multi-node:
add ``--nnodes``/``--rdzv-endpoint`` as usual). Each rank reads its own share of batches
(the sampler gives every rank the same number), rank 0 alone logs and checkpoints.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as tdist
from torch.nn.parallel import DistributedDataParallel

from myxtts.train.errors import TrainError


@dataclass
class DistInfo:
    enabled: bool = False
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    def close(self, wait_for_all: bool = False) -> None:
        """Release the process group. ``wait_for_all`` (the normal end of a run): every rank
        arrives before any tears the group down (rank 0 finishes later: it writes the last
        checkpoint). Not on error paths: a rank that died would leave the others waiting at
        the barrier. Even after this, gloo's threads can still be releasing the last
        collective's tensors; a process that then finalises its interpreter may abort, so a
        torchrun worker ends with ``os._exit`` (``cli.main``: 7 aborts in 40 two-rank runs
        on a loaded 2-core machine before, none after)."""
        if self.enabled and tdist.is_initialized():
            if wait_for_all:
                tdist.barrier()
            tdist.destroy_process_group()


def agree(dist: DistInfo, failure: Exception | None) -> None:
    """Every rank reports whether its setup step worked; if any failed, every rank raises
    (the failed one its own error, the others one line naming it) instead of the healthy
    ranks waiting in the next collective until a timeout -- e.g. a store path that exists
    on one node but not on another."""
    if not dist.enabled:
        if failure is not None:
            raise failure
        return
    reports: list[Any] = [None] * dist.world_size
    tdist.all_gather_object(reports, None if failure is None else str(failure))
    if failure is not None:
        raise failure
    for rank, message in enumerate(reports):
        if message is not None:
            raise TrainError(f"rank {rank} (of {dist.world_size}) could not start: {message}")


def gather(dist: DistInfo, value: Any) -> list[Any]:
    """Every rank's ``value`` (a small picklable object), in rank order, on every rank; a
    collective, so every rank must call it at the same point."""
    if not dist.enabled:
        return [value]
    values: list[Any] = [None] * dist.world_size
    tdist.all_gather_object(values, value)
    return values


def init_distributed(device: str = "auto") -> DistInfo:
    """The process group torchrun asked for (none without it). ``device`` is
    ``train.device``: ``cpu`` trains on the CPU (gloo) even where GPUs are visible; anything
    else uses this rank's GPU (NCCL) when CUDA is available."""
    if "RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return DistInfo()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device != "cpu" and torch.cuda.is_available():
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not tdist.is_initialized():
        tdist.init_process_group(backend=backend)
    return DistInfo(True, rank, world, local, device)


def wrap_ddp(model: torch.nn.Module, dist: DistInfo) -> torch.nn.Module | None:
    if not dist.enabled:
        return None
    ids = [dist.device.index] if dist.device.type == "cuda" else None
    # Gradients as views into DDP's all-reduce buckets: one copy of the gradients instead of
    # two, which the auto budget (measured without DDP) does not see.
    return DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=True)

