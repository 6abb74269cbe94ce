"""Validation: the teacher-forced loss over the val split, sharded across DDP ranks.

It runs under ``no_grad``, by the weights' moving average where the run keeps one, and
reads the sums back once at the end (one sync per validation, not per batch).
"""

from __future__ import annotations

from typing import Any

import torch

from myxtts.data.feed.prefetch import CopyFeed
from myxtts.train.engine import TrainEngine


@torch.no_grad()
def validation_loss(engine: TrainEngine, data: Any, device: torch.device,
                    dist: Any = None) -> dict[str, float] | None:
    """Mean teacher-forced losses over the val split (same batches and crops each time).

    Under DDP (``dist.enabled``) each rank validates its shard of the batches (the val
    loader is built per rank) and the sums are all-reduced, so every rank returns the mean
    over all batches: what one process computes on the whole split (batches weighted
    equally; the sampler's padding repeats are left out, see ``real_batches``). With
    ``train.ema_decay`` the averaged weights are validated (``TrainEngine.evaluating``)."""
    if data.val_loader is None:
        return None
    with engine.evaluating():  # eval mode, the weights' moving average, eager blocks
        sums, count = validation_sums(engine, data, device)
    if not sums:
        return None
    keys = sorted(sums)
    count_t = torch.tensor([float(count)], device=device)
    totals = torch.cat([torch.stack([sums[k] for k in keys]), count_t])  # [keys + 1], one reduce
    if dist is not None and dist.enabled:
        torch.distributed.all_reduce(totals, op=torch.distributed.ReduceOp.SUM)
    values = totals.cpu().tolist()  # the one host sync of a validation
    return {k: v / values[-1] for k, v in zip(keys, values[:-1])}


def validation_sums(engine: TrainEngine, data: Any, device: torch.device
                    ) -> tuple[dict[str, torch.Tensor], int]:
    """This rank's summed per-batch losses over its real val batches, and how many there
    were. The sampler's padding repeats (DDP: at the end of a rank's list) are not run; a
    rank with no real batch runs one only to return zero sums of the same keys, so every
    rank takes part in the all-reduce with the same tensor."""
    data.val_sampler.set_epoch(0)
    real = data.val_sampler.real_batches
    sums: dict[str, torch.Tensor] = {}
    for k, (batch, _) in enumerate(CopyFeed(data.val_loader, device, 2, frames=None)):
        losses = {name: v.detach().float() for name, v in engine.loss(batch).items()}
        if k >= real:  # only reached when this rank has no real batch at all
            return {name: torch.zeros_like(v) for name, v in losses.items()}, 0
        for name, v in losses.items():
            sums[name] = sums[name] + v if name in sums else v
        if k + 1 == real:
            break
    return sums, real if sums else 0
