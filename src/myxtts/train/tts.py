"""``myxtts train``: the TTS model's recipe (``train.recipe`` gives the lifecycle and the loop).

Read top to bottom: :func:`train` runs a :class:`TTSRecipe` under the run folder's lock.
``setup`` builds everything from the config in the steps of ``train.setup`` (data and its
bucket plan, model, engine, the checkpoint of the run folder restored by ``restore``, the
engine started up, the train loader built once); ``train`` opens the run folder and steps
to ``train.max_steps`` with the events: log (the one host sync), validation loss, samples,
evaluation, checkpoint. Batches arrive on the device through :class:`BatchStream`, which
advances the record's data position as they are handed out.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.artifacts.saver import BackgroundSaver
from myxtts.artifacts.vocoder import load_vocoder
from myxtts.config import Config, resolve_device, save_config
from myxtts.data.batch import Batch
from myxtts.data.feed.protocol import DeviceFeed
from myxtts.data.store import FeatureStore, StoreError
from myxtts.model.xtts import build_model
from myxtts.observe.flops import batch_key
from myxtts.observe.loggers import build_logger
from myxtts.train import finetune
from myxtts.train.data import TrainData, bucket_shapes, is_store
from myxtts.train.distributed import init_distributed
from myxtts.train.efficiency import IntervalEfficiency, meta_step_counter
from myxtts.train.engine import StepTask, TrainEngine, TTSTask
from myxtts.train.errors import TrainError, is_out_of_memory
from myxtts.train.hooks import EvaluationFactory, StepEvaluation
from myxtts.train.memory import check_feature_memory
from myxtts.train.recipe import Recipe, run
from myxtts.train.run import TrainResult, counted_passes
from myxtts.train.samples import synthesize_samples
from myxtts.train.setup import open_source, resume_config, train_data, workload
from myxtts.train.validation import validation_loss

log = logging.getLogger(__name__)


def train(cfg: Config, data_path: str | Path, resume: str | Path | None = None,
          progress: bool = True, init_from: str | Path | None = None,
          evaluation: EvaluationFactory | None = None) -> TrainResult:
    """Train into ``cfg.train.output_dir``, which this process locks while it writes.
    ``init_from``: a trained run or checkpoint to fine-tune (a new run: ``train.finetune``);
    ``evaluation``: what scores the run every ``train.eval_every`` steps (``train.hooks``),
    needed when that is set."""
    if cfg.train.eval_every and evaluation is None:
        raise TrainError(f"train.eval_every={cfg.train.eval_every} but no evaluation was given "
                         f"to train(): pass evaluation=TrainingEvaluation "
                         f"(myxtts.evaluate.training), as `myxtts train` does")
    return run(TTSRecipe(cfg, data_path, resume, init_from=init_from, show_progress=progress,
                         evaluation=evaluation))


class BatchStream:
    """The trainer's endless stream of (device batch, real frames), exactly as training sees
    it: the train loader's ``device_feed`` (``data.feed.protocol.DeviceFeed``: side-stream
    prefetch of a store, the data role's slot ring on the fly). It advances the run's data
    position in ``record`` (``epoch``, ``batches_consumed``) as batches are handed out, so a
    checkpoint taken between steps resumes at the next batch. ``feed``: the feed, once
    iteration started."""

    def __init__(self, cfg: Config, data: TrainData, device: torch.device,
                 record: ck.TrainingProgress, copy_log: list | None = None) -> None:
        self.cfg, self.data, self.device, self.record = cfg, data, device, record
        self.copy_log = copy_log  # (start, end) CUDA events per copied batch (profile)
        self.feed: DeviceFeed | None = None

    def __iter__(self) -> Iterator[tuple[Batch, int]]:
        self.feed = self.data.loader.device_feed(
            self.device, hold=self.cfg.train.grad_accum_steps, copy_log=self.copy_log)
        yield from counted_passes(self.feed, self.record)

    def occupancy(self) -> float | None:
        """The feed's ready batches per request since the last call (None: no figure)."""
        return None if self.feed is None else self.feed.occupancy()


