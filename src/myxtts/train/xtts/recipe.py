"""``myxtts train STORE --init-from XTTS_DIR``: fine-tuning Coqui's XTTS-v2 GPT on a store of
``myxtts prepare --xtts`` (``train.recipe`` gives the lifecycle and the loop).

Read top to bottom: :func:`train_xtts` runs an :class:`XttsRecipe` under the run folder's
lock. ``setup`` opens the store's splits, builds the model (the folder's GPT grown to the
store's vocabulary for a new run, ``train.xtts.base``; the run's own checkpoint on resume),
the engine (``train.engine.TrainEngine`` with ``train.xtts.task.XttsTask``: the same warm-up,
auto batch sizes, compiled blocks, CUDA graphs, precision, EMA and DDP as every run), then the
loaders for the batch sizes the engine chose (``train.xtts.batches``), continuing at the
record's data position. ``train`` steps with the events: log (the one host sync),
validation loss (capped by ``data.max_val_utterances``), evaluation (``train.eval_every``:
the ``evaluation`` handed in, ``train.hooks``), checkpoint. No DVAE runs while training: the
store holds the codes; only the evaluation decodes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from myxtts.artifacts import checkpoint as ck
from myxtts.artifacts.errors import ArtifactError
from myxtts.artifacts.xtts_v2.run import BASE, XttsBase
from myxtts.config import Config, resolve_device, save_config
from myxtts.data.batch import Batch
from myxtts.data.feed.loader import plan_frames
from myxtts.data.feed.prefetch import CopyFeed
from myxtts.data.feed.sampler import BucketBatchSampler
from myxtts.data.store import StoreError
from myxtts.data.xtts_store import XttsStore
from myxtts.model.xtts_v2.gpt import XttsGpt
from myxtts.model.xtts_v2.trainee import XttsGptTrainee
from myxtts.observe.loggers import build_logger
from myxtts.train import finetune
from myxtts.train.distributed import init_distributed
from myxtts.train.efficiency import IntervalEfficiency
from myxtts.train.engine import StepMode, TrainEngine, Workload
from myxtts.train.errors import TrainError, is_out_of_memory
from myxtts.train.hooks import EvaluationFactory, StepEvaluation
from myxtts.train.memory import apply_caps, resolve_caps
from myxtts.train.recipe import Recipe, run
from myxtts.train.run import TrainResult, counted_passes, seed_everything
from myxtts.train.setup import configure_device
from myxtts.train.validation import validation_loss
from myxtts.train.xtts.base import start_from_folder
from myxtts.train.xtts.batches import (
    XttsBatches,
    XttsLoader,
    batch_shapes,
    gpt_code_lengths,
    real_codes,
    xtts_plan,
    xtts_sampler,
)
from myxtts.train.xtts.flops import xtts_batch_key, xtts_step_counter
from myxtts.train.xtts.task import XttsTask

log = logging.getLogger(__name__)
VAL_SEED = 0  # validation cuts the same segments at every validation
CODES_PER_SECOND = 22050 / 1024


def train_xtts(cfg: Config, store: str | Path, resume: str | Path | None = None,
               init_from: str | Path | None = None, progress: bool = True,
               evaluation: EvaluationFactory | None = None) -> TrainResult:
    """Fine-tune the XTTS-v2 GPT of ``init_from`` on ``store`` into ``cfg.train.output_dir``
    (the same call again continues the run from its newest checkpoint). ``evaluation``: what
    scores the run every ``train.eval_every`` steps (``train.hooks``), needed when that is
    set."""
    if cfg.train.eval_every and evaluation is None:
        raise TrainError(f"train.eval_every={cfg.train.eval_every} but no evaluation was given "
                         f"to train_xtts(): pass evaluation=XttsTrainingEvaluation "
                         f"(myxtts.evaluate.xtts_training), as `myxtts train` does")
    return run(XttsRecipe(cfg, store, resume, init_from=init_from, show_progress=progress,
                          evaluation=evaluation))


class XttsRecipe(Recipe):
    """XTTS-v2's fine-tuning run (``train.recipe.Recipe``; module docstring). ``init_from``:
    the XTTS-v2 folder a new run starts from; ``compile_model``: overrides what
    ``train.compile`` resolves to (benchmarks); ``copy_log``: the feed's CUDA events per
    copied batch (the profiler's); ``evaluation``: what scores the run every
    ``train.eval_every`` steps (``train.hooks``: handed from above, built with this recipe
    as its data)."""

    command = "myxtts train"
    events = ("log", "validate", "evaluate", "checkpoint")

    def __init__(self, cfg: Config, data_path: str | Path, resume: str | Path | None = None,
                 *, init_from: str | Path | None = None, show_progress: bool = True,
                 compile_model: bool | None = None, copy_log: list | None = None,
                 evaluation: EvaluationFactory | None = None) -> None:
        super().__init__(cfg, data_path, resume, show_progress=show_progress)
        self.init_from, self.compile_model, self.copy_log = init_from, compile_model, copy_log
        self.make_evaluation = evaluation
        self.evaluation: StepEvaluation | None = None
        self.base: XttsBase | None = None
        self.val_store: XttsStore | None = None
        self.loader: XttsLoader | None = None
        self.sampler: BucketBatchSampler | None = None
        self.val_loader: XttsLoader | None = None
        self.val_sampler: BucketBatchSampler | None = None
        self.feed: CopyFeed | None = None
        self.task: XttsTask | None = None

    # ------------------------------------------------------------------ lifecycle
    def find_checkpoint(self) -> None:
        finetune.check_new_run(self.out, self.resume, self.init_from)
        super().find_checkpoint()
        if self.resume is None and self.init_from is None:
            raise TrainError(f"{self.data_path} is a store for XTTS-v2: give the model it was "
                             f"made for with --init-from XTTS_DIR")

    def setup(self) -> None:
        cfg = self.cfg
        self.dist = dist = init_distributed(cfg.train.device)
        self.device = device = dist.device if dist.enabled else \
            resolve_device(cfg.train.device, "train.device")
        self._check_settings()
        configure_device(device)
        seed_everything(cfg.train.seed + dist.rank)
        apply_caps(resolve_caps(cfg, device, None))  # before anything is allocated on a GPU
        train_store = self._open("train")
        self.val_store = val_store = self._open("val")
        state = self.load_checkpoint(self.resume) if self.resume is not None else None
        if state is None:
            assert self.init_from is not None
            self.base, gpt = start_from_folder(self.init_from, self.data_path, cfg.train.seed)
        else:
            try:
                self.base = XttsBase.from_state(state[BASE], str(self.resume))
            except ArtifactError as e:
                raise TrainError(str(e)) from None
            self._check_store(train_store)
            gpt = XttsGpt(self.base.config)
        config = self.base.config
        model = XttsGptTrainee(gpt, self.base.mel_stats, cfg.xtts.text_loss_weight,
                               cfg.xtts.code_loss_weight)
        self.task = task = XttsTask(config.number_text_tokens, config.args.gpt_num_audio_tokens)
        self.engine = TrainEngine(cfg, model.to(device), device, dist, self.compile_model,
                                  task=task)
        if state is not None:
            self.engine.load_state_dict(state)
            self.record = ck.TrainingProgress.from_state_dict(state[ck.PROGRESS])
            log.info("resuming from %s (step %d)", self.resume, self.record.step)
        self._check_lengths(train_store)
        plan = xtts_plan(train_store, cfg, plan_frames(cfg))
        val_plan = None
        if len(val_store):
            val_plan = xtts_plan(val_store, cfg, plan_frames(cfg), cfg.data.max_val_utterances)
        val_shape = None if val_plan is None else max(
            batch_shapes(val_plan, cfg), key=lambda s: s.batch * s.frames)
        sizes = self.engine.start_up(Workload(batch_shapes(plan, cfg), task.worst_case,
                                              val_shape, run_dir=self.out))
        plan = plan.with_batch_sizes(sizes)
        seed = cfg.data.shuffle_seed
        self.sampler = xtts_sampler(train_store, plan, seed, rank=dist.rank,
                                    world_size=dist.world_size)
        self._continue(self.sampler)
        # On the CPU the loader makes the voice segments' mels (in its workers, beside the
        # step); on a GPU the step makes them, where they cost little and no worker's mel
        # can hold the GPU up.
        stats = self.base.mel_stats if device.type == "cpu" else None
        # An eager step takes each batch at its own widths (a compiled or graphed one keeps
        # one shape per bucket).
        trim = self.engine.mode == StepMode.EAGER
        self.loader = XttsLoader(XttsBatches(train_store, plan, seed, cfg, mel_stats=stats,
                                             trim=trim), self.sampler, cfg.data.num_workers)
        if val_plan is not None:
            self.val_sampler = xtts_sampler(val_store, val_plan, VAL_SEED, rank=dist.rank,
                                            world_size=dist.world_size, shuffle=False,
                                            max_utterances=cfg.data.max_val_utterances,
                                            split_seed=cfg.data.split_seed)
            self.val_loader = XttsLoader(XttsBatches(val_store, val_plan, VAL_SEED, cfg,
                                                     evaluation=True, mel_stats=stats,
                                                     trim=trim),
                                         self.val_sampler, 0)

    def _check_settings(self) -> None:
        """Settings of the myxtts model's training that have no meaning (or no
        implementation) for the GPT, refused in one line rather than ignored."""
        t = self.cfg.train
        for key, value, unset, why in (
                ("train.freeze", t.freeze, "[]", "the GPT trains whole"),
                ("train.self_feed", t.self_feed, "0", "the GPT is teacher-forced"),
                ("train.activation_checkpointing", t.activation_checkpointing, "false",
                 "not for the GPT's blocks"),
                ("train.vocoder", t.vocoder, '""', "XTTS-v2 carries its own decoder"),
                ("train.synth_every", t.synth_every, "0",
                 "no samples in training: `myxtts synthesize -c RUN` speaks with the run")):
            if value:
                raise TrainError(f"{key}={value}: not for XTTS-v2 fine-tuning ({why}); set "
                                 f"{key}={unset}")

    def _open(self, split: str) -> XttsStore:
        try:
            return XttsStore.open(self.data_path, split)
        except StoreError as e:
            raise TrainError(str(e)) from None

    def _check_store(self, store: XttsStore) -> None:
        """A resumed run's store is the one it started on: same vocabulary."""
        assert self.base is not None
        ours = XttsStore.vocab_path(self.data_path).read_text(encoding="utf-8")
        if ours != self.base.vocab:
            raise TrainError(f"{self.data_path} was made with another vocabulary than the run "
                             f"in {self.out} trains; resume on the store the run started with, "
                             f"or start a new run with another --output-dir")

    def _check_lengths(self, store: XttsStore) -> None:
        """Every clip fits the GPT's position tables (one line naming the longest)."""
        assert self.base is not None
        a = self.base.config.args
        positions = gpt_code_lengths(store.audio_lengths)
        worst = int(positions.argmax()) if len(positions) else 0
        if len(positions) and positions[worst] + 2 > a.gpt_max_audio_tokens:
            raise TrainError(f"{self.data_path}: utterance {store.ids[worst]} is "
                             f"{store.audio_lengths[worst] / 22050:.1f} s, longer than the "
                             f"model's {a.gpt_max_audio_tokens - 5} codes; leave it out of "
                             f"the dataset and prepare the store again")
        texts = store.text_lengths
        if len(texts) and int(texts.max()) + 2 > a.gpt_max_text_tokens:
            raise TrainError(f"{self.data_path}: a text has {int(texts.max())} tokens, more "
                             f"than the model's {a.gpt_max_text_tokens - 2}; split it and "
                             f"prepare the store again")

    def _continue(self, sampler: BucketBatchSampler) -> None:
        r = self.record
        if r.data_plan:
            try:
                r.batches_consumed = sampler.resume(r.data_plan, r.epoch, r.batches_consumed)
            except ValueError as e:
                raise TrainError(f"cannot continue the data order from the checkpoint: {e}") \
                    from e
        r.data_plan = sampler.plan_state()

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        state = ck.load(path)
        if BASE not in state:
            raise TrainError(f"{path} is no XTTS-v2 fine-tuning checkpoint; an XTTS store "
                             f"resumes its own runs (choose another --output-dir)")
        return state

    def train(self) -> TrainResult:
        cfg, out, dist = self.cfg, self.out, self.dist
        assert self.loader is not None and self.base is not None
        if cfg.train.grad_accum_steps > len(self.loader):
            raise TrainError(f"train.grad_accum_steps={cfg.train.grad_accum_steps} is more "
                             f"than the {len(self.loader)} batches of an epoch; give at most "
                             f"{len(self.loader)}")
        if dist.rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            save_config(cfg, out / "config.yaml")
            self.base.mark(out)
        self.logger = build_logger(out, dist.rank, cfg.train.tensorboard)
        if dist.rank == 0:
            n = sum(p.numel() for p in self.engine.model.parameters())
            log.info("XTTS-v2 GPT of %s: %.1f M parameters on %s, precision %s, %s step, %d "
                     "train batches/epoch (loader workers: %d)", self.base.folder, n / 1e6,
                     self.device, str(self.engine.dtype).replace("torch.", ""),
                     self.engine.mode, len(self.loader), self.loader.num_workers)
        if cfg.train.eval_every and self.make_evaluation is not None:
            self.evaluation = self.make_evaluation(cfg, self, self.device, out)
        self.engine.model.train()
        self.eff = self._efficiency()
        try:
            return super().train()
        finally:
            if self.eff is not None:
                self.eff.close()

    def _efficiency(self) -> IntervalEfficiency | None:
        """GPU utilisation, TFLOP/s and MFU per log interval, as for every run (rank 0; a
        failure here costs the figures, never the run). The FLOPs are the GPT step's over
        every frame of the voice segments, also where the CPU step skips their silent tails."""
        if self.dist.rank != 0:
            return None
        assert self.base is not None and self.sampler is not None
        shapes = batch_shapes(self.sampler.plan, self.cfg)
        config, samples = self.base.config, shapes[0].ref_frames
        try:
            eff = IntervalEfficiency(self.cfg, self.device, self.engine.dtype,
                                     lambda: xtts_step_counter(config, samples))
            if self.device.type == "cuda":  # count every bucket shape now, not at log steps
                eff.count_ahead([(s.batch, s.text, s.frames) for s in set(shapes)])
        except Exception as e:  # e.g. a model op the meta device lacks in some torch version
            log.warning("GPU utilisation/MFU will not be logged: %s: %s", type(e).__name__, e)
            return None
        return eff

    # ------------------------------------------------------------------ the step
    def batches(self) -> Iterator[tuple[Batch, int]]:
        assert self.loader is not None
        self.feed = CopyFeed(self.loader, self.device, self.cfg.data.prefetch_batches,
                             self.copy_log, frames=real_codes)
        return counted_passes(self.feed, self.record)

    def utterances(self, micro: list[Batch]) -> int:
        return sum(int(b["codes"].shape[0]) for b in micro)

    def frames_per_second(self) -> float:
        return CODES_PER_SECOND

    def step(self, micro: list[Batch]) -> None:
        try:
            self.engine.step(micro)
        except Exception as e:
            if is_out_of_memory(e) and self.task is not None:
                b = micro[0]
                raise TrainError(f"out of GPU memory on {self.task.describe(b)}; try "
                                 f"--batch-frames {int(plan_frames(self.cfg) * 0.7)} or "
                                 f"--set data.batch_frames=auto") from e
            raise
        self.record.step += 1
        if self.eff is not None:  # the shapes of the log interval (metadata: no sync)
            self.eff.add([xtts_batch_key(b) for b in micro])

    def skipped_steps(self) -> int:
        return self.engine.nonfinite_counts()[0]

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_extra(self) -> dict[str, Any]:
        assert self.base is not None
        return {ck.CONFIG: self.cfg.to_dict(), BASE: self.base.to_state()}

    def weights_fix(self) -> str:
        return (f"lower train.lr (now {self.cfg.train.lr}) or try --set "
                f"train.precision=fp32 to rule out overflow")

    # ------------------------------------------------------------------ events
    def occupancy(self) -> float | None:
        return self.feed.occupancy() if self.feed is not None else None

    def validate(self, step: int) -> None:
        val = validation_loss(self.engine, self, self.device, self.dist)
        if val is not None:
            self.keep_validation(step, val, f"step {step}: val loss {val['loss']:.4f} (codes "
                                            f"{val['code_ce']:.4f})")

    def evaluate(self, step: int) -> None:
        if self.evaluation is not None:
            self.evaluation(self.engine, self.logger, step, self.dist.rank)
