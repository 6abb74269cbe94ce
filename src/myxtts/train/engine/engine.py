"""The training engine: one object owns the step and everything it updates.

:class:`TrainEngine` holds the model (and its DDP wrapper), its task (``task.StepTask``:
the model family's losses, compiled blocks and worst-case batches; None: the TTS model's),
AdamW, the learning-rate schedule, the grad scaler, the weights' moving average, the
compiled blocks, the CUDA graphs and the step's device-side accumulators, and runs the
step. Its lifecycle:

    engine = TrainEngine(cfg, model, device, dist, task=task)  # optimizer, schedule, plan
    engine.load_state_dict(checkpoint)          # resume (optional), random streams too
    sizes = engine.start_up(workload)           # sizing, compile, capture, shrink
    engine.step(micro_batches)                  # no host sync
    engine.read()                               # the accumulators (the task's loss terms)
    engine.state_dict()                         # for a checkpoint
    with engine.evaluating(): engine.loss(batch)  # validation, samples

A step runs eager, with compiled blocks or replayed as CUDA graphs (``graphs.StepGraphs``);
for the graphs it updates every tensor it writes IN PLACE (a replay writes fixed addresses)
and reads no device value on the host (``tests/train/test_graphs.py`` checks both): losses,
grad norm and non-finite counts accumulate on the device (``totals.StepTotals``), and a
non-finite step is skipped there (fused AdamW's ``found_inf``).

The start-up (``startup.start_up``), the warm-up and the batch-size probe drive it as a
``snapshot.TrialStep`` (:meth:`trial`, :meth:`run`, :meth:`warm_up`); its graphs get the
callables they capture. Nothing outside assigns its fields, so ``myxtts train``, ``myxtts
profile`` and the benchmarks run the same thing (``train.tts.TTSRecipe.setup`` builds it).
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
from myxtts.data.batch import Batch, BatchShape
from myxtts.train import finetune
from myxtts.train.distributed import DistInfo, wrap_ddp
from myxtts.train.engine import startup, warmup
from myxtts.train.engine.compile import CompiledBlocks
from myxtts.train.engine.ema import WeightAverage
from myxtts.train.engine.graphs import Capture, StepGraphs
from myxtts.train.engine.lead import StepLead
from myxtts.train.engine.mode import StepMode, plan_step, resolve_graphs, resolve_precision
from myxtts.train.engine.optim import (
    build_optimizer,
    build_scheduler,
    clear_partial_state,
    schedule_from_config,
    self_feed_probability,
    skip_or_step,
)
from myxtts.train.engine.snapshot import StateSnapshot
from myxtts.train.engine.startup import Startup, Workload
from myxtts.train.engine.task import StepTask, TTSTask, WorstCase
from myxtts.train.engine.totals import StepTotals
from myxtts.train.errors import error_summary

log = logging.getLogger(__name__)


class TrainEngine:
    """A model's training step and all the state it updates (module docstring).

    ``compile_model``: overrides what ``train.compile`` resolves to (benchmarks time both);
    ``compile_backend``: torch.compile's backend (tests count graphs with their own);
    ``task``: what the step needs of the model family (``task.StepTask``: its losses,
    compiled blocks, worst cases); None: the TTS model's (``task.TTSTask``).
    """

    def __init__(self, cfg: Config, model: torch.nn.Module, device: torch.device,
                 dist: DistInfo, compile_model: bool | None = None,
                 compile_backend: Any = None, task: StepTask | None = None) -> None:
        if task is None:
            task = TTSTask.for_model(cfg, model)
        if hasattr(model, "set_activation_checkpointing"):  # (a model without it has no choice)
            model.set_activation_checkpointing(cfg.train.activation_checkpointing)
        finetune.freeze(model, cfg.train.freeze)  # (no part named: nothing to do)
        opt, fused = build_optimizer(model, cfg.train)
        plan = plan_step(cfg, device, dist.enabled, fused)
        if compile_model is not None:
            plan = replace(plan, compile=compile_model)
        if plan.note and dist.rank == 0:
            log.warning("%s", plan.note)
        self.cfg, self.device, self.dist, self.plan, self.task = cfg, device, dist, plan, task
        self._model, self._opt, self._fused = model, opt, fused
        self._sched = build_scheduler(opt, cfg.train)
        self._runner = wrap_ddp(model, dist) or model  # the module a step calls (see trial())
        self._dtype = resolve_precision(cfg.train.precision, device)
        self._scaler = torch.amp.GradScaler(device.type, enabled=self._dtype == torch.float16)
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._blocks = CompiledBlocks(model, task.block_types, plan.compile, device,
                                      compile_backend)
        self._graphs: StepGraphs | None = None  # what the warm-up captured (warm_up())
        self._marker: Callable[[str], None] | None = None  # a profiler's (timed())
        self._totals = StepTotals(device)
        # scheduled-sampling probability lives on the device: changing it never recompiles
        # nor re-captures
        self._self_feed = torch.zeros((), device=device) if cfg.train.self_feed > 0 else None
        # the weights' moving average (train.ema_decay), updated inside the update
        self._ema = WeightAverage(model, cfg.train.ema_decay) if cfg.train.ema_decay > 0 else None
        self._copies: list[Any] = []  # CUDA events of host copies of the state in flight
        self._startup: Startup | None = None
        self._lead = StepLead(device)  # the host stays a couple of steps ahead at most

    # ------------------------------------------------------------------ what it is
    @property
    def model(self) -> torch.nn.Module:
        """The raw module (not the DDP wrapper): what is saved and evaluated."""
        return self._model

    @property
    def modules(self) -> list[torch.nn.Module]:
        """Every module whose weights a checkpoint saves."""
        return [self._model]

    @property
    def dtype(self) -> torch.dtype:
        """The autocast precision of the step (``train.precision`` resolved)."""
        return self._dtype

    @property
    def mode(self) -> StepMode:
        """How a step runs now: graphed, compiled or eager."""
        return StepMode.of(self.compiled, self._graphs is not None)

    @property
    def compiled(self) -> bool:
        return self._blocks.active

    @property
    def fused(self) -> bool:
        """Fused AdamW: a non-finite step is skipped on the device."""
        return self._fused

    @property
    def uncaptured_steps(self) -> int | None:
        """Steps of a graphed run that found no graph for their shape (None: not graphed)."""
        return self._graphs.uncaptured if self._graphs is not None else None

    def graphs_blocker(self) -> str | None:
        """Why this run could not capture CUDA graphs (``train.cuda_graphs=on`` would be
        refused with it), or None where it could."""
        try:
            resolve_graphs("on", self.device, self.dtype, self.dist.enabled, self.fused)
        except ConfigError as e:
            return str(e)
        return None

    # ------------------------------------------------------------------ before step 1
    @property
    def startup(self) -> Startup | None:
        """What :meth:`start_up` did (sizes, the plan, the last warm-up's report), once it ran."""
        return self._startup

    def start_up(self, work: Workload) -> list[int]:
        """Everything before step 1 for ``work``'s bucket shapes (``startup.start_up``: the
        room beside the graphs, auto batch sizes, compile, capture, shrink and capture
        again). Returns each bucket's batch size; the caller's loader must use them."""
        self._startup, self._graphs = None, None  # an earlier start-up's graphs go first
        self._startup = startup.start_up(self, work, self.plan.graphs, self.dist)
        return self._startup.sizes

    def warm_up(self, shapes: list[BatchShape], worst_case: WorstCase,
                capture: Capture | None = None, echo: Callable[[str], None] = log.info,
                floors: dict[BatchShape, int] | None = None) -> warmup.WarmupReport:
        """Every shape run once before step 1 (``warmup.warm_up``: compile, prove each worst
        case -- ``worst_case(shape, device)``, a task's -- fits and, with ``capture``,
        capture the step's CUDA graphs); the graphs it
        captured are what this engine replays from now on (none: the plain step), so the
        report returned holds none. Graphs of an earlier warm-up go first: the warm-up
        frees their pool before it measures anything. The training state is as before."""
        self._graphs = None
        new_graphs = None if capture is None else lambda: StepGraphs(
            capture, self._opt, self.device, self.cfg.train.grad_accum_steps,
            micro=self._micro, update=self._update, mark=self._mark,
            before_writes=self._before_writes, describe=self.task.describe)
        report = warmup.warm_up(self, shapes, worst_case, new_graphs, echo, floors)
        self._graphs = report.graphs
        return replace(report, graphs=None)

    @contextlib.contextmanager
    def trial(self) -> Iterator[None]:
        """Inside the ``with``, steps are trials (the warm-up, the batch-size probe): they run
        the raw module, without DDP's gradient all-reduce (each rank runs alone, so a rank
        that fails cannot leave the others waiting in a collective), and on leaving the
        training state is put back in place (``snapshot.StateSnapshot``: weights, AdamW
        state, accumulators, self-feed probability, weight average, scaler, random streams,
        train/eval mode), the DDP wrapper too."""
        runner, self._runner = self._runner, self._model
        try:
            parts = [self._totals] + ([self._ema] if self._ema is not None else [])
            tensors = [self._self_feed] if self._self_feed is not None else []
            with StateSnapshot(self._model, self._opt, self.device, parts, tensors, self._scaler):
                yield
        finally:
            self._runner = runner

    def run(self, batches: list[Batch]) -> None:
        """One trial step's device work (:meth:`trial`): forward and backward of each batch,
        then the update, without the schedule's step or the steps counted for a read. One
        that fails half-way (out of memory) leaves no partial state behind: gradients
        zeroed, AdamW state that was only partly made cleared."""
        try:
            self._run(batches)
        except Exception:
            clear_partial_state(self._opt)
            raise

    # ------------------------------------------------------------------ the step
    def step(self, micro: list[Batch]) -> None:
        """One optimizer step over ``train.grad_accum_steps`` device batches: replayed as
        CUDA graphs when its shapes were captured, else run. No host sync, except that the
        host waits once it is ``lead.MAX_LEAD_STEPS`` steps ahead of the GPU
        (``lead.StepLead``: what the queued steps hold in memory stays bounded)."""
        if self._self_feed is not None:  # a kernel launch with a scalar, not a host sync
            self._self_feed.fill_(self_feed_probability(self._sched.last_epoch, self.cfg.train))
        if self._graphs is None or not self._graphs.replay(micro):  # (a miss is counted)
            self._run(micro)
        self._totals.stepped()
        self._sched.step()
        self._lead.queued()

    def _run(self, batches: list[Batch]) -> None:
        """The step's device work, uncaptured: each micro-batch, then the update."""
        n = len(batches)
        for i, batch in enumerate(batches):
            self._micro(batch, n, last=i == n - 1)
        self._before_writes()
        self._update()

    def _micro(self, batch: Batch, n_micro: int, last: bool = True) -> None:
        """Forward + backward of one of ``n_micro`` micro-batches (loss / n_micro), gradients
        accumulating into ``.grad``; its losses are added to the running sums."""
        sync_ctx = contextlib.nullcontext()
        if not last and hasattr(self._runner, "no_sync"):
            sync_ctx = self._runner.no_sync()  # DDP: all-reduce only on the last micro-batch
        with sync_ctx:
            losses = self.loss(batch)
            self._mark("forward")
            failed = None
            try:
                self._scaler.scale(losses["loss"] / n_micro).backward()
            except Exception as e:  # the compiler builds the backward at its first call
                if not self._blocks.failed(e):
                    raise
                failed = error_summary(e)
            if failed is not None:
                # The failed backward may have accumulated part of its gradients: this
                # micro-batch runs again, eagerly, from zeroed gradients. (Compiling happens
                # in the warm-up, whose snapshot restores all state afterwards, so no
                # gradient of a real step is lost.)
                self._blocks.fall_back(failed)
                self._opt.zero_grad(set_to_none=False)
                losses = self.loss(batch)
                self._scaler.scale(losses["loss"] / n_micro).backward()
            self._mark("backward")
        self._totals.add(losses)

    def _update(self) -> None:
        """Clip, skip-or-apply AdamW, move the weight average (not on a skipped step), zero
        the gradients (in place: they stay allocated), advance the counters."""
        self._scaler.unscale_(self._opt)
        clip = self.cfg.train.grad_clip if self.cfg.train.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self._params, clip)
        found_inf = self._totals.flag(grad_norm, check_grad_norm=self._dtype != torch.float16)
        skip_or_step(self._opt, self._scaler, self._fused, found_inf)
        if self._ema is not None:  # a step the scaler skipped (fp16 overflow) moves no average
            self._ema.update(found_inf if self._dtype != torch.float16 else
                             torch.maximum(found_inf, (~torch.isfinite(grad_norm)).float()))
        self._opt.zero_grad(set_to_none=False)
        self._totals.count(grad_norm)
        self._mark("optimizer")

    def _mark(self, phase: str) -> None:
        """The end of a phase, for a profiler's marker (nothing while training, nor while a
        CUDA graph is being captured: a timing event must not become part of the graph)."""
        if self._marker is not None and not (
                self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            self._marker(phase)

    def read(self) -> dict[str, float]:
        """Means of the loss terms, grad norm, learning rate and non-finite counts since the
        last read: the loop's one host sync, at log steps."""
        values = self._totals.read(self.cfg.train.grad_accum_steps)
        if values:
            values["lr"] = float(self._opt.param_groups[0]["lr"])  # the schedule's current value
            if self._scaler.is_enabled():
                values["loss_scale"] = float(self._scaler.get_scale())
            self._lead.clear()  # the read waited for every queued step
        return values

    def after_copy(self, event: Any) -> None:
        """A checkpoint's host copy is in flight until the CUDA ``event``: the next update
        (and swapping the weight average in) waits for it on the GPU, the next forward and
        backward passes do not, since they only read the weights (``BackgroundSaver.save``'s
        ``writes_after``)."""
        self._copies.append(event)

    def _before_writes(self) -> None:
        """The current stream waits for the copies :meth:`after_copy` was given (a GPU-side
        wait; never inside a capture: it runs before a replay or an uncaptured update)."""
        if self._copies:
            stream = torch.cuda.current_stream(self.device)
            for event in self._copies:
                stream.wait_event(event)
            self._copies.clear()

    def nonfinite_counts(self) -> tuple[int, int]:
        """(non-finite steps in total, in a row now): a host sync."""
        return self._totals.nonfinite_counts()

    # ------------------------------------------------------------------ evaluation
    @contextlib.contextmanager
    def evaluating(self, raw_weights: bool = False) -> Iterator[None]:
        """Inside the ``with``: eval mode, the weights' moving average in place of the
        trained weights (unless ``raw_weights``; bit for bit back on leaving) and the
        transformer blocks eager (validation shapes and generation's one-frame steps would
        compile graphs of their own). Train mode again on leaving."""
        training = self._model.training
        self._model.eval()
        try:
            with self._averaged(raw_weights), self._blocks.eager():
                yield
        finally:
            self._model.train(training)

    def _averaged(self, raw: bool) -> contextlib.AbstractContextManager:
        """The weight average swapped in for the ``with`` (none kept, or ``raw``: nothing)."""
        if self._ema is None or raw:
            return contextlib.nullcontext()
        self._before_writes()  # the swap writes the weights in place
        return self._ema.swapped_in()

    def loss(self, batch: Batch) -> dict[str, torch.Tensor]:
        """The loss terms of one batch under the run's precision (validation, in
        :meth:`evaluating`; in eval mode the blocks run eagerly). A compile failure falls
        back to eager blocks with one warning naming the cause."""
        ctx = contextlib.ExitStack()
        if self._dtype != torch.float32:
            # The weight-cast cache stays off, in every mode: compiled blocks guard on the
            # flag, so a flag that changed between the probe, the warm-up, capture and
            # training would recompile them; and the cache saves little here (a weight is
            # cast once per forward anyway, twice with self-feed).
            ctx.enter_context(torch.autocast(self.device.type, dtype=self._dtype,
                                             cache_enabled=False))
        if not self._model.training:
            ctx.enter_context(self._blocks.eager())
        with ctx:
            return self._blocks.guarded(lambda: self._forward_loss(batch))

    def _forward_loss(self, batch: Batch) -> dict[str, torch.Tensor]:
        training = self._self_feed is not None and self._model.training
        # validation: teacher forcing
        return self.task.losses(self._runner, batch, self._self_feed if training else None)

    @contextlib.contextmanager
    def timed(self, marker: Callable[[str], None]) -> Iterator[None]:
        """Inside the ``with``, ``marker(phase)`` is called at the end of each phase of a step
        ("forward", "backward", "forward+backward" for a graph replay, "optimizer"): how
        ``myxtts profile`` times the phases."""
        self._marker = marker
        try:
            yield
        finally:
            self._marker = None

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The checkpoint entries the engine owns (``artifacts.checkpoint`` keys): weights,
        AdamW, schedule, scaler, the weights' moving average when the run keeps one, the
        random streams (this process's: a DDP run gathers every rank's beside them) and the
        non-finite counts (reading them is a host sync, fine at a checkpoint)."""
        state = {ck.MODEL: self._model.state_dict(), ck.OPTIMIZER: self._opt.state_dict(),
                 ck.SCHEDULER: self._sched.state_dict(), ck.SCALER: self._scaler.state_dict()}
        if self._ema is not None:
            state[ck.EMA] = self._ema.state_dict()
        steps, in_row = self._totals.nonfinite_counts()
        state[ck.RNG] = ck.rng_state(self.device)
        state[ck.NONFINITE] = {"steps": steps, "in_row": in_row}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint: weights, the moving average (one saved without it
        starts from the restored weights), AdamW, schedule, scaler, the non-finite counts
        and the random streams (this rank's, under DDP). The learning rate follows this
        run's config (``train.lr``, warm-up, ``max_steps``) at the restored step, not the
        checkpoint's."""
        self._model.load_state_dict(state[ck.MODEL])
        if self._ema is not None:
            if state.get(ck.EMA):
                self._ema.load_state_dict(state[ck.EMA])
            else:
                self._ema.reset()
        self._opt.load_state_dict(state[ck.OPTIMIZER])
        self._sched.load_state_dict(state[ck.SCHEDULER])
        if state[ck.SCALER]:  # empty from a run without loss scaling (fp32, bf16): a run resumed
            self._scaler.load_state_dict(state[ck.SCALER])  # in fp16 (another GPU) starts fresh
        counts = state[ck.NONFINITE]
        self._totals.load_nonfinite_counts(int(counts["steps"]), int(counts["in_row"]))
        schedule_from_config(self._sched, self._opt, self.cfg.train)
        ck.restore_rng(state, self.device, self.dist.rank, self.dist.world_size)