class TTSRecipe(Recipe):
    """The TTS model's run (``train.recipe.Recipe``). ``init_from``: a trained run or
    checkpoint to fine-tune; ``compile_model``: overrides what ``train.compile`` resolves to
    (benchmarks time both); ``copy_log``: the feed's CUDA events per copied batch (the
    profiler's); ``evaluation``: what scores the run every ``train.eval_every`` steps
    (``train.hooks``: handed from above, the evaluation layer's)."""

    command = "myxtts train"
    events = ("log", "validate", "samples", "evaluate", "checkpoint")

    def __init__(self, cfg: Config, data_path: str | Path, resume: str | Path | None = None,
                 *, init_from: str | Path | None = None, show_progress: bool = True,
                 compile_model: bool | None = None, copy_log: list | None = None,
                 evaluation: EvaluationFactory | None = None) -> None:
        super().__init__(cfg, data_path, resume, show_progress=show_progress)
        self.init_from, self.compile_model, self.copy_log = init_from, compile_model, copy_log
        self.make_evaluation = evaluation
        self.data: TrainData | None = None
        self.evaluation: StepEvaluation | None = None
        self.batch_stream: BatchStream | None = None

    # ------------------------------------------------------------------ lifecycle
    def find_checkpoint(self) -> None:
        finetune.check_new_run(self.out, self.resume, self.init_from)  # before the checkpoint
        super().find_checkpoint()

    def setup(self) -> None:
        """Data, model and engine from the config (with ``resume``'s checkpoint restored, or
        the model ``init_from`` fine-tunes), the engine started up for the data's bucket
        shapes, then the train loader, built once at the sizes it chose, continuing at the
        record's data position. Nothing is written (``open_run`` does that for a run)."""
        self.dist = dist = init_distributed(self.cfg.train.device)
        self.device = device = dist.device if dist.enabled else \
            resolve_device(self.cfg.train.device, "train.device")
        state = self.load_checkpoint(self.resume) if self.resume is not None else None
        base: dict[str, Any] | None = None
        if self.init_from is not None:
            base_file, base = finetune.load_base(self.init_from)
            self.cfg = finetune.base_config(self.cfg, base, base_file, self.data_path
                                            if is_store(self.data_path) else None)
        cfg = self.cfg
        source, caps = open_source(cfg, self.data_path, device, dist, state, base)
        model = build_model(cfg, source.vocab_size, len(source.languages), source.mel_mean,
                            source.mel_std)
        if base is not None:
            finetune.load_base_weights(model, base, source.tokenizer)
            if dist.rank == 0:
                log.info("%s", finetune.describe(base_file, base, source.tokenizer))
        task = TTSTask(cfg, source.vocab_size, len(source.languages))
        self.engine = TrainEngine(cfg, model.to(device), device, dist, self.compile_model,
                                  task=task)
        if state is not None:
            self.restore(state)
        sizes = self.engine.start_up(workload(source, cfg, self.engine))
        self.data = train_data(source, sizes, dist)
        self.data.continue_from(self.record)
        check_feature_memory(self.data.loader.feature_work(), caps)  # (on the fly, capped)

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        """The checkpoint to resume, read and checked; the run takes its architecture (the
        config's training knobs stay this command's)."""
        state = ck.load(path)
        self.cfg = resume_config(self.cfg, state[ck.CONFIG])
        return state

    def restore(self, state: dict[str, Any]) -> None:
        """The one restorer: the engine's state (weights, optimizer, schedule, scaler,
        average, random streams, non-finite counts) and the progress record (step, best
        validation loss, the data position the loader continues from)."""
        self.engine.load_state_dict(state)
        self.record = ck.TrainingProgress.from_state_dict(state[ck.PROGRESS])
        log.info("resuming from %s (step %d)", self.resume, self.record.step)

    def train(self) -> TrainResult:
        self.open_run()
        try:
            return super().train()
        finally:
            if self.eff is not None:
                self.eff.close()

    def open_run(self) -> None:
        """What a training run checks and writes before step 1: the accumulation fits an
        epoch, the samples' vocoder loads, the run's config and vocabulary, the loggers,
        the efficiency meter, the evaluation and the first save's host buffers."""
        cfg, data, engine, dist, out = self.cfg, self.data, self.engine, self.dist, self.out
        assert data is not None
        t = cfg.train
        if t.grad_accum_steps > len(data.sampler):
            raise TrainError(f"train.grad_accum_steps={t.grad_accum_steps} is more than the "
                             f"{len(data.sampler)} batches of an epoch: one optimizer step would "
                             f"hold them all; give at most {len(data.sampler)} (or a smaller "
                             f"data.batch_frames for more batches)")
        if t.vocoder:  # checked now, not at the first sample thousands of steps in
            load_vocoder(t.vocoder, cfg.audio, torch.device("cpu"))
        if dist.rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            if self.record.step < t.max_steps or not (out / "config.yaml").is_file():
                save_config(cfg, out / "config.yaml")  # what this run trains with, in effect
            data.tokenizer.save(out / "vocab.json")
        self.logger = build_logger(out, dist.rank, t.tensorboard)
        n_params = sum(p.numel() for p in engine.model.parameters())
        if dist.rank == 0:
            log.info("model %s: %.2f M parameters on %s, precision %s, %s step, %d train "
                     "batches/epoch", cfg.model.preset, n_params / 1e6, self.device,
                     str(engine.dtype).replace("torch.", ""), engine.mode, len(data.sampler))
        self.eff = self._efficiency()
        if t.eval_every and self.make_evaluation is not None:
            self.evaluation = self.make_evaluation(cfg, data, self.device, out)
        engine.model.train()
        self.saver = BackgroundSaver(self.manager, self.device)  # a save costs a copy only
        if dist.rank == 0:  # the first save's host buffers now, not at that save
            self.saver.reserve(engine.state_dict())

    def _efficiency(self) -> IntervalEfficiency | None:
        """GPU utilisation and MFU per log interval (rank 0 logs; the others skip it). A
        failure here costs the figures, never the run."""
        if self.dist.rank != 0:
            return None
        assert self.data is not None
        try:
            data = self.data
            eff = IntervalEfficiency(self.cfg, self.device, self.engine.dtype, lambda: (
                meta_step_counter(self.cfg, data.vocab_size, len(data.languages))))
            if self.device.type == "cuda":  # count every bucket shape now, not at log steps
                eff.count_ahead([(s.batch, s.text, s.frames)
                                 for s in set(bucket_shapes(self.data.sampler, self.cfg))])
        except Exception as e:  # e.g. a model op the meta device lacks in some torch version
            log.warning("GPU utilisation/MFU will not be logged: %s: %s", type(e).__name__, e)
            return None
        return eff

    # ------------------------------------------------------------------ the step
    def batches(self) -> Iterator[tuple[Batch, int]]:
        assert self.data is not None
        self.batch_stream = BatchStream(self.cfg, self.data, self.device, self.record,
                                        self.copy_log)
        return iter(self.batch_stream)

    def step(self, micro: list[Batch]) -> None:
        try:
            self.engine.step(micro)
        except Exception as e:
            if is_out_of_memory(e):
                raise TrainError(oom_message(micro, self.cfg, self.engine.task)) from e
            raise
        self.record.step += 1
        if self.eff is not None:  # (a training run's: the FLOPs of its log interval)
            self.eff.add([batch_key(b) for b in micro])

    def skipped_steps(self) -> int:
        return self.engine.nonfinite_counts()[0]

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_extra(self) -> dict[str, Any]:
        assert self.data is not None
        return {ck.CONFIG: self.cfg.to_dict(), ck.VOCAB: self.data.tokenizer.to_dict(),
                ck.MEL_MEAN: torch.as_tensor(self.data.mel_mean, dtype=torch.float32),
                ck.MEL_STD: torch.as_tensor(self.data.mel_std, dtype=torch.float32)}

    def weights_fix(self) -> str:
        return (f"lower train.lr (now {self.cfg.train.lr}), keep train.grad_clip > 0, or try "
                f"--set train.precision=fp32 to rule out overflow")

    # ------------------------------------------------------------------ events
    def occupancy(self) -> float | None:
        return self.batch_stream.occupancy() if self.batch_stream is not None else None

    def validate(self, step: int) -> None:
        val = validation_loss(self.engine, self.data, self.device, self.dist)
        if val is not None:
            self.keep_validation(step, val, f"step {step}: val loss {val['loss']:.4f}")

    def samples(self, step: int) -> None:
        synthesize_samples(self.engine, self.data, self.cfg, self.logger, step,
                           self.out / "samples", self.device, self.dist.rank)

    def evaluate(self, step: int) -> None:
        if self.evaluation is not None:
            self.evaluation(self.engine, self.logger, step, self.dist.rank)

    # ------------------------------------------------------------------ failures
    def loop_failure(self, error: RuntimeError) -> Exception | None:
        """A dead loader worker (raised by torch's SIGCHLD handler wherever the main thread
        is: ``phase`` says what the state is then) becomes one line; the last finished step
        is saved unless the death struck inside a step, whose state may be half updated."""
        if "DataLoader worker" not in str(error):
            return None
        if self.phase == "data":  # the unfinished cycle's batches are read again on resume
            self.record.epoch, self.record.batches_consumed = self.position
        return TrainError(self._worker_died(error, saving=self.phase != "step"))

    def _worker_died(self, error: RuntimeError, saving: bool) -> str:
        last = self.save_checkpoint() if saving and self.saved_step != self.record.step \
            else None
        if self.saver is not None:
            self.saver.wait(report=False)
        newest = self.manager.latest()
        kept = (f"checkpoint {last} saved at step {self.record.step}" if last is not None
                else f"the newest checkpoint is {newest}" if newest is not None
                else "no checkpoint was written yet")
        said = str(error).splitlines()[0].strip()
        damaged = _store_problem(self.data_path) if "Bus error" in said else None
        if damaged is not None:  # a worker read past the end of a store file that shrank
            return (f"a data loader worker died ({said}) reading a damaged store: {damaged}; "
                    f"{kept}; then run the same command to resume")
        cause = ("a store file truncated or replaced while the run read it, or /dev/shm full: "
                 "check the data with `myxtts prepare --verify`" if "Bus error" in said
                 else "most likely the out-of-memory killer")
        assert self.data is not None
        return (f"a data loader worker died ({said}; {cause}): {kept}; run the same command to "
                f"resume, with fewer --num-workers (now {self.data.loader.num_workers}) or "
                f"--num-workers 0")


