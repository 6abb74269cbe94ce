"""The training engine: one object owns the step and everything it updates.

:class:`TrainEngine` holds the model (and its DDP wrapper), AdamW, the learning-rate
schedule, the grad scaler, the weights' moving average, the compiled blocks and the CUDA
graphs. Its lifecycle is the whole public surface:

    engine = TrainEngine(cfg, model, device, dist)     # optimizer, schedule, plan, step
    engine.load_state_dict(checkpoint)                 # resume (optional)
    sizes = engine.prepare(workload)                   # sizing, compile, capture, shrink
    engine.step(micro_batches)                         # no host sync
    engine.read()                                      # the accumulators: the one sync
    engine.state_dict()                                # for a checkpoint
    with engine.evaluating(): engine.loss(batch)       # validation, samples

Nothing outside assigns its fields: what a caller may change goes through these methods, so
``myxtts train``, ``myxtts profile`` and the benchmarks run the same thing
(``train.setup.build_setup`` builds it for all of them).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.config import Config, ConfigError
from myxtts.data.batch import Batch
from myxtts.train import finetune
from myxtts.train.distributed import DistInfo, wrap_ddp
from myxtts.train.engine.lead import StepLead
from myxtts.train.engine.mode import StepMode, plan_step, resolve_graphs
from myxtts.train.engine.optim import build_optimizer, build_scheduler, lr_factor
from myxtts.train.engine.prepare import Prepared, Workload, prepare_step
from myxtts.train.engine.step import TrainStep

log = logging.getLogger(__name__)


class TrainEngine:
    """The TTS model's training step and all the state it updates (module docstring).

    ``compile_model``: overrides what ``train.compile`` resolves to (benchmarks time both);
    ``compile_backend``: torch.compile's backend (tests count graphs with their own).
    """

    def __init__(self, cfg: Config, model: torch.nn.Module, device: torch.device,
                 dist: DistInfo, compile_model: bool | None = None,
                 compile_backend: Any = None) -> None:
        model.set_activation_checkpointing(cfg.train.activation_checkpointing)
        finetune.freeze(model, cfg.train.freeze)
        opt, fused = build_optimizer(model, cfg.train)
        plan = plan_step(cfg, device, dist.enabled, fused)
        if compile_model is not None:
            plan = replace(plan, compile=compile_model)
        if plan.note and dist.rank == 0:
            log.warning("%s", plan.note)
        self.cfg, self.device, self.dist, self.plan = cfg, device, dist, plan
        self._step = TrainStep(model, opt, build_scheduler(opt, cfg.train), cfg, device, fused,
                               compile_model=plan.compile, ddp_model=wrap_ddp(model, dist),
                               compile_backend=compile_backend)
        self.prepared: Prepared | None = None  # what prepare() did, once it ran
        self._lead = StepLead(device)  # the host stays a couple of steps ahead at most

    # ------------------------------------------------------------------ what it is
    @property
    def model(self) -> torch.nn.Module:
        """The raw module (not the DDP wrapper): what is saved and evaluated."""
        return self._step.model

    @property
    def modules(self) -> list[torch.nn.Module]:
        """Every module whose weights a checkpoint saves."""
        return [self._step.model]

    @property
    def dtype(self) -> torch.dtype:
        """The autocast precision of the step (``train.precision`` resolved)."""
        return self._step.dtype

    @property
    def mode(self) -> StepMode:
        """How a step runs now: graphed, compiled or eager."""
        return self._step.mode

    @property
    def compiled(self) -> bool:
        return self._step.compiled

    @property
    def fused(self) -> bool:
        """Fused AdamW: a non-finite step is skipped on the device."""
        return self._step.fused

    @property
    def uncaptured_steps(self) -> int | None:
        """Steps of a graphed run that found no graph for their shape (None: not graphed)."""
        return self._step.uncaptured_steps if self._step.graphs is not None else None

    def graphs_blocker(self) -> str | None:
        """Why this run could not capture CUDA graphs (``train.cuda_graphs=on`` would be
        refused with it), or None where it could."""
        try:
            resolve_graphs("on", self.device, self.dtype, self.dist.enabled, self.fused)
        except ConfigError as e:
            return str(e)
        return None

    # ------------------------------------------------------------------ lifecycle
    def prepare(self, work: Workload) -> list[int]:
        """Everything before step 1 for ``work``'s bucket shapes (``prepare.prepare_step``:
        the room beside the graphs, auto batch sizes, compile, capture, shrink and capture
        again). Returns each bucket's batch size; the caller's loader must use them."""
        self.prepared = prepare_step(self._step, work, self.plan.graphs, self.dist)
        return self.prepared.sizes

    def step(self, micro: list[Batch]) -> None:
        """One optimizer step over ``train.grad_accum_steps`` device batches. No host sync,
        except that the host waits once it is ``lead.MAX_LEAD_STEPS`` steps ahead of the GPU
        (``lead.StepLead``: what the queued steps hold in memory stays bounded)."""
        self._step(micro)
        self._lead.queued()

    def read(self) -> dict[str, float]:
        """Means of the loss terms, grad norm, learning rate and non-finite counts since the
        last read: the loop's one host sync, at log steps."""
        values = self._step.read()
        if values:
            self._lead.clear()  # the read waited for every queued step
        return values

    def after_copy(self, event: Any) -> None:
        """A checkpoint's host copy is in flight until the CUDA ``event``: the next update
        (and swapping the weight average in) waits for it on the GPU, the next forward and
        backward passes do not (``BackgroundSaver.save``'s ``writes_after``)."""
        self._step.after_copy(event)

    def nonfinite_counts(self) -> tuple[int, int]:
        """(non-finite steps in total, in a row now): what a checkpoint records (a host sync)."""
        return self._step.nonfinite_counts()

    # ------------------------------------------------------------------ evaluation
    @contextlib.contextmanager
    def evaluating(self, raw_weights: bool = False) -> Iterator[None]:
        """Inside the ``with``: eval mode, the weights' moving average in place of the
        trained weights (unless ``raw_weights``; bit for bit back on leaving) and the
        transformer blocks eager (validation shapes and generation's one-frame steps would
        compile graphs of their own). Train mode again on leaving."""
        training = self.model.training
        self.model.eval()
        try:
            with self._step.averaged(raw_weights), self._step.eager():
                yield
        finally:
            self.model.train(training)

    def loss(self, batch: Batch) -> dict[str, torch.Tensor]:
        """The loss terms of one batch under the run's precision (validation, in
        :meth:`evaluating`)."""
        return self._step.loss(batch)

    @contextlib.contextmanager
    def timed(self, marker: Callable[[str], None]) -> Iterator[None]:
        """Inside the ``with``, ``marker(phase)`` is called at the end of each phase of a step
        ("forward", "backward", "forward+backward" for a graph replay, "optimizer"): how
        ``myxtts profile`` times the phases."""
        self._step.marker = marker
        try:
            yield
        finally:
            self._step.marker = None

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The checkpoint entries the engine owns: weights, AdamW, schedule, scaler and, when
        the run keeps one, the weights' moving average (``artifacts.checkpoint`` keys)."""
        s = self._step
        state = {ck.MODEL: s.model.state_dict(), ck.OPTIMIZER: s.opt.state_dict(),
                 ck.SCHEDULER: s.sched.state_dict(), ck.SCALER: s.scaler.state_dict()}
        if s.ema is not None:
            state[ck.EMA] = s.ema.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint: weights, the moving average (one saved without it
        starts from the restored weights), AdamW, schedule, scaler and the non-finite
        counts. The learning rate follows this run's config (``train.lr``, warm-up,
        ``max_steps``) at the restored step, not the checkpoint's."""
        s = self._step
        s.model.load_state_dict(state[ck.MODEL])
        if s.ema is not None:
            if state.get(ck.EMA):
                s.ema.load_state_dict(state[ck.EMA])
            else:
                s.ema.reset()
        s.opt.load_state_dict(state[ck.OPTIMIZER])
        s.sched.load_state_dict(state[ck.SCHEDULER])
        if state[ck.SCALER]:  # empty from a run without loss scaling (fp32, bf16): a run resumed
            s.scaler.load_state_dict(state[ck.SCALER])  # in fp16 (another GPU) starts fresh
        progress = ck.TrainingProgress.from_state_dict(state[ck.PROGRESS])
        s.load_nonfinite_counts(progress.nonfinite_steps, progress.nonfinite_in_row)
        self._schedule_from_config()

    def _schedule_from_config(self) -> None:
        """The schedule's base rate and every group's rate now, from ``train.lr``: what the
        next ``sched.step()`` and the next update use (the schedule keeps its step count)."""
        t, sched, groups = self.cfg.train, self._step.sched, self._step.opt.param_groups
        sched.base_lrs = [t.lr for _ in groups]
        factor = lr_factor(sched.last_epoch, t)
        for group in groups:
            group["initial_lr"] = t.lr
            group["lr"] = t.lr * factor
