"""The training loop: set up, then step / log / validate / synthesise / checkpoint.

Read top to bottom: ``train()`` builds everything from the config and restores a
checkpoint when the run folder has one (``train.setup``, shared with ``myxtts profile``),
then runs the loop (``_LoopContext.run``); the folder lock, the stop signal and the result
are ``train.run``'s, shared with the vocoder trainer. The rules:
batches arrive already on the device (side-stream prefetch), the step never syncs,
and the host reads device-side accumulators only every ``log_every`` steps.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.artifacts.runs import CheckpointManager
from myxtts.artifacts.saver import BackgroundSaver
from myxtts.artifacts.vocoder import load_vocoder
from myxtts.config import Config, save_config
from myxtts.data.batch import Batch
from myxtts.data.feed.protocol import DeviceFeed
from myxtts.observe.flops import batch_key
from myxtts.observe.loggers import MetricLogger, build_logger
from myxtts.observe.meters import StepTimer
from myxtts.observe.progress import Progress
from myxtts.train.data import TrainData, bucket_shapes
from myxtts.train.distributed import DistInfo, gather
from myxtts.train.efficiency import IntervalEfficiency
from myxtts.train.engine import TrainEngine
from myxtts.train.errors import TrainError, is_out_of_memory
from myxtts.train.evaluation import TrainingEvaluation
from myxtts.train.finetune import check_new_run
from myxtts.train.run import StopFlag, TrainResult, check_finite_weights, locked_run, next_micro
from myxtts.train.setup import build_setup
from myxtts.train.validate import synthesize_samples, validation_loss

log = logging.getLogger(__name__)


def train(cfg: Config, data_path: str | Path, resume: str | Path | None = None,
          progress: bool = True, init_from: str | Path | None = None) -> TrainResult:
    """Train into ``cfg.train.output_dir``, which this process locks while it writes.
    ``init_from``: a trained run or checkpoint to fine-tune (a new run: ``train.finetune``)."""
    return locked_run(cfg.train.output_dir, "myxtts train", _train, cfg, data_path, resume,
                      progress, init_from)


def _train(cfg: Config, data_path: str | Path, resume: str | Path | None = None,
           progress: bool = True, init_from: str | Path | None = None) -> TrainResult:
    out = Path(cfg.train.output_dir)
    check_new_run(out, resume, init_from)
    manager = CheckpointManager(out / "checkpoints", cfg.train.keep_last)
    resume_path = Path(resume) if resume else manager.resumable()
    run = build_setup(cfg, data_path, resume_path, init_from)
    cfg, data, engine, dist, record = run.cfg, run.data, run.engine, run.dist, run.record
    if cfg.train.grad_accum_steps > len(data.sampler):
        raise TrainError(f"train.grad_accum_steps={cfg.train.grad_accum_steps} is more than the "
                         f"{len(data.sampler)} batches of an epoch: one optimizer step would hold "
                         f"them all; give at most {len(data.sampler)} (or a smaller "
                         f"data.batch_frames for more batches)")
    if cfg.train.vocoder:  # checked now, not at the first sample thousands of steps in
        load_vocoder(cfg.train.vocoder, cfg.audio, torch.device("cpu"))
    if dist.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        if record.step < cfg.train.max_steps or not (out / "config.yaml").is_file():
            save_config(cfg, out / "config.yaml")  # what this run trains with, in effect
        data.tokenizer.save(out / "vocab.json")
    logger = build_logger(out, dist.rank, cfg.train.tensorboard)
    n_params = sum(p.numel() for p in engine.model.parameters())
    if dist.rank == 0:
        log.info("model %s: %.2f M parameters on %s, precision %s, %s step, %d train batches/epoch",
                 cfg.model.preset, n_params / 1e6, run.device, str(engine.dtype).replace("torch.", ""),
                 engine.mode, len(data.sampler))
    ctx = _LoopContext(cfg, data, engine, manager, logger, dist, run.device, out, record)
    finished = False
    try:
        with StopFlag() as stop:
            last = ctx.run(stop, progress and dist.rank == 0)
        finished = True
        skipped, _ = engine.nonfinite_counts()  # (the end: one sync)
        return TrainResult(record.step, out, last, record.best_val_loss,
                           stopped_by=stop.signum, skipped_steps=skipped)
    finally:
        logger.close()
        dist.close(wait_for_all=finished)


class BatchStream:
    """The trainer's endless stream of (device batch, real frames), exactly as training sees
    it: the train loader's ``device_feed`` (``data.feed.protocol.DeviceFeed``: side-stream prefetch of a
    store, the data role's slot ring on the fly). It advances the run's data position in
    ``record`` (``epoch``, ``batches_consumed``) as batches are handed out, so a checkpoint
    taken between steps resumes at the next batch. Public so benchmarks measure the real
    input path. ``feed``: the feed, once iteration started."""

    def __init__(self, cfg: Config, data: TrainData, device: torch.device,
                 record: ck.TrainingProgress, copy_log: list | None = None) -> None:
        self.cfg, self.data, self.device, self.record = cfg, data, device, record
        self.copy_log = copy_log  # (start, end) CUDA events per copied batch (profile)
        self.feed: DeviceFeed | None = None

    def __iter__(self) -> Iterator[tuple[Batch, int]]:
        self.feed = feed = self.data.loader.device_feed(
            self.device, hold=self.cfg.train.grad_accum_steps, copy_log=self.copy_log)
        try:
            while True:  # each pass starts where the sampler stands: the record's position
                for batch, frames in feed:
                    self.record.batches_consumed += 1
                    yield batch, frames
                self.record.epoch += 1
                self.record.batches_consumed = 0
        finally:
            feed.close()

    def occupancy(self) -> float | None:
        """The feed's ready batches per request since the last call (None: no figure)."""
        return None if self.feed is None else self.feed.occupancy()


