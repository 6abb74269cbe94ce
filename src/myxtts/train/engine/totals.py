"""The step's device-side accumulators: what it sums between two reads and the flags of the
step in flight, 0-dim tensors on the training device updated IN PLACE.

Why on the device: the step never reads a value back on the host (that would be a host sync
per step, and impossible to capture as a CUDA graph); :meth:`StepTotals.read` fetches
everything in one transfer at a log step. Why in place: a captured graph writes fixed
addresses, so a tensor rebound in Python would silently stop updating. ``TrainEngine`` owns
one and is the only one that writes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SavedTotals:
    """Copies of the accumulators (:meth:`StepTotals.snapshot`)."""

    sums: dict[str, torch.Tensor]
    counters: tuple[torch.Tensor, ...]
    steps: int


class StepTotals:
    """Per loss term the sum since the last read, the summed grad norm and the non-finite
    counters (steps in total, in a row now, the longest row since the last read); for the
    step in flight its summed micro-batch losses (the non-finite check) and its skip flag
    (:attr:`found_inf`); on the host, the steps since the last read."""

    def __init__(self, device: torch.device) -> None:
        z = lambda: torch.zeros((), device=device)  # noqa: E731
        self._sums: dict[str, torch.Tensor] = {}
        self._loss = z()  # this step's summed micro-batch losses
        self._found_inf = z()  # 1.0 skips the AdamW update (read by the fused kernel)
        self._grad_norm = z()
        self._total, self._in_row, self._peak = z(), z(), z()
        self._steps = 0

    @property
    def found_inf(self) -> torch.Tensor:
        """This step's skip flag (1.0: its loss or grad norm is not finite), set by
        :meth:`flag`; fused AdamW and the weight average read it on the device."""
        return self._found_inf

    def _counters(self) -> list[torch.Tensor]:
        return [self._total, self._in_row, self._peak, self._grad_norm, self._loss,
                self._found_inf]

    # ------------------------------------------------------------------ inside a step
    def add(self, losses: dict[str, torch.Tensor]) -> None:
        """One micro-batch's loss terms into the running sums."""
        for k, v in losses.items():
            v = v.detach().float()
            if k in self._sums:
                self._sums[k].add_(v)
            else:  # first step only: allocated before any graph is captured
                self._sums[k] = v.clone()
        self._loss.add_(losses["loss"].detach().float())

    def flag(self, grad_norm: torch.Tensor, check_grad_norm: bool) -> torch.Tensor:
        """Set this step's skip flag: its summed loss is not finite, or (``check_grad_norm``)
        its grad norm is not; returns the flag. (In fp16 an overflowing gradient is the grad
        scaler's business, which skips the step itself.)"""
        bad = ~torch.isfinite(self._loss)
        if check_grad_norm:
            bad = bad | ~torch.isfinite(grad_norm)
        self._found_inf.copy_(bad)
        return self._found_inf

    def count(self, grad_norm: torch.Tensor) -> None:
        """After the update: the non-finite counters advance by the skip flag, the grad norm
        (a finite one) is summed and the step's summed loss starts again from zero."""
        bad = self._found_inf
        self._total.add_(bad)
        self._in_row.add_(bad).mul_(bad)
        torch.maximum(self._peak, self._in_row, out=self._peak)
        gn = grad_norm.float()
        self._grad_norm.add_(torch.where(torch.isfinite(gn), gn, torch.zeros_like(gn)))
        self._loss.zero_()

    def stepped(self) -> None:
        """One more step since the last read (host-side)."""
        self._steps += 1

    # ------------------------------------------------------------------ read-back
    def read(self, micro_batches: int) -> dict[str, float]:
        """Means since the last read (each loss term per micro-batch of ``micro_batches``
        per step), the non-finite steps in total and the longest row since the last read;
        then the sums start again. The one host sync of the loop; {} when no step ran."""
        if self._steps == 0:
            return {}
        keys = sorted(self._sums)
        tensors = [self._sums[k] for k in keys]
        tensors += [self._grad_norm, self._total, self._peak]
        *values, grad_norm, total, peak = torch.stack(tensors).cpu().tolist()
        out = {k: v / self._steps / micro_batches for k, v in zip(keys, values)}
        out["grad_norm"] = grad_norm / self._steps
        out["nonfinite_steps"] = float(total)
        out["nonfinite_run_peak"] = float(peak)
        for t in (*self._sums.values(), self._grad_norm, self._loss):
            t.zero_()
        self._steps = 0
        self._peak.copy_(self._in_row)
        return out

    def nonfinite_counts(self) -> tuple[int, int]:
        """(non-finite steps in total, in a row now): a host sync."""
        total, in_row = torch.stack([self._total, self._in_row]).tolist()
        return int(total), int(in_row)

    def load_nonfinite_counts(self, total: int, in_row: int) -> None:
        """Continue the counts of a checkpoint (:meth:`nonfinite_counts`) after a restart."""
        self._total.fill_(total)
        self._in_row.fill_(in_row)
        self._peak.fill_(in_row)

    # ------------------------------------------------------------------ trial steps
    def snapshot(self) -> SavedTotals:
        """Copies of every accumulator, for :meth:`restore` (the warm-up's
        ``snapshot.StateSnapshot``)."""
        return SavedTotals(sums={k: v.clone() for k, v in self._sums.items()},
                           counters=tuple(t.clone() for t in self._counters()),
                           steps=self._steps)

    @torch.no_grad()
    def restore(self, saved: SavedTotals) -> None:
        """Put ``saved`` back IN PLACE (captured graphs keep pointing at the live tensors);
        a loss term first summed after the snapshot goes back to zero."""
        for k, v in self._sums.items():
            v.copy_(saved.sums[k]) if k in saved.sums else v.zero_()
        for t, value in zip(self._counters(), saved.counters):
            t.copy_(value)
        self._steps = saved.steps
