"""A training checkpoint's state: what :func:`capture` puts in and :func:`restore` takes out."""

from __future__ import annotations

from typing import Any

import torch

from myxtts.artifacts.checkpoint import (
    EMA,
    MODEL,
    OPTIMIZER,
    PROGRESS,
    RNG,
    RNG_RANKS,
    SCALER,
    SCHEDULER,
    TrainingProgress,
    rng_state,
    set_rng_state,
)
from myxtts.train.ema import WeightAverage


def capture(progress: TrainingProgress, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
            scheduler: Any, scaler: torch.amp.GradScaler, extra: dict[str, Any],
            device: torch.device | None = None, rng_ranks: list[dict[str, Any]] | None = None,
            ema: WeightAverage | None = None) -> dict[str, Any]:
    """The checkpoint dict: the training state (these objects, RNGs -- the training
    ``device``'s too --, ``progress``) plus ``extra`` (what inference needs: config,
    vocabulary, mel statistics). ``rng_ranks``: under DDP, every rank's :func:`rng_state`
    (gathered by the caller), so each rank resumes its own dropout streams. ``ema``: the
    weights' moving average, when the run keeps one."""
    state = {MODEL: model.state_dict(), OPTIMIZER: optimizer.state_dict(),
             SCHEDULER: scheduler.state_dict(), SCALER: scaler.state_dict(),
             RNG: rng_state(device), PROGRESS: progress.state_dict(), **extra}
    if rng_ranks is not None and len(rng_ranks) > 1:
        state[RNG_RANKS] = rng_ranks
    if ema is not None:
        state[EMA] = ema.state_dict()
    return state


def restore(state: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer,
            scheduler: Any, scaler: torch.amp.GradScaler, device: torch.device | None = None,
            rank: int = 0, world_size: int = 1, ema: WeightAverage | None = None) -> None:
    """Load what :func:`capture` saved into these objects and the RNGs (the progress record
    is read on its own, first: the data side needs it before the model exists). Under DDP
    each rank takes its own saved streams; from a checkpoint without them (written before
    they were saved) the other ranks keep the streams they were seeded with, which at least
    differ from rank 0's. ``ema``: the run's weight average, continued from the checkpoint's
    (one saved without an average starts it from the restored weights)."""
    model.load_state_dict(state[MODEL])
    if ema is not None:
        if state.get(EMA):
            ema.load_state_dict(state[EMA])
        else:
            ema.reset()
    optimizer.load_state_dict(state[OPTIMIZER])
    scheduler.load_state_dict(state[SCHEDULER])
    if state[SCALER]:  # empty from a run without loss scaling (fp32, bf16): a run resumed
        scaler.load_state_dict(state[SCALER])  # in fp16 (another GPU) starts a fresh scale
    per_rank = state.get(RNG_RANKS)
    if isinstance(per_rank, list) and len(per_rank) == world_size:
        set_rng_state(per_rank[rank], device)
    elif rank == 0:
        set_rng_state(state[RNG], device)