class _LoopContext:
    def __init__(self, cfg: Config, data: TrainData, engine: TrainEngine,
                 manager: CheckpointManager, logger: MetricLogger, dist: DistInfo,
                 device: torch.device, out: Path, record: ck.TrainingProgress):
        self.cfg, self.data, self.engine = cfg, data, engine
        self.manager, self.logger, self.dist, self.device, self.out = manager, logger, dist, device, out
        self.record = record
        self.stream = BatchStream(cfg, data, device, record)
        self.fps = cfg.audio.frames_per_second
        self.saved_step = record.step if record.step else -1  # step of the newest checkpoint
        self.saver = BackgroundSaver(manager, device)  # a save costs the step a copy only
        self.eff: IntervalEfficiency | None = None  # set by run()

    def save(self, val_loss: float | None = None, is_best: bool = False) -> Path | None:
        """Checkpoint the current step (rank 0 writes, in the background: ``artifacts.saver``;
        every rank keeps the record)."""
        r = self.record
        self._check_weights(r.step)  # every rank: DDP keeps the weights alike, all stop alike
        self.saved_step = r.step
        rng_ranks = gather(self.dist, ck.rng_state(self.device)) if self.dist.enabled else None
        if self.dist.rank != 0:
            return None
        extra = {ck.CONFIG: self.cfg.to_dict(), ck.VOCAB: self.data.tokenizer.to_dict(),
                 ck.MEL_MEAN: torch.as_tensor(self.data.mel_mean, dtype=torch.float32),
                 ck.MEL_STD: torch.as_tensor(self.data.mel_std, dtype=torch.float32)}
        state = ck.compose(r, self.engine.state_dict(), extra, rng_ranks)
        return self.saver.save(state, r.step, val_loss, is_best,
                               writes_after=self.engine.after_copy)

    def _check_weights(self, step: int) -> None:
        check_finite_weights(self.engine.modules, step, (
            f"lower train.lr (now {self.cfg.train.lr}), keep train.grad_clip > 0, or try "
            f"--set train.precision=fp32 to rule out overflow"))

    def _efficiency(self) -> IntervalEfficiency | None:
        """GPU utilisation and MFU per log interval (rank 0 logs; the others skip it). A
        failure here costs the figures, never the run."""
        if self.dist.rank != 0:
            return None
        try:
            eff = IntervalEfficiency(self.cfg, self.device, self.engine.dtype,
                                     self.data.vocab_size, len(self.data.languages))
            if self.device.type == "cuda":  # count every bucket shape now, not at log steps
                eff.prepare([(s.batch, s.text, s.frames)
                             for s in set(bucket_shapes(self.data.sampler, self.cfg))])
        except Exception as e:  # e.g. a model op the meta device lacks in some torch version
            log.warning("GPU utilisation/MFU will not be logged: %s: %s", type(e).__name__, e)
            return None
        return eff

    def run(self, stop: StopFlag, show: bool) -> Path | None:
        self.eff = self._efficiency()
        try:
            return self._run(stop, show)
        finally:
            if self.eff is not None:
                self.eff.close()

    def _run(self, stop: StopFlag, show: bool) -> Path | None:
        t, r = self.cfg.train, self.record
        timer = StepTimer(self.device)
        bar = Progress(total=t.max_steps, initial=r.step, enabled=show)
        stream = iter(self.stream)
        last: Path | None = None
        evaluation = TrainingEvaluation(self.cfg, self.data, self.device, self.out) \
            if t.eval_every else None
        self.engine.model.train()
        if self.dist.rank == 0:  # the first save's host buffers now, not at that save
            self.saver.reserve(self.engine.state_dict())
        # A dead loader worker is raised by torch's SIGCHLD handler wherever the main thread
        # is: ``phase`` says what the state is then (``_worker_died``).
        phase, position = "data", (r.epoch, r.batches_consumed)
        try:
            while r.step < t.max_steps:
                self.saver.check()  # a save that failed stops the run here, in one line
                phase, position = "data", (r.epoch, r.batches_consumed)
                got = next_micro(stream, timer, t.grad_accum_steps,
                                 None if self.dist.enabled else lambda: stop.signum is not None)
                if got is None:  # a signal between micro-batches: drop the unfinished cycle
                    r.epoch, r.batches_consumed = position  # its batches are read on resume
                    if self.saved_step != r.step:
                        last = self.save()
                    bar.note(f"stopped by signal in an accumulation cycle after step {r.step}; "
                             f"checkpoint {last}")
                    break
                micro, frames = got
                phase = "step"
                try:
                    self.engine.step(micro)
                except Exception as e:
                    if is_out_of_memory(e):
                        raise TrainError(oom_message(micro, self.cfg)) from e
                    raise
                r.step += 1
                phase = "after"
                step = r.step
                timer.step_end(sum(int(b["mel_lengths"].shape[0]) for b in micro), frames / self.fps)
                if self.eff is not None:
                    self.eff.add([batch_key(b) for b in micro])
                if step % t.log_every == 0 or step == t.max_steps:
                    self._log(step, timer, bar)
                if step % t.val_every == 0 or step == t.max_steps:
                    val = validation_loss(self.engine, self.data, self.device, self.dist)
                    if val is not None:
                        self.logger.scalars(step, val, prefix="val/")
                        bar.note(f"step {step}: val loss {val['loss']:.4f}")
                        is_best = val["loss"] < r.best_val_loss
                        r.best_val_loss = min(r.best_val_loss, val["loss"])
                        last = self.save(val["loss"], is_best)
                if t.synth_every and (step % t.synth_every == 0 or step == t.max_steps):
                    synthesize_samples(self.engine, self.data, self.cfg, self.logger, step,
                                       self.out / "samples", self.device, self.dist.rank)
                if evaluation is not None and (step % t.eval_every == 0 or step == t.max_steps):
                    evaluation(self.engine, self.logger, step, self.dist.rank)
                if (step % t.ckpt_every == 0 or step == t.max_steps) and self.saved_step != step:
                    last = self.save()
                if self._should_stop(stop, step):
                    if self.saved_step != step:
                        last = self.save()
                    bar.note(f"stopped by signal at step {step}; checkpoint {last}")
                    break
        except RuntimeError as e:
            if "DataLoader worker" not in str(e):
                raise
            if phase == "data":  # the unfinished cycle's batches are read again on resume
                r.epoch, r.batches_consumed = position
            raise TrainError(self._worker_died(e, saving=phase != "step")) from e
        finally:
            stream.close()  # closes the feed: stops an on-the-fly data role's producer now
            # the save in flight is written before the run returns (a signal's stop too);
            # its failure is raised unless the run is already failing for another reason
            self.saver.close(report=sys.exc_info()[0] is None)
        bar.close()
        return last

    def _worker_died(self, error: RuntimeError, saving: bool) -> str:
        """A loader worker died (the out-of-memory killer, most often): the last finished
        step is saved (``saving``: unless it struck inside a step, whose state may be half
        updated: the newest checkpoint stands), and the one line says so, with the likely
        cause and the resume."""
        last = self.save() if saving and self.saved_step != self.record.step else None
        self.saver.wait(report=False)
        newest = self.manager.latest()
        kept = (f"checkpoint {last} saved at step {self.record.step}" if last is not None
                else f"the newest checkpoint is {newest}" if newest is not None
                else "no checkpoint was written yet")
        said = str(error).splitlines()[0].strip()
        cause = ("a store file truncated or replaced while the run read it, or /dev/shm full: "
                 "check the data with `myxtts prepare --verify`" if "Bus error" in said
                 else "most likely the out-of-memory killer")
        return (f"a data loader worker died ({said}; {cause}): {kept}; run the same command to "
                f"resume, with fewer --num-workers (now {self.data.loader.num_workers}) or "
                f"--num-workers 0")

    def _should_stop(self, stop: StopFlag, step: int) -> bool:
        """Single process: stop at the first step boundary after a signal. Distributed: every
        rank must stop at the same step (a rank that leaves early would hang the others in an
        all-reduce), so ranks agree on it at log intervals, where the loop syncs anyway."""
        if not self.dist.enabled:
            return stop.signum is not None
        if step % self.cfg.train.log_every:
            return False
        flag = torch.tensor([1.0 if stop.signum is not None else 0.0], device=self.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())

    def _log(self, step: int, timer: StepTimer, bar: Progress) -> None:
        values = self.engine.read()
        iv = timer.collect()
        peak = values.get("nonfinite_run_peak", 0.0)
        if peak >= self.cfg.train.max_nonfinite_in_row:
            self.save()
            raise TrainError(
                f"{int(peak)} consecutive steps had a non-finite loss (step {step}); lower "
                f"train.lr (now {self.cfg.train.lr}), keep train.grad_clip > 0, or try "
                f"--set train.precision=fp32 to rule out overflow")
        values.update(steps_per_s=iv.steps_per_s, utterances_per_s=iv.utterances_per_s,
                      audio_s_per_s=iv.audio_s_per_s, data_wait_share=iv.data_wait_share)
        if self.eff is not None:
            values.update(self.eff.collect(iv.seconds))
        if self.engine.uncaptured_steps is not None:
            values["uncaptured_steps"] = float(self.engine.uncaptured_steps)
        ready = self.stream.occupancy()
        if ready is not None:
            values["data_ready_slots"] = ready
        if self.device.type == "cuda":
            values["max_mem_gb"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        self.logger.scalars(step, values, prefix="train/")
        bar.update_to(step, values)


def oom_message(micro: list[dict[str, torch.Tensor]], cfg: Config) -> str:
    b = micro[0]
    bsz, t_frames = b["mel"].shape[0], b["mel"].shape[1]
    where = (f"a batch of {bsz} utterances x {t_frames} frames (text {b['tokens'].shape[1]} "
             f"tokens, data.batch_frames={cfg.data.batch_frames})")
    if cfg.data.batch_frames == "auto":  # measured to fit: something else took memory
        fraction = max(0.05, round(cfg.data.auto_batch_memory_share - 0.15, 2))
        return (f"out of GPU memory on {where}, although every bucket's worst case fitted "
                f"before step 1 (another process on the GPU?); try --set "
                f"data.auto_batch_memory_share={fraction} (the sizes are measured again)")
    suggest = int(cfg.data.batch_frames * 0.7)
    return (f"out of GPU memory on {where}; try --batch-frames {suggest} or --set "
            f"train.grad_accum_steps={cfg.train.grad_accum_steps * 2} with a smaller batch")
