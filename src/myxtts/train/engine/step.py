"""One optimizer step over ``grad_accum_steps`` batches, with no host synchronisation.

Losses, grad norm and non-finite counts accumulate in device tensors that ``read()`` fetches
at log intervals only; a non-finite step is skipped on the device (fused AdamW's
``found_inf``), so the host never looks at the loss. The same step runs eager, with compiled
blocks (``train.compile``) or replayed as CUDA graphs (``train.engine.graphs``); for the graphs it
updates every tensor it writes IN PLACE (a replay writes fixed addresses: a tensor rebound in
Python would silently stop updating) and reads no device value on the host
(``tests/train/test_graphs.py`` checks both). ``train.engine.mode.plan_step`` decides the mode a
run asks for; :attr:`TrainStep.mode` is the one running.
"""


from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from myxtts.config import Config
from myxtts.model.losses import compute_losses
from myxtts.train.engine.compile import compile_blocks, eager_blocks, uncompile_blocks
from myxtts.train.engine.ema import WeightAverage
from myxtts.train.engine.mode import StepMode, resolve_precision
from myxtts.train.errors import error_summary, is_out_of_memory

log = logging.getLogger(__name__)


class GraphReplay(Protocol):
    """Captured graphs as the step uses them (``train.engine.graphs.StepGraphs``)."""

    def replay(self, batches: list[dict[str, torch.Tensor]]) -> bool: ...
    def __len__(self) -> int: ...


@dataclass(frozen=True)
class StepState:
    """Copies of a step's accumulators (:meth:`TrainStep.snapshot`): the loss sums, the
    device counters and flags, the host step count since the last read, the grad scaler."""

    sums: dict[str, torch.Tensor]
    counters: tuple[torch.Tensor, ...]
    n: int
    scaler: dict[str, Any] | None
    ema: list[torch.Tensor] | None = None  # host copy of the weight average


