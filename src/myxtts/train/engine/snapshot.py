"""The training state of a step, saved on the host and put back in place: what lets the
warm-up and the auto batch sizes run real steps on the real model and optimizer (a copy
would double the memory measured) and still start training as if they had not run."""

from __future__ import annotations

from typing import Any

import torch

from myxtts.train.engine.step import TrainStep


class StateSnapshot:
    """The training state of ``step``, put back in place by :meth:`restore` (or on leaving
    the ``with`` block).

    Saved on the host: parameters and buffers, AdamW state (a parameter without state gets
    it zeroed, which is what AdamW's first step initialises), the CPU random stream and the
    training GPU's, train/eval mode; and the step's own accumulators (``TrainStep.snapshot``:
    sums, counters, self-feed probability, grad scaler). Gradients are zeroed (a snapshot is
    taken between steps, where they are zero).
    """

    def __init__(self, step: TrainStep) -> None:
        self.step = step
        model, opt = step.model, step.opt
        self._tensors = [*model.parameters(), *model.buffers()]
        self._saved = [t.detach().to("cpu", copy=True) for t in self._tensors]
        self._opt = {id(p): {k: v.detach().to("cpu", copy=True) for k, v in st.items()
                             if isinstance(v, torch.Tensor)} for p, st in opt.state.items()}
        self._step_state = step.snapshot()
        self._rng = torch.get_rng_state()
        cuda = step.device.type == "cuda"  # that GPU's stream alone (a CPU run starts no CUDA)
        self._cuda_rng = torch.cuda.get_rng_state(step.device) if cuda else None
        self._training = model.training

    def __enter__(self) -> StateSnapshot:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.restore()

    @torch.no_grad()
    def restore(self) -> None:
        step = self.step
        for t, saved in zip(self._tensors, self._saved):
            t.copy_(saved)
        step.clear_partial_state()  # zero gradients; (states that were saved are whole)
        for p, st in step.opt.state.items():
            saved = self._opt.get(id(p), {})
            for k, v in st.items():
                if isinstance(v, torch.Tensor):
                    v.copy_(saved[k]) if k in saved else v.zero_()
        step.restore(self._step_state)
        torch.set_rng_state(self._rng)
        if self._cuda_rng is not None:
            torch.cuda.set_rng_state(self._cuda_rng, self.step.device)
        step.model.train(self._training)
