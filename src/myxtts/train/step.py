"""One optimizer step over ``grad_accum_steps`` batches, with no host synchronisation.

Everything the host would want to read (losses, grad norm, non-finite counts) is
accumulated into device tensors and read by ``TrainStep.read()`` at log intervals
only. A non-finite step is skipped on the device: fused AdamW takes a ``found_inf``
flag (the GradScaler's own mechanism), so the host never has to look at the loss.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch

from myxtts.config import Config
from myxtts.model.losses import compute_losses

log = logging.getLogger(__name__)


def resolve_precision(precision: str, device: torch.device) -> torch.dtype:
    """auto: bf16 on GPUs that support it, fp16 on older GPUs, fp32 on CPU."""
    if precision == "fp32" or (precision == "auto" and device.type != "cuda"):
        return torch.float32
    if precision == "bf16":
        return torch.bfloat16
    if precision == "fp16":
        return torch.float16
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def resolve_compile(mode: str, device: torch.device) -> bool:
    return mode == "on" or (mode == "auto" and device.type == "cuda")


class TrainStep:
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: Any, cfg: Config, device: torch.device, fused: bool,
                 compile_model: bool, ddp_model: torch.nn.Module | None = None):
        self.model = model  # the raw module (for saving); ddp_model wraps it when distributed
        self.runner = ddp_model or model
        self.opt, self.sched, self.cfg, self.device, self.fused = optimizer, scheduler, cfg, device, fused
        self.dtype = resolve_precision(cfg.train.precision, device)
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.dtype == torch.float16)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.compiled = False
        self._loss_fn = self._forward_loss
        if compile_model:
            self._setup_compile()
        z = lambda: torch.zeros((), device=device)  # noqa: E731
        self.nonfinite_total, self.nonfinite_run, self.nonfinite_peak = z(), z(), z()
        self._sums: dict[str, torch.Tensor] = {}
        self._n = 0
        # scheduled-sampling probability lives on the device: changing it never recompiles
        self.self_feed = z() if cfg.train.self_feed > 0 else None

    # ------------------------------------------------------------------ compile
    def _forward_loss(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.self_feed is None or not self.model.training:  # validation: pure teacher forcing
            out = self.runner(batch)
        else:
            out = self.runner(batch, self_feed=self.self_feed)
        return compute_losses(out, batch, self.cfg.train)

    def self_feed_probability(self, step: int) -> float:
        """train.self_feed ramped: 0 for self_feed_after steps, then linear over as many again."""
        t = self.cfg.train
        if t.self_feed <= 0:
            return 0.0
        ramp = max(1, t.self_feed_after)
        return t.self_feed * min(1.0, max(0.0, (step - t.self_feed_after) / ramp))

    def _setup_compile(self) -> None:
        try:
            import torch._dynamo as dynamo

            # one graph per bucket shape (x2 for train/eval mode) plus headroom
            limit = max(8, 2 * self.cfg.data.num_buckets + 4)
            for name in ("recompile_limit", "cache_size_limit"):
                if hasattr(dynamo.config, name):
                    setattr(dynamo.config, name, limit)
            self._loss_fn = torch.compile(self._forward_loss, dynamic=False)
            self.compiled = True
        except Exception as e:  # pragma: no cover - depends on the platform
            log.warning("torch.compile unavailable (%s); training eagerly", e)

    def loss(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        ctx = (torch.autocast(self.device.type, dtype=self.dtype)
               if self.dtype != torch.float32 else contextlib.nullcontext())
        with ctx:
            try:
                return self._loss_fn(batch)
            except torch.cuda.OutOfMemoryError:
                raise
            except Exception as e:
                if not self.compiled:
                    raise
                log.warning("compiled step failed (%s: %s); falling back to eager",
                            type(e).__name__, str(e).splitlines()[0][:200])
                self._loss_fn, self.compiled = self._forward_loss, False
                return self._loss_fn(batch)

    # ------------------------------------------------------------------ the step
    def __call__(self, batches: list[dict[str, torch.Tensor]]) -> None:
        """Forward/backward each micro-batch, then one clipped, possibly skipped, update."""
        n = len(batches)
        if self.self_feed is not None:  # a kernel launch with a scalar, not a host sync
            self.self_feed.fill_(self.self_feed_probability(self.sched.last_epoch))
        loss_total = torch.zeros((), device=self.device)
        for i, batch in enumerate(batches):
            sync_ctx = contextlib.nullcontext()
            if i < n - 1 and hasattr(self.runner, "no_sync"):
                sync_ctx = self.runner.no_sync()  # DDP: all-reduce only on the last micro-batch
            with sync_ctx:
                losses = self.loss(batch)
                self.scaler.scale(losses["loss"] / n).backward()
            for k, v in losses.items():
                v = v.detach().float()
                self._sums[k] = self._sums[k] + v if k in self._sums else v.clone()
            loss_total = loss_total + losses["loss"].detach().float()
        self.scaler.unscale_(self.opt)
        clip = self.cfg.train.grad_clip if self.cfg.train.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, clip)
        bad = ~torch.isfinite(loss_total)
        if self.dtype != torch.float16:  # fp16 overflow in grads is the scaler's business
            bad = bad | ~torch.isfinite(grad_norm)
        if self.scaler.is_enabled():
            self.scaler.step(self.opt)
        elif self.fused:
            self.opt.found_inf = bad.float()  # type: ignore[attr-defined]
            self.opt.step()
            del self.opt.found_inf  # type: ignore[attr-defined]
        elif not bool(bad):  # pragma: no cover - non-fused fallback pays one sync
            self.opt.step()
        self.scaler.update()
        self.opt.zero_grad(set_to_none=True)
        self.sched.step()
        badf = bad.float()
        self.nonfinite_total += badf
        self.nonfinite_run = (self.nonfinite_run + badf) * badf
        self.nonfinite_peak = torch.maximum(self.nonfinite_peak, self.nonfinite_run)
        gn = torch.where(torch.isfinite(grad_norm), grad_norm.float(), torch.zeros_like(grad_norm.float()))
        self._sums["grad_norm"] = self._sums.get("grad_norm", torch.zeros((), device=self.device)) + gn
        self._n += 1

    def nonfinite_counts(self) -> tuple[int, int]:
        """(non-finite steps in total, in a row now): what a checkpoint records (a host sync)."""
        return int(self.nonfinite_total.item()), int(self.nonfinite_run.item())

    def load_nonfinite_counts(self, total: int, in_row: int) -> None:
        """Continue the counts of a checkpoint (``nonfinite_counts``) after a restart."""
        self.nonfinite_total.fill_(total)
        self.nonfinite_run.fill_(in_row)
        self.nonfinite_peak.fill_(in_row)

    def read(self) -> dict[str, float]:
        """Means since the last read. This is the (only) host sync of the loop."""
        if self._n == 0:
            return {}
        keys = sorted(self._sums)
        values = torch.stack([self._sums[k] for k in keys]).cpu().tolist()
        out = {k: v / self._n / (1 if k == "grad_norm" else self.cfg.train.grad_accum_steps)
               for k, v in zip(keys, values)}
        out["nonfinite_steps"] = float(self.nonfinite_total.item())
        out["nonfinite_run_peak"] = float(self.nonfinite_peak.item())
        out["lr"] = self.sched.get_last_lr()[0]
        if self.scaler.is_enabled():
            out["loss_scale"] = float(self.scaler.get_scale())
        self._sums.clear()
        self._n = 0
        self.nonfinite_peak.copy_(self.nonfinite_run)
        return out