def _store_problem(path: Path) -> str | None:
    """What is wrong with the files of the store at ``path`` now (a file that shrank or
    went missing, named), or None where they are whole or ``path`` is no store."""
    if not is_store(path):
        return None
    try:
        for split in ("train", "val"):
            FeatureStore.open(path, split)
    except StoreError as e:
        return str(e)
    return None


def oom_message(micro: list[dict[str, torch.Tensor]], cfg: Config, task: StepTask) -> str:
    """The one line of an out-of-memory step: the batch (``task.describe``) and the fix."""
    where = f"a batch of {task.describe(micro[0])} (data.batch_frames={cfg.data.batch_frames})"
    if cfg.data.batch_frames == "auto":  # measured to fit: something else took memory
        fraction = max(0.05, round(cfg.data.auto_batch_memory_share - 0.15, 2))
        return (f"out of GPU memory on {where}, although every bucket's worst case fitted "
                f"before step 1 (another process on the GPU?); try --set "
                f"data.auto_batch_memory_share={fraction} (the sizes are measured again)")
    suggest = int(cfg.data.batch_frames * 0.7)
    return (f"out of GPU memory on {where}; try --batch-frames {suggest} or --set "
            f"train.grad_accum_steps={cfg.train.grad_accum_steps * 2} with a smaller batch")
