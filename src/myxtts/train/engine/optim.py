"""AdamW with decoupled weight decay on matrices only, a warmup + cosine schedule, and the
ramp of scheduled sampling (``train.self_feed``) over the same steps.

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


def schedule_from_config(sched: torch.optim.lr_scheduler.LambdaLR, opt: torch.optim.Optimizer,
                         cfg: TrainConfig) -> None:
    """The schedule's base rate and every group's rate now, from ``cfg.lr`` (after a
    checkpoint was loaded): what the next ``sched.step()`` and the next update use (the
    schedule keeps its step count)."""
    groups = opt.param_groups
    sched.base_lrs = [cfg.lr for _ in groups]
    factor = lr_factor(sched.last_epoch, cfg)
    for group in groups:
        group["initial_lr"] = cfg.lr
        group["lr"] = cfg.lr * factor


def skip_or_step(opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler, fused: bool,
                 found_inf: torch.Tensor) -> None:
    """One AdamW step, skipped where ``found_inf`` (a 0-dim device flag) is set: by the grad
    scaler when it scales (fp16: it checks the gradients itself), on the device by fused
    AdamW, else after reading the flag on the host (one sync: the non-fused fallback)."""
    if scaler.is_enabled():
        scaler.step(opt)
    elif fused:
        opt.found_inf = found_inf  # type: ignore[attr-defined]
        opt.step()
        del opt.found_inf  # type: ignore[attr-defined]
    elif not bool(found_inf):  # pragma: no cover - non-fused fallback pays one sync
        opt.step()
    scaler.update()


def self_feed_probability(step: int, cfg: TrainConfig) -> float:
    """``train.self_feed`` ramped: 0 for ``self_feed_after`` steps, then linear over as many
    again."""
    if cfg.self_feed <= 0:
        return 0.0
    ramp = max(1, cfg.self_feed_after)
    return cfg.self_feed * min(1.0, max(0.0, (step - cfg.self_feed_after) / ramp))


@torch.no_grad()
def clear_partial_state(opt: torch.optim.Optimizer) -> None:
    """After a step that stopped half-way (out of memory) or before a snapshot is put back:
    gradients zeroed, and the state of parameters that got only part of it (the error struck
    inside AdamW's first step) cleared, so the next step makes it whole again instead of
    failing with a KeyError."""
    opt.zero_grad(set_to_none=False)
    full = set().union(*(st.keys() for st in opt.state.values()))
    for st in opt.state.values():
        if set(st) != full:
            st.clear()
