"""A run of one kind of training, owned by one object: its recipe.

Every kind of training (the TTS model: ``train.tts``; the vocoder: ``train.vocoder.recipe``)
is a :class:`Recipe` with the same lifecycle::

    recipe.find_checkpoint()   # a training run: its folder's newest checkpoint, if any
    recipe.setup()             # data, model, engine; that checkpoint restored
    result = recipe.train()    # run_steps to train.max_steps, with the periodic events
    recipe.cleanup()           # feed, saver, loggers, process group

All of a run's state lives on the recipe: config, device, engine, data, progress record,
logger, saver, timer. One composer writes a checkpoint (:meth:`Recipe.save_checkpoint`) and
one restorer reads it (the subclass' ``load_checkpoint``). :meth:`Recipe.run_steps` is the
one step loop: ``myxtts train``, ``myxtts train-vocoder``, ``myxtts profile`` and every
benchmark run their steps through it (``train()`` with the events and the stop signal, the
others with a :class:`StepWatch` that times what they measure). The periodic events (log,
validate, samples, evaluate, checkpoint) are declared once (:data:`EVENTS`); a recipe
implements the ones it has.

The rules of the loop: batches arrive already on the device, the step never syncs, and
the host reads device-side accumulators only at log steps.
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.artifacts.runs import CheckpointManager
from myxtts.artifacts.saver import BackgroundSaver
from myxtts.config import Config
from myxtts.data.batch import Batch
from myxtts.observe.loggers import MetricLogger
from myxtts.observe.meters import StepTimer
from myxtts.observe.progress import Progress
from myxtts.train.distributed import DistInfo, gather
from myxtts.train.errors import TrainError
from myxtts.train.run import StopFlag, TrainResult, check_finite_weights, locked_run, next_micro

# (the recipe's method, the train.* interval that schedules it; 0 turns an event off). A
# step runs them in this order, at multiples of the interval and at train.max_steps.
EVENTS = (("log", "log_every"), ("validate", "val_every"), ("samples", "synth_every"),
          ("evaluate", "eval_every"), ("checkpoint", "ckpt_every"))


class StepWatch(Protocol):
    """What a caller of :meth:`Recipe.run_steps` sees of each step: the profiler's phase
    clock, a benchmark's shape count."""

    def fetching(self) -> None: ...
    def fetched(self) -> None: ...
    def stepped(self, micro: list[Batch], frames: int) -> None: ...


