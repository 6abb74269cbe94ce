"""Trial steps: real steps on the real model and optimizer (a copy would double the memory
measured) whose effects are put back in place afterwards, so training starts as if they had
not run. The warm-up and the auto batch sizes run them.

:class:`TrialStep` is the engine as those two drive it (``TrainEngine`` satisfies it);
its ``trial()`` takes a :class:`StateSnapshot` and puts it back on leaving.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch

from myxtts.config import Config
from myxtts.train.engine.optim import clear_partial_state


class TrialStep(Protocol):
    """What the warm-up (``warmup``) and the batch-size probe (``budget``) use of the engine.

    ``run(batches)``: one step's device work (forward, backward, the update) without the
    schedule's step, leaving no partial state when it fails; ``trial()``: inside it steps
    run the raw module (no DDP all-reduce: each rank runs alone, so a rank that fails cannot
    leave the others waiting) and the training state is put back in place on leaving;
    ``evaluating`` and ``loss``: a validation forward, as validation runs it."""

    cfg: Config
    device: torch.device

    @property
    def dtype(self) -> torch.dtype: ...
    @property
    def compiled(self) -> bool: ...
    def run(self, batches: list[dict[str, torch.Tensor]]) -> None: ...
    def trial(self) -> AbstractContextManager[None]: ...
    def evaluating(self, raw_weights: bool = False) -> AbstractContextManager[None]: ...
    def loss(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]: ...


class Restorable(Protocol):
    """State that copies itself (``snapshot``) and puts the copy back in place
    (``restore``): the step's accumulators, the weights' moving average."""

    def snapshot(self) -> Any: ...
    def restore(self, saved: Any) -> None: ...


class StateSnapshot:
    """The training state of a step, put back in place by :meth:`restore` (or on leaving the
    ``with`` block).

    Saved on the host: ``model``'s parameters and buffers and the other device ``tensors``
    the step writes in place (the self-feed probability), ``optimizer``'s state (a
    parameter without state gets it zeroed, which is what AdamW's first step initialises),
    the CPU random stream and ``device``'s, train/eval mode, and the grad ``scaler``'s state
    when it scales; ``parts`` save and restore themselves. Gradients are zeroed (a snapshot
    is taken between steps, where they are zero).
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 device: torch.device, parts: Sequence[Restorable] = (),
                 tensors: Sequence[torch.Tensor] = (),
                 scaler: torch.amp.GradScaler | None = None) -> None:
        self._model, self._optimizer, self._device, self._scaler = model, optimizer, device, scaler
        self._tensors = [*model.parameters(), *model.buffers(), *tensors]
        self._saved = [t.detach().to("cpu", copy=True) for t in self._tensors]
        self._opt = {id(p): {k: v.detach().to("cpu", copy=True) for k, v in st.items()
                             if isinstance(v, torch.Tensor)} for p, st in optimizer.state.items()}
        self._parts = [(part, part.snapshot()) for part in parts]
        self._scales = scaler.state_dict() if scaler is not None and scaler.is_enabled() else None
        self._rng = torch.get_rng_state()
        cuda = device.type == "cuda"  # that GPU's stream alone (a CPU run starts no CUDA)
        self._cuda_rng = torch.cuda.get_rng_state(device) if cuda else None
        self._training = model.training

    def __enter__(self) -> StateSnapshot:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.restore()

    @torch.no_grad()
    def restore(self) -> None:
        for t, saved in zip(self._tensors, self._saved):
            t.copy_(saved)
        clear_partial_state(self._optimizer)  # zero gradients; (states that were saved are whole)
        for p, st in self._optimizer.state.items():
            saved = self._opt.get(id(p), {})
            for k, v in st.items():
                if isinstance(v, torch.Tensor):
                    v.copy_(saved[k]) if k in saved else v.zero_()
        for part, copy in self._parts:
            part.restore(copy)
        if self._scaler is not None and self._scales is not None:
            self._scaler.load_state_dict(self._scales)
        torch.set_rng_state(self._rng)
        if self._cuda_rng is not None:
            torch.cuda.set_rng_state(self._cuda_rng, self._device)
        self._model.train(self._training)
