"""AdamW with decoupled weight decay on matrices only, and a warmup + cosine schedule.

Why fused AdamW: one kernel per step instead of one per tensor, and it accepts an
on-device ``found_inf`` flag, so a step with a non-finite loss is skipped without the
host ever reading the loss (no per-step sync).
"""

from __future__ import annotations

import logging
import math

import torch

from myxtts.config import TrainConfig

log = logging.getLogger(__name__)


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay 2-D+ weights (linear/conv); never norms, biases, embeddings or learned queries."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        is_embedding = "embed" in name or "queries" in name or "latents" in name
        (decay if p.ndim >= 2 and not is_embedding else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> tuple[torch.optim.Optimizer, bool]:
    """Returns (optimizer, fused). ``fused`` tells the step whether it may skip on-device."""
    groups = param_groups(model, cfg.weight_decay)
    kw = dict(lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=1e-8)
    try:
        return torch.optim.AdamW(groups, fused=True, **kw), True
    except (RuntimeError, TypeError, ValueError) as e:  # old torch / unusual device
        log.warning("fused AdamW unavailable (%s); using foreach AdamW", e)
        return torch.optim.AdamW(groups, foreach=True, **kw), False


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to 1, then cosine down to ``min_lr_ratio`` at ``max_steps``."""
    if cfg.warmup_steps > 0 and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    span = max(1, cfg.max_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine


def build_scheduler(opt: torch.optim.Optimizer, cfg: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg))
