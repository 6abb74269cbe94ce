"""Everything a run needs before its first step, built the way training builds it.

``myxtts train`` and ``myxtts profile`` share this, so a profile measures the same
loader, model, precision, compile mode, CUDA graphs and frame budget as the run it
advises: data (``train.data``), model and optimizer, the resumed state, the measured batch
sizes (``data.batch_frames=auto``, ``train.budget``) and the warm-up of every bucket shape
(``train.warmup``). A fine-tuning run starts from another run's model (``train.finetune``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.config import Config, ConfigError, config_from_dict, resolve_device
from myxtts.train import checkpoint_state as state_io
from myxtts.train import finetune
from myxtts.train.data import TrainData, bucket_shapes, is_store, open_train_data
from myxtts.train.distributed import DistInfo, agree, init_distributed, wrap_ddp
from myxtts.train.errors import TrainError
from myxtts.train.memory import apply_caps, check_feature_memory, resolve_caps
from myxtts.train.mode import StepPlan, plan_step
from myxtts.train.optim import build_optimizer, build_scheduler
from myxtts.train.run import seed_everything
from myxtts.train.step import TrainStep

if TYPE_CHECKING:
    from myxtts.train.warmup import WarmupReport

log = logging.getLogger(__name__)

# Architecture keys come from the checkpoint on resume (a changed preset cannot load).
_ARCH_SECTIONS = ("audio", "text", "model")


@dataclass
class TrainSetup:
    """A run ready for step 1 (``cfg``: with the resumed checkpoint's architecture)."""

    cfg: Config
    dist: DistInfo
    device: torch.device
    data: TrainData
    model: torch.nn.Module
    step_fn: TrainStep
    record: ck.TrainingProgress


def _resume_config(cfg: Config, saved: dict[str, Any]) -> Config:
    """Keep the run's training knobs, but take architecture and features from the checkpoint;
    model keys that differ from the checkpoint's are refused, naming them (its weights are of
    that model)."""
    merged = cfg.to_dict()
    diffs = [f"model.{k}: checkpoint {v!r}, asked {merged['model'].get(k)!r}"
             for k, v in sorted(saved["model"].items()) if merged["model"].get(k) != v]
    if diffs:
        raise TrainError(f"the run's checkpoint holds another model than the config asks for "
                         f"({'; '.join(diffs)}); resume without --model-size and model.* "
                         f"settings, or start a new run with another --output-dir")
    for section in _ARCH_SECTIONS:
        if merged[section] != saved[section]:
            log.warning("config section '%s' differs from the checkpoint's; using the checkpoint's",
                        section)
        merged[section] = saved[section]
    return config_from_dict(merged)


def _schedule_from_config(step_fn: TrainStep, cfg: Config) -> None:
    """On resume the learning rate follows the config (``train.lr``, warm-up, ``max_steps``):
    the schedule is rebuilt at the restored step, not taken from the checkpoint."""
    from myxtts.train.optim import lr_factor

    sched, groups = step_fn.sched, step_fn.opt.param_groups
    sched.base_lrs = [cfg.train.lr for _ in groups]
    factor = lr_factor(sched.last_epoch, cfg.train)
    for group, base in zip(groups, sched.base_lrs):
        group["initial_lr"] = base
        group["lr"] = base * factor
    sched._last_lr = [group["lr"] for group in groups]


def build_setup(cfg: Config, data_path: str | Path, resume_path: Path | None,
                init_from: str | Path | None = None) -> TrainSetup:
    """Data, model, optimizer and step from ``cfg`` (and the checkpoint at ``resume_path``,
    or the trained model ``init_from`` fine-tunes), batch sizes fitted and every bucket
    shape warmed up on a GPU or when compiled."""
    dist = init_distributed(cfg.train.device)
    device = dist.device if dist.enabled else resolve_device(cfg.train.device, "train.device")
    state: dict[str, Any] | None = None
    record = ck.TrainingProgress()
    if resume_path is not None:
        state = ck.load(resume_path)
        cfg = _resume_config(cfg, state[ck.CONFIG])
        record = ck.TrainingProgress.from_state_dict(state[ck.PROGRESS])
        log.info("resuming from %s (step %d)", resume_path, record.step)
    base: dict[str, Any] | None = None
    if init_from is not None:
        base_file, base = finetune.load_base(init_from)
        cfg = finetune.base_config(cfg, base, base_file,
                                   Path(data_path) if is_store(Path(data_path)) else None)
    configure_device(device)
    seed_everything(cfg.train.seed + dist.rank)
    on_the_fly = Path(data_path).is_dir() and not is_store(Path(data_path))
    if dist.enabled and on_the_fly and cfg.data.data_device.startswith("cuda:"):
        raise ConfigError(f"data.data_device={cfg.data.data_device} under torchrun would make every "
                          f"rank compute features on that one GPU; use data.data_device=cuda (each "
                          f"rank on its own GPU, a second stream) or cpu")
    caps = resolve_caps(cfg, device, resolve_device(cfg.data.data_device, "data.data_device")
                        if on_the_fly else None)
    apply_caps(caps)  # before anything is allocated on a capped GPU
    data, failure = None, None
    try:
        data = open_train_data(cfg, data_path, device, dist, state, base)
    except (TrainError, ConfigError, OSError, ValueError) as e:  # e.g. a store missing on a node
        failure = e
    agree(dist, failure)
    assert data is not None
    if state is not None:
        data.check_vocabulary(state)
    from myxtts.model.xtts import build_model

    if base is not None:
        finetune.check_freeze(cfg.train.freeze, base, data.tokenizer)
    model = build_model(cfg, data.vocab_size, len(data.languages), data.mel_mean, data.mel_std)
    if base is not None:
        finetune.load_base_weights(model, base, data.tokenizer)
        if dist.rank == 0:
            log.info("%s", finetune.describe(base_file, base, data.tokenizer))
    model = model.to(device)
    step_fn, plan = build_step(cfg, model, device, dist)
    if state is not None:
        state_io.restore(state, model, step_fn.opt, step_fn.sched, step_fn.scaler, device, dist.rank,
                   dist.world_size, step_fn.ema)
        step_fn.load_nonfinite_counts(record.nonfinite_steps, record.nonfinite_in_row)
        _schedule_from_config(step_fn, cfg)
    reserve = graphs_reserve(step_fn, data, cfg) if plan.graphs else 0
    fit_batches(step_fn, data, cfg, dist, Path(cfg.train.output_dir), reserve)
    data.continue_from(state, record)
    if on_the_fly:
        check_feature_memory(data.loader.feature_work(), caps)
    for attempt in range(3) if step_fn.compiled or device.type == "cuda" else []:
        report = warm_up_buckets(step_fn, data, cfg, dist, plan.graphs)
        sizes = [report.resized.get(s, s.batch) for s in bucket_shapes(data.sampler, cfg)]
        smaller = _shrink_beside_graphs(step_fn, cfg, sizes, reserve)
        if report.resized or smaller:  # the loader follows what the warm-up captured
            data.set_batch_sizes(smaller or sizes)
            data.continue_from(state, record)
        if smaller is None:
            break
        if attempt == 2:
            raise TrainError(f"the CUDA graphs and what runs beside them (validation, samples, "
                             f"the data role: {reserve / 2**30:.1f} GiB) do not fit this GPU; "
                             f"lower data.auto_batch_memory_share or use --set "
                             f"train.cuda_graphs=off")
    return TrainSetup(cfg, dist, device, data, model, step_fn, record)


def graphs_reserve(step_fn: TrainStep, data: TrainData, cfg: Config) -> int:
    """Bytes a graphed run needs beside the graphs' pool (``budget.side_reserve``): the
    largest validation batch's forward and, on the fly with features on the training GPU,
    the data role's largest batch. Measured with the random streams put back after."""
    if step_fn.device.type != "cuda":
        return 0
    from myxtts.train.budget import CudaMemory, side_reserve

    val = None if data.val_sampler is None else max(
        bucket_shapes(data.val_sampler, cfg), key=lambda s: s.batch * s.frames)
    work = data.loader.feature_work()
    role = work.run if work is not None and work.device == step_fn.device else None
    with torch.random.fork_rng(devices=[step_fn.device]):
        return side_reserve(step_fn, val, data.vocab_size, len(data.languages),
                            CudaMemory(step_fn.device), role)


def _shrink_beside_graphs(step_fn: TrainStep, cfg: Config, sizes: list[int],
                          reserve: int) -> list[int] | None:
    """After a graphed warm-up: None if the graphs' pool plus ``reserve`` fit the training
    GPU's share; else smaller batch sizes (said in one warning), the graphs dropped for the
    warm-up to capture again."""
    if step_fn.graphs is None or step_fn.device.type != "cuda":
        return None
    from myxtts.train.budget import GIB, CudaMemory, shrink_for_graphs
    from myxtts.train.memory import MemoryCaps

    memory = CudaMemory(step_fn.device)
    share = MemoryCaps(step_fn.device, None, cfg.train.device_memory_cap, 0.0).training_share()
    cap = int(min(share * memory.total, memory.available))
    pool = int(torch.cuda.memory_reserved(step_fn.device))
    smaller = shrink_for_graphs(sizes, pool, reserve, cap)
    if smaller is not None:
        log.warning("after the warm-up the CUDA graphs hold %.1f GiB and validation, samples and "
                    "the data role need %.1f GiB beside them: more than the %.1f GiB this run "
                    "may use; batch sizes %s -> %s, capturing again", pool / GIB, reserve / GIB,
                    cap / GIB, sizes, smaller)
        step_fn.graphs = None
        memory.release()
    return smaller


def configure_device(device: torch.device) -> None:
    """On a GPU: make it the current device (events, streams and syncs default to the
    training GPU) and allow TF32 matmuls and convolutions."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def build_step(cfg: Config, model: torch.nn.Module, device: torch.device, dist: DistInfo,
               compile_model: bool | None = None) -> tuple[TrainStep, StepPlan]:
    """The training step of ``model`` (on ``device``) and its plan (:func:`plan_step`):
    activation checkpointing, AdamW and its schedule from ``cfg``; compiled as the plan says
    unless ``compile_model``."""
    model.set_activation_checkpointing(cfg.train.activation_checkpointing)
    finetune.freeze(model, cfg.train.freeze)
    opt, fused = build_optimizer(model, cfg.train)
    plan = plan_step(cfg, device, dist.enabled, fused)
    if compile_model is not None:
        plan = replace(plan, compile=compile_model)
    if plan.note and dist.rank == 0:
        log.warning("%s", plan.note)
    step = TrainStep(model, opt, build_scheduler(opt, cfg.train), cfg, device, fused,
                     compile_model=plan.compile, ddp_model=wrap_ddp(model, dist))
    return step, plan


def fit_batches(step_fn: TrainStep, data: TrainData, cfg: Config, dist: DistInfo,
                out: Path, reserve: int = 0) -> list[int] | None:
    """``data.batch_frames=auto`` on a GPU: measure each bucket's largest batch (or read the
    run folder's cache) and rebuild the train loader with those sizes, which it returns
    (None: the planned sizes stay). ``reserve``: bytes kept free beside the step."""
    if cfg.data.batch_frames != "auto" or step_fn.device.type != "cuda":
        return None
    from myxtts.train.budget import auto_batch_sizes

    planned = bucket_shapes(data.sampler, cfg)
    echo = log.info if dist.rank == 0 else (lambda _: None)
    sizes = auto_batch_sizes(step_fn, planned, [s.batch for s in planned], cfg, out,
                             data.vocab_size, len(data.languages), dist, echo=echo,
                             reserve=reserve)
    data.set_batch_sizes(sizes)
    return sizes


def warm_up_buckets(step_fn: TrainStep, data: TrainData, cfg: Config, dist: DistInfo,
                    graphs: bool) -> WarmupReport:
    """Every bucket shape before step 1: compile and capture now, with a progress line per
    shape, instead of pausing the run later, and prove on a GPU that each bucket's worst case
    fits (``train.warmup``). Under DDP the ranks warm up without DDP's gradient hooks, like
    the auto budget's probe: a rank that runs out of memory must not leave the others
    waiting in an all-reduce; every rank then stops with its error (``agree``)."""
    from myxtts.train.graphs import CudaCapture
    from myxtts.train.warmup import warm_up

    shapes = sorted(set(bucket_shapes(data.sampler, cfg)), key=lambda s: s.frames)
    echo = log.info if dist.rank == 0 else (lambda _: None)
    report, failure = None, None
    try:
        with step_fn.without_ddp():
            report = warm_up(step_fn, shapes, data.vocab_size, len(data.languages),
                             capture=CudaCapture(step_fn.device) if graphs else None, echo=echo)
    except TrainError as e:
        failure = e
    agree(dist, failure)
    assert report is not None
    echo(f"warm-up: {len(shapes)} bucket shapes in {report.seconds:.1f} s "
         f"({report.graphs_compiled} graphs compiled, {report.shapes_captured} shapes captured "
         f"as CUDA graphs); {step_fn.mode} step")
    return report