class Recipe(ABC):
    """The lifecycle and the loop every kind of training shares (module docstring).

    A subclass sets ``command`` (what the run folder's lock names), ``events`` (its names
    of :data:`EVENTS`) and ``unit`` (the progress bar's), builds ``engine``, ``record`` and
    ``dist`` in :meth:`setup`, and implements :meth:`batches`, :meth:`step`,
    :meth:`checkpoint_extra`, :meth:`weights_fix` and its events."""

    command = "myxtts train"
    events: tuple[str, ...] = ()
    unit = "utt"

    def __init__(self, cfg: Config, data_path: str | Path, resume: str | Path | None = None,
                 *, show_progress: bool = True) -> None:
        self.cfg, self.data_path = cfg, Path(data_path)
        self.resume = Path(resume) if resume else None
        self.show_progress = show_progress
        self.out = Path(cfg.train.output_dir)
        self.manager = CheckpointManager(self.out / "checkpoints", cfg.train.keep_last)
        self.device = torch.device("cpu")
        self.dist = DistInfo()
        self.engine: Any = None
        self.record = ck.TrainingProgress()
        self.logger: MetricLogger | None = None
        self.saver: BackgroundSaver | None = None
        self.timer: StepTimer | None = None
        self.eff: Any = None  # train.efficiency.IntervalEfficiency of a training run (rank 0)
        self.bar: Progress | None = None
        self.stop: StopFlag | None = None
        self.saved_step = -1  # the step of the newest checkpoint
        self.last: Path | None = None  # the newest checkpoint this run wrote
        # what the loop is doing when something kills it: "data" (fetching, at ``position``
        # of the data), "step" (inside the optimizer step) or "after" (the step's events)
        self.phase, self.position = "data", (0, 0)
        self._stream: Iterator[tuple[Batch, int]] | None = None

    # ------------------------------------------------------------------ what a kind defines
    def find_checkpoint(self) -> None:
        """A training run continues its folder's newest checkpoint unless given another
        (``resume``); a profile or a benchmark starts from ``resume`` alone."""
        self.resume = self.resume or self.manager.resumable()

    @abstractmethod
    def setup(self) -> None:
        """Data, model and engine, the checkpoint ``resume`` restored; nothing written."""

    @abstractmethod
    def batches(self) -> Iterator[tuple[Batch, int]]:
        """The run's own input path: device batches and their real frames, endlessly (a
        generator: closing it closes the feed)."""

    def loop_failure(self, error: RuntimeError) -> Exception | None:
        """The one-line error a failure inside the loop becomes (None: raised as it is)."""
        return None

    @abstractmethod
    def step(self, micro: list[Batch]) -> None:
        """One optimizer step on ``micro`` (an out-of-memory error names the batch and the
        fix); ``record.step`` counts it."""

    @abstractmethod
    def checkpoint_extra(self) -> dict[str, Any]:
        """What a checkpoint holds besides the engine's state and the progress record."""

    @abstractmethod
    def weights_fix(self) -> str:
        """What to change when the weights are non-finite at a save (the setting, its value)."""

    def utterances(self, micro: list[Batch]) -> int:
        return sum(int(b["mel_lengths"].shape[0]) for b in micro)

    def frames_per_second(self) -> float:
        """The frames a batch counts per second of audio (the progress's audio seconds)."""
        return self.cfg.audio.frames_per_second

    def skipped_steps(self) -> int:
        """Steps skipped for a non-finite loss or gradient in the whole run (a host sync)."""
        return 0

    def accum(self) -> int:
        return self.cfg.train.grad_accum_steps

    # ------------------------------------------------------------------ the one loop
    def run_steps(self, n: int, *, events: bool = False, source: Iterator | None = None,
                  timer: StepTimer | None = None, watch: StepWatch | None = None) -> None:
        """``n`` optimizer steps: fetch a step's micro-batches from ``source`` (default: the
        run's own input path, :meth:`batches`) timed as data wait, step, count. ``events``:
        the periodic events after each step, a save that failed in the background raised,
        and a stop signal obeyed at the step boundary (``train()``); without them nothing
        is written (``myxtts profile``, benchmarks). ``timer``: default the run's."""
        source = self.stream() if source is None else source
        timer = timer or self._timer()
        accum, fps = self.accum(), self.frames_per_second()
        between = (lambda: self.stop is not None and self.stop.signum is not None) \
            if events and not self.dist.enabled else None
        for _ in range(n):
            if events and self.saver is not None:
                self.saver.check()  # a save that failed stops the run here, in one line
            self.phase, self.position = "data", self.data_position()
            if watch is not None:
                watch.fetching()
            got = next_micro(source, timer, accum, between)
            if got is None:  # a signal between micro-batches: drop the unfinished cycle
                self.stopped_in_cycle()
                return
            micro, frames = got
            if watch is not None:
                watch.fetched()
            self.phase = "step"
            self.step(micro)
            self.phase = "after"
            if watch is not None:
                watch.stepped(micro, frames)
            timer.step_end(self.utterances(micro), frames / fps)
            if events and self._events(self.record.step):
                return

    def stream(self) -> Iterator[tuple[Batch, int]]:
        """The run's input path, opened at the first call and kept until
        :meth:`close_stream` (each call continues where the last step left it)."""
        if self._stream is None:
            self._stream = self.batches()
        return self._stream

    def close_stream(self) -> None:
        """Close the input path (stops an on-the-fly data role's producer now)."""
        if self._stream is not None:
            self._stream.close()  # type: ignore[attr-defined]  # (a generator)
            self._stream = None

    def _timer(self) -> StepTimer:
        if self.timer is None:
            self.timer = StepTimer(self.device)
        return self.timer

    def data_position(self) -> tuple[int, int]:
        """Where the data stands before a fetch: put back when a cycle is dropped."""
        return self.record.epoch, self.record.batches_consumed

    def _events(self, step: int) -> bool:
        """The periodic events of ``step``; True when a stop signal ends the run here."""
        t = self.cfg.train
        for name, interval in EVENTS:
            every = getattr(t, interval)
            if name in self.events and every and (step % every == 0 or step == t.max_steps):
                getattr(self, name)(step)
        if self.should_stop(step):
            if self.saved_step != step:
                self.last = self.save_checkpoint()
            self.note(f"stopped by signal at step {step}; checkpoint {self.last}")
            return True
        return False

    def checkpoint(self, step: int) -> None:
        if self.saved_step != step:
            self.last = self.save_checkpoint()

    def occupancy(self) -> float | None:
        """The feed's ready batches per request since the last call (None: no figure)."""
        return None

    def log(self, step: int) -> None:
        """The log event: the engine's figures (its one host read), a run of non-finite
        steps stopped with a checkpoint, the interval's speeds and data-wait share, the
        efficiency meter's (``eff``: GPU utilisation, TFLOP/s, MFU where known), the engine's
        own (steps that found no CUDA graph, peak GPU memory) and the feed's ready batches,
        logged under ``train/`` and shown on the progress bar."""
        assert self.timer is not None and self.logger is not None and self.bar is not None
        values = self.engine.read()
        iv = self.timer.collect()
        peak = values.get("nonfinite_run_peak", 0.0)
        if peak >= self.cfg.train.max_nonfinite_in_row:
            self.save_checkpoint()
            raise TrainError(f"{int(peak)} consecutive steps had a non-finite loss (step "
                             f"{step}); {self.weights_fix()}")
        values.update(steps_per_s=iv.steps_per_s, utterances_per_s=iv.utterances_per_s,
                      audio_s_per_s=iv.audio_s_per_s, data_wait_share=iv.data_wait_share)
        if self.eff is not None:
            values.update(self.eff.collect(iv.seconds))
        if self.engine.uncaptured_steps is not None:
            values["uncaptured_steps"] = float(self.engine.uncaptured_steps)
        ready = self.occupancy()
        if ready is not None:
            values["data_ready_slots"] = ready
        if self.device.type == "cuda":
            values["max_mem_gb"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        self.logger.scalars(step, values, prefix="train/")
        self.bar.update_to(step, values)

    def keep_validation(self, step: int, val: dict[str, float], said: str) -> None:
        """A validation's figures logged (``val/``), ``said`` on the progress bar, the best
        loss kept and the checkpoint saved (marked best when it is)."""
        assert self.logger is not None
        self.logger.scalars(step, val, prefix="val/")
        self.note(said)
        is_best = val["loss"] < self.record.best_val_loss
        self.record.best_val_loss = min(self.record.best_val_loss, val["loss"])
        self.last = self.save_checkpoint(val["loss"], is_best)

    def stopped_in_cycle(self) -> None:
        """A signal between two micro-batches: the data position goes back to the cycle's
        start (its batches are read on resume) and the finished step is saved."""
        self.record.epoch, self.record.batches_consumed = self.position
        if self.saved_step != self.record.step:
            self.last = self.save_checkpoint()
        self.note(f"stopped by signal in an accumulation cycle after step {self.record.step}; "
                  f"checkpoint {self.last}")

    def should_stop(self, step: int) -> bool:
        """Single process: stop at the first step boundary after a signal. Distributed: every
        rank must stop at the same step (a rank that leaves early would hang the others in
        an all-reduce), so ranks agree on it at log intervals, where the loop syncs anyway."""
        signalled = self.stop is not None and self.stop.signum is not None
        if not self.dist.enabled:
            return signalled
        if step % self.cfg.train.log_every:
            return False
        flag = torch.tensor([1.0 if signalled else 0.0], device=self.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())

    def note(self, message: str) -> None:
        if self.bar is not None:
            self.bar.note(message)

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, val_loss: float | None = None, is_best: bool = False
                        ) -> Path | None:
        """The one composer: the current step's checkpoint (every rank checks its weights and
        keeps the record; rank 0 writes, in the background: ``artifacts.saver``)."""
        r = self.record
        # every rank: DDP keeps the weights alike, so all stop alike
        check_finite_weights(self.engine.modules, r.step, self.weights_fix())
        self.saved_step = r.step
        rng_ranks = gather(self.dist, ck.rng_state(self.device)) if self.dist.enabled else None
        if self.dist.rank != 0:
            return None
        if self.saver is None:
            self.saver = BackgroundSaver(self.manager, self.device)
        state = ck.compose(r, self.engine.state_dict(), self.checkpoint_extra(), rng_ranks)
        return self.saver.save(state, r.step, val_loss, is_best,
                               writes_after=getattr(self.engine, "after_copy", None))

    # ------------------------------------------------------------------ the run
    def train(self) -> TrainResult:
        """Steps until ``train.max_steps`` with the events; SIGINT/SIGTERM save and stop at a
        step boundary. The save in flight is written before this returns (its failure is
        raised unless the run already fails for another reason)."""
        t = self.cfg.train
        self.saved_step = self.record.step if self.record.step else -1
        self.bar = Progress(total=t.max_steps, initial=self.record.step,
                            enabled=self.show_progress and self.dist.rank == 0, unit=self.unit)
        if self.saver is None:
            self.saver = BackgroundSaver(self.manager, self.device)  # a save costs a copy only
        try:
            with StopFlag() as self.stop:
                try:
                    self.run_steps(t.max_steps - self.record.step, events=True)
                except RuntimeError as e:
                    failure = self.loop_failure(e)
                    if failure is None:
                        raise
                    raise failure from e
        finally:
            self.close_stream()
            self.saver.close(report=sys.exc_info()[0] is None)
        self.bar.close()
        return TrainResult(self.record.step, self.out, self.last, self.record.best_val_loss,
                           stopped_by=self.stop.signum, skipped_steps=self.skipped_steps())

    def cleanup(self, finished: bool = False) -> None:
        """Close what the run opened (``finished``: it ended normally)."""
        self.close_stream()
        if self.logger is not None:
            self.logger.close()
        self.dist.close(wait_for_all=finished)


def run(recipe: Recipe) -> TrainResult:
    """``recipe`` set up, trained and cleaned up while this process holds its run folder's
    lock (``train.run.locked_run``)."""
    return locked_run(recipe.out, recipe.command, _run, recipe)


def _run(recipe: Recipe) -> TrainResult:
    finished = False
    try:
        recipe.find_checkpoint()
        recipe.setup()
        result = recipe.train()
        finished = True
        return result
    finally:
        recipe.cleanup(finished)