class TrainStep:
    """Call with a list of ``grad_accum_steps`` device batches: one optimizer step.

    ``model``: the raw module (for saving); ``ddp_model`` wraps it when distributed.
    ``compile_model``: compile the transformer blocks (``train.compile``); ``compile_backend``
    is torch.compile's backend (tests count graphs with their own). ``graphs``: a
    ``train.engine.graphs.StepGraphs`` replays captured shapes (:meth:`use_graphs`, by the
    warm-up). ``runner``: the module a step calls (``ddp_model`` or ``model``; see
    :meth:`without_ddp`). The engine (``train.engine.TrainEngine``) owns it; nothing else does.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: Any, cfg: Config, device: torch.device, fused: bool,
                 compile_model: bool, ddp_model: torch.nn.Module | None = None,
                 compile_backend: Any = None):
        self.model = model
        self.runner = ddp_model or model
        self.opt, self.sched, self.cfg, self.device, self.fused = optimizer, scheduler, cfg, device, fused
        self.dtype = resolve_precision(cfg.train.precision, device)
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.dtype == torch.float16)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self._blocks: list[torch.nn.Module] = []
        if compile_model:
            try:
                self._blocks = compile_blocks(model, compile_backend)
            except Exception as e:  # pragma: no cover - depends on the platform
                log.warning("torch.compile unavailable (%s); training eagerly", error_summary(e))
        self.graphs: GraphReplay | None = None  # train.graphs.StepGraphs once shapes are captured
        # marker(phase) at the end of each phase ("forward", "backward", "optimizer"; a graph
        # replay: "forward+backward"): how `myxtts profile` times the phases. None in training.
        self.marker: Any = None
        z = lambda: torch.zeros((), device=device)  # noqa: E731
        self.nonfinite_total, self.nonfinite_run, self.nonfinite_peak = z(), z(), z()
        self._loss_total = z()  # this step's summed micro-batch losses: the non-finite check
        self._found_inf = z()  # 1.0 skips the AdamW update (read by the fused kernel)
        self._grad_norm_sum = z()
        self._sums: dict[str, torch.Tensor] = {}  # per loss term, since the last read
        self._n = 0  # steps since the last read (host-side)
        self.uncaptured_steps = 0  # steps of a graphed run that found no graph (host-side)
        # scheduled-sampling probability lives on the device: changing it never recompiles
        # nor re-captures
        self.self_feed = z() if cfg.train.self_feed > 0 else None
        # the weights' moving average (train.ema_decay), updated inside update()
        self.ema = WeightAverage(model, cfg.train.ema_decay) if cfg.train.ema_decay > 0 else None
        self._copies: list[Any] = []  # CUDA events of host copies of the state in flight

    @property
    def compiled(self) -> bool:
        return bool(self._blocks)

    @property
    def mode(self) -> StepMode:
        """How the step runs now: ``graphed``, ``compiled`` or ``eager``."""
        return StepMode.of(self.compiled, self.graphs is not None)

    def use_graphs(self, graphs: GraphReplay | None) -> None:
        """Replay ``graphs`` for the shapes they captured from now on (None: no graphs)."""
        self.graphs = graphs

    @contextlib.contextmanager
    def capturable_lr(self, lr: list[torch.Tensor]) -> Iterator[None]:
        """Inside the ``with`` (a CUDA graph capture), AdamW reads each group's learning rate
        from the device tensors ``lr`` (filled with the current values), so a replay uses
        what :meth:`load_lr` wrote before it, not the value of capture time. The groups get
        their floats back afterwards: the schedule, the checkpoint and uncaptured steps see
        what they always see."""
        groups = self.opt.param_groups
        saved = [(g["lr"], g.get("capturable", False)) for g in groups]
        self.load_lr(lr)
        for g, t in zip(groups, lr):
            g["lr"], g["capturable"] = t, True
        try:
            yield
        finally:
            for g, (value, capturable) in zip(groups, saved):
                g["lr"], g["capturable"] = value, capturable

    def load_lr(self, lr: list[torch.Tensor]) -> None:
        """This step's learning rates into the device tensors a captured update reads."""
        for t, group in zip(lr, self.opt.param_groups):
            t.fill_(float(group["lr"]))

    @torch.no_grad()
    def clear_partial_state(self) -> None:
        """After a step that stopped half-way (out of memory) or before a snapshot is put
        back: gradients zeroed, and the AdamW state of parameters that got only part of it
        (the error struck inside AdamW's first step) cleared, so the next step makes it
        whole again instead of failing with a KeyError."""
        self.opt.zero_grad(set_to_none=False)
        full = set().union(*(st.keys() for st in self.opt.state.values()))
        for st in self.opt.state.values():
            if set(st) != full:
                st.clear()

    @contextlib.contextmanager
    def without_ddp(self) -> Iterator[None]:
        """Inside the ``with``, steps run the raw module, without the DDP wrapper's gradient
        all-reduce (the warm-up and the memory probe: each rank runs alone, so a rank that
        fails cannot leave the others waiting in a collective). Put back on leaving."""
        runner, self.runner = self.runner, self.model
        try:
            yield
        finally:
            self.runner = runner

    def after_copy(self, event: Any) -> None:
        """The next in-place write of the trained state waits on the GPU for ``event`` (a
        checkpoint's host copy in flight: ``artifacts.saver``). The writes are the update
        (weights, AdamW state, the weight average) and swapping the average in for
        validation; forward and backward passes only read the weights, so the next step's
        overlap the copy."""
        self._copies.append(event)

    def before_writes(self) -> None:
        """The current stream waits for the copies :meth:`after_copy` was given (a GPU-side
        wait; never inside a capture: callers run it before a replay or an uncaptured
        update)."""
        if self._copies:
            stream = torch.cuda.current_stream(self.device)
            for event in self._copies:
                stream.wait_event(event)
            self._copies.clear()

    # ------------------------------------------------------------------ accumulator state
    def _counters(self) -> list[torch.Tensor]:
        """The device tensors the step updates in place besides the sums and the model."""
        live = [self.nonfinite_total, self.nonfinite_run, self.nonfinite_peak,
                self._grad_norm_sum, self._loss_total, self._found_inf]
        if self.self_feed is not None:
            live.append(self.self_feed)
        return live

    def snapshot(self) -> StepState:
        """Copies of the accumulators, for :meth:`restore` (model, optimizer and random
        streams are the caller's: ``warmup.StateSnapshot``)."""
        return StepState(sums={k: v.clone() for k, v in self._sums.items()},
                         counters=tuple(t.clone() for t in self._counters()), n=self._n,
                         scaler=self.scaler.state_dict() if self.scaler.is_enabled() else None,
                         ema=None if self.ema is None else self.ema.snapshot())

    @torch.no_grad()
    def restore(self, state: StepState) -> None:
        """Put ``state`` back IN PLACE (captured graphs keep pointing at the live tensors);
        a loss term first summed after the snapshot goes back to zero."""
        for k, v in self._sums.items():
            v.copy_(state.sums[k]) if k in state.sums else v.zero_()
        for t, saved in zip(self._counters(), state.counters):
            t.copy_(saved)
        self._n = state.n
        if state.scaler is not None:
            self.scaler.load_state_dict(state.scaler)
        if self.ema is not None and state.ema is not None:
            self.ema.restore(state.ema)

    # ------------------------------------------------------------------ forward
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

    def disable_compile(self, reason: str) -> None:
        """Back to eager blocks, with one warning naming the cause."""
        if self._blocks:
            log.warning("compiled step failed (%s); falling back to eager", reason)
            uncompile_blocks(self._blocks)
            self._blocks = []

    def averaged(self, raw: bool = False) -> contextlib.AbstractContextManager:
        """Inside the ``with``, the model holds the weights' moving average when the run
        keeps one (``train.ema_decay``) and ``raw`` is false: what validation and samples
        evaluate. Put back, bit for bit, on leaving."""
        if self.ema is None or raw:
            return contextlib.nullcontext()
        self.before_writes()  # the swap writes the weights in place
        return self.ema.swapped_in()

    def eager(self) -> contextlib.AbstractContextManager:
        """Inside the ``with``, compiled blocks run eagerly: validation and sample synthesis
        (eval mode, other shapes, ``generate``'s one-frame steps) would otherwise compile
        graphs of their own in the middle of the run."""
        return eager_blocks(self._blocks)  # (no blocks: nothing to switch)

    def _compile_failed(self, e: Exception) -> bool:
        """``e`` is the compiled blocks' failure, to fall back from: not out of memory (the
        caller's business), not an error inside a CUDA graph capture (the warm-up falls back
        to the uncaptured step for those)."""
        capturing = self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        return self.compiled and not capturing and not is_out_of_memory(e)

    def loss(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The loss dict of one batch under the run's precision (validation calls it too, in
        eval mode, where the blocks run eagerly: see :meth:`eager`). A compile failure
        falls back to eager blocks with one warning naming the cause."""
        ctx = contextlib.ExitStack()
        if self.dtype != torch.float32:
            # The weight-cast cache stays off, in every mode: compiled blocks guard on the
            # flag, so a flag that changed between the probe, the warm-up, capture and
            # training would recompile them; and the cache saves little here (a weight is
            # cast once per forward anyway, twice with self-feed).
            ctx.enter_context(torch.autocast(self.device.type, dtype=self.dtype,
                                             cache_enabled=False))
        if not self.model.training:
            ctx.enter_context(self.eager())
        with ctx:
            failed = None
            try:
                return self._forward_loss(batch)
            except Exception as e:
                if not self._compile_failed(e):
                    raise
                failed = error_summary(e)  # handled outside: the traceback holds tensors
            self.disable_compile(failed)
            return self._forward_loss(batch)

    # ------------------------------------------------------------------ the step
    def __call__(self, batches: list[dict[str, torch.Tensor]]) -> None:
        """Forward/backward each micro-batch, then one clipped, possibly skipped, update."""
        if self.self_feed is not None:  # a kernel launch with a scalar, not a host sync
            self.self_feed.fill_(self.self_feed_probability(self.sched.last_epoch))
        if self.graphs is None or not self.graphs.replay(batches):
            if self.graphs is not None:
                self._uncaptured(batches)
            self.run(batches)
        self._n += 1
        self.sched.step()

    def _uncaptured(self, batches: list[dict[str, torch.Tensor]]) -> None:
        """A graphed run met a shape with no graph: it runs uncaptured, beside the memory
        pool the graphs hold (about twice one step's memory). Counted (``train/
        uncaptured_steps``, 0 in a healthy run) and said once, naming the shape."""
        self.uncaptured_steps += 1
        if self.uncaptured_steps == 1:
            shapes = sorted({(b["mel"].shape[0], b["mel"].shape[1], b["tokens"].shape[1])
                             for b in batches})
            log.warning("a batch of %s has no captured CUDA graph: this step runs uncaptured "
                        "beside the graphs' memory pool (later ones are counted in "
                        "train/uncaptured_steps)", ", ".join(
                            f"{b} x {t} frames, text {n}" for b, t, n in shapes))

    def run(self, batches: list[dict[str, torch.Tensor]]) -> None:
        """The step's device work, without the host bookkeeping of ``__call__`` (schedule,
        read-back counts): what a warm-up or a memory probe runs, and what graphs capture."""
        n = len(batches)
        for i, batch in enumerate(batches):
            self.micro(batch, n, last=i == n - 1)
        self.before_writes()
        self.update()

    def micro(self, batch: dict[str, torch.Tensor], n_micro: int, last: bool = True) -> None:
        """Forward + backward of one of ``n_micro`` micro-batches (loss / n_micro), gradients
        accumulating into ``.grad``; its losses are added to the running sums."""
        sync_ctx = contextlib.nullcontext()
        if not last and hasattr(self.runner, "no_sync"):
            sync_ctx = self.runner.no_sync()  # DDP: all-reduce only on the last micro-batch
        with sync_ctx:
            losses = self.loss(batch)
            self.mark("forward")
            failed = None
            try:
                self.scaler.scale(losses["loss"] / n_micro).backward()
            except Exception as e:  # the compiler builds the backward at its first call
                if not self._compile_failed(e):
                    raise
                failed = error_summary(e)
            if failed is not None:
                # The failed backward may have accumulated part of its gradients: this
                # micro-batch runs again, eagerly, from zeroed gradients. (Compiling happens
                # in the warm-up, whose snapshot restores all state afterwards, so no
                # gradient of a real step is lost.)
                self.disable_compile(failed)
                self.opt.zero_grad(set_to_none=False)
                losses = self.loss(batch)
                self.scaler.scale(losses["loss"] / n_micro).backward()
            self.mark("backward")
        for k, v in losses.items():
            v = v.detach().float()
            if k in self._sums:
                self._sums[k].add_(v)
            else:  # first step only: allocated before any graph is captured
                self._sums[k] = v.clone()
        self._loss_total.add_(losses["loss"].detach().float())

    def update(self) -> None:
        """Clip, skip-or-apply AdamW, move the weight average (not on a skipped step), zero
        the gradients (in place: they stay allocated), advance the counters."""
        self.scaler.unscale_(self.opt)
        clip = self.cfg.train.grad_clip if self.cfg.train.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, clip)
        bad = ~torch.isfinite(self._loss_total)
        if self.dtype != torch.float16:  # fp16 overflow in grads is the scaler's business
            bad = bad | ~torch.isfinite(grad_norm)
        self._found_inf.copy_(bad)
        if self.scaler.is_enabled():
            self.scaler.step(self.opt)
        elif self.fused:
            self.opt.found_inf = self._found_inf  # type: ignore[attr-defined]
            self.opt.step()
            del self.opt.found_inf  # type: ignore[attr-defined]
        elif not bool(bad):  # pragma: no cover - non-fused fallback pays one sync
            self.opt.step()
        self.scaler.update()
        if self.ema is not None:  # a step the scaler skipped (fp16 overflow) moves no average
            self.ema.update(self._found_inf if self.dtype != torch.float16 else
                            torch.maximum(self._found_inf, (~torch.isfinite(grad_norm)).float()))
        self.opt.zero_grad(set_to_none=False)
        bad_f = self._found_inf
        self.nonfinite_total.add_(bad_f)
        self.nonfinite_run.add_(bad_f).mul_(bad_f)
        torch.maximum(self.nonfinite_peak, self.nonfinite_run, out=self.nonfinite_peak)
        gn = grad_norm.float()
        self._grad_norm_sum.add_(torch.where(torch.isfinite(gn), gn, torch.zeros_like(gn)))
        self._loss_total.zero_()
        self.mark("optimizer")

    def mark(self, phase: str) -> None:
        """The end of a phase, for a profiler's ``marker`` (nothing while training, nor while
        a CUDA graph is being captured: a timing event must not become part of the graph)."""
        if self.marker is not None and not (
                self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            self.marker(phase)

    # ------------------------------------------------------------------ read-back
    def nonfinite_counts(self) -> tuple[int, int]:
        """(non-finite steps in total, in a row now): what a checkpoint records (a host sync)."""
        total, run = torch.stack([self.nonfinite_total, self.nonfinite_run]).tolist()
        return int(total), int(run)

    def load_nonfinite_counts(self, total: int, in_row: int) -> None:
        """Continue the counts of a checkpoint (``nonfinite_counts``) after a restart."""
        self.nonfinite_total.fill_(total)
        self.nonfinite_run.fill_(in_row)
        self.nonfinite_peak.fill_(in_row)

    def clear_sums(self) -> None:
        """Forget what was accumulated since the last read (in place)."""
        for t in (*self._sums.values(), self._grad_norm_sum, self._loss_total):
            t.zero_()
        self._n = 0

    def read(self) -> dict[str, float]:
        """Means since the last read. This is the (only) host sync of the loop."""
        if self._n == 0:
            return {}
        keys = sorted(self._sums)
        tensors = [self._sums[k] for k in keys]
        tensors += [self._grad_norm_sum, self.nonfinite_total, self.nonfinite_peak]
        *values, grad_norm, total, peak = torch.stack(tensors).cpu().tolist()
        accum = self.cfg.train.grad_accum_steps
        out = {k: v / self._n / accum for k, v in zip(keys, values)}
        out["grad_norm"] = grad_norm / self._n
        out["nonfinite_steps"] = float(total)
        out["nonfinite_run_peak"] = float(peak)
        out["lr"] = float(self.opt.param_groups[0]["lr"])  # the schedule's current value
        if self.scaler.is_enabled():
            out["loss_scale"] = float(self.scaler.get_scale())
        self.clear_sums()
        self.nonfinite_peak.copy_(self.nonfinite_run)
        return out
