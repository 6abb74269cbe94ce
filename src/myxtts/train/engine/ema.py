"""An exponential moving average (EMA) of the trained weights (``train.ema_decay``).

The average lives on the training device beside the weights and is updated inside the
step's update (``TrainEngine``'s), after AdamW, with foreach kernels: a lerp of every
averaged tensor towards its parameter. Like the rest of the step it is captured in the
update's CUDA graph, so it keeps the step's rules: every tensor it writes is updated IN
PLACE, and nothing reads a device value on the host. What changes between steps is read from
device memory: the number of updates so far (the decay ramps up with it,
``min(decay, (1 + n) / (10 + n))``, so early weights do not linger in the average) and the
step's skip flag -- a skipped (non-finite) step moves neither the weights nor the average.

Validation, sample synthesis and ``myxtts synthesize`` use the average when a run keeps one
(:meth:`WeightAverage.swapped_in` exchanges it with the weights in place, tensor by tensor).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from myxtts.artifacts.averaged import UPDATES, WEIGHTS


class WeightAverage:
    """The EMA of ``model``'s trainable parameters, decay ``decay`` (in (0, 1))."""

    def __init__(self, model: torch.nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"an EMA decay is in (0, 1), got {decay}")
        self.decay = decay
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        with torch.no_grad():
            self.shadow = [p.detach().clone() for p in self.params]
        device = self.params[0].device if self.params else torch.device("cpu")
        self.updates = torch.zeros((), device=device)
        self._weight = torch.zeros((), device=device)  # this step's lerp weight
        self._weights = [self._weight] * len(self.shadow)

    @torch.no_grad()
    def update(self, skip: torch.Tensor) -> None:
        """Move the average towards the weights, unless ``skip`` (a 0-dim device flag,
        1.0 = the step was skipped) is set. Device work only: capturable, no host read."""
        keep = 1.0 - skip.float()
        n = self.updates
        ramp = torch.clamp((n + 1.0) / (n + 10.0), max=self.decay)
        torch.mul(1.0 - ramp, keep, out=self._weight)
        # one weight tensor per pair: the overload taking a single weight tensor reads it
        # on the host (a sync, and no capture)
        torch._foreach_lerp_(self.shadow, self.params, self._weights)
        self.updates.add_(keep)

    @torch.no_grad()
    def reset(self) -> None:
        """Start the average again from the current weights (a run that turns it on)."""
        torch._foreach_copy_(self.shadow, self.params)
        self.updates.zero_()

    @torch.no_grad()
    def _swap(self) -> None:
        for p, s in zip(self.params, self.shadow):
            raw = p.detach().clone()  # one tensor's worth of memory at a time
            p.copy_(s)
            s.copy_(raw)

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Inside the ``with``, the model's parameters hold the average (and the average the
        raw weights); exchanged back, bit for bit, on leaving. In place: captured graphs
        keep pointing at the live tensors."""
        self._swap()
        try:
            yield
        finally:
            self._swap()

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """For a checkpoint: plain tensors (``torch.load(weights_only=True)`` reads them)."""
        return {WEIGHTS: {n: s.detach().clone() for n, s in zip(self.names, self.shadow)},
                UPDATES: self.updates.detach().clone()}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue a saved average (in place). Parameters it does not hold (a run that
        trains more of the model than the saved one did) start from the current weights."""
        weights = state[WEIGHTS]
        for n, p, s in zip(self.names, self.params, self.shadow):
            s.copy_(weights[n] if n in weights else p.detach())
        self.updates.copy_(state[UPDATES])

    def snapshot(self) -> list[torch.Tensor]:
        """A host copy of the average and its count (a trial step's
        ``snapshot.StateSnapshot``)."""
        return [t.detach().to("cpu", copy=True) for t in (*self.shadow, self.updates)]

    @torch.no_grad()
    def restore(self, saved: list[torch.Tensor]) -> None:
        for t, s in zip((*self.shadow, self.updates), saved):
            t.copy_(s)
