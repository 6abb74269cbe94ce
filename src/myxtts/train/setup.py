"""Everything a run needs before its first step, built the way training builds it.

``myxtts train`` and ``myxtts profile`` share this, so a profile measures the same
loader, model, precision, compile mode, CUDA graphs and frame budget as the run it
advises: data (``train.data``), model and optimizer, the resumed state, the measured batch
sizes (``data.batch_frames=auto``, ``train.budget``) and the warm-up of every bucket shape
(``train.warmup``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from myxtts.config import Config, ConfigError, config_from_dict, resolve_device
from myxtts.train import checkpoint as ck
from myxtts.train.data import TrainData, bucket_shapes, is_store, open_train_data
from myxtts.train.distributed import DistInfo, agree, init_distributed, wrap_ddp
from myxtts.train.errors import TrainError
from myxtts.train.memory import apply_caps, check_feature_memory, resolve_caps
from myxtts.train.optim import build_optimizer, build_scheduler
from myxtts.train.run import seed_everything
from myxtts.train.step import TrainStep, resolve_compile, resolve_graphs, resolve_precision

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
    """Keep the run's training knobs, but take architecture and features from the checkpoint."""
    merged = cfg.to_dict()
    for section in _ARCH_SECTIONS:
        if merged[section] != saved[section]:
            log.warning("config section '%s' differs from the checkpoint's; using the checkpoint's",
                        section)
        merged[section] = saved[section]
    return config_from_dict(merged)


def build_setup(cfg: Config, data_path: str | Path, resume_path: Path | None) -> TrainSetup:
    """Data, model, optimizer and step from ``cfg`` (and the checkpoint at ``resume_path``),
    batch sizes fitted and every bucket shape warmed up on a GPU or when compiled."""
    dist = init_distributed(cfg.train.device)
    device = dist.device if dist.enabled else resolve_device(cfg.train.device, "train.device")
    state: dict[str, Any] | None = None
    record = ck.TrainingProgress()
    if resume_path is not None:
        state = ck.load(resume_path)
        cfg = _resume_config(cfg, state[ck.CONFIG])
        record = ck.TrainingProgress.from_state_dict(state[ck.PROGRESS])
        log.info("resuming from %s (step %d)", resume_path, record.step)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # events, streams and syncs default to the training GPU
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

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
        data = open_train_data(cfg, data_path, device, dist, state)
    except (TrainError, ConfigError, OSError, ValueError) as e:  # e.g. a store missing on a node
        failure = e
    agree(dist, failure)
    assert data is not None
    from myxtts.model.xtts import build_model

    model = build_model(cfg, data.vocab_size, len(data.languages), data.mel_mean, data.mel_std).to(device)
    model.set_activation_checkpointing(cfg.train.activation_checkpointing)
    opt, fused = build_optimizer(model, cfg.train)
    sched = build_scheduler(opt, cfg.train)
    graphs = resolve_graphs(cfg.train.cuda_graphs, device,
                            resolve_precision(cfg.train.precision, device), dist.enabled, fused)
    step_fn = TrainStep(model, opt, sched, cfg, device, fused,
                        compile_model=resolve_compile(cfg.train.compile, device),
                        ddp_model=wrap_ddp(model, dist))
    if state is not None:
        ck.restore(state, model, opt, sched, step_fn.scaler, device, dist.rank, dist.world_size)
        step_fn.load_nonfinite_counts(record.nonfinite_steps, record.nonfinite_in_row)
    _fit_batches(step_fn, data, cfg, dist, Path(cfg.train.output_dir))
    data.continue_from(state, record)
    if on_the_fly:
        check_feature_memory(data.loader.featurizer, data.loader.largest_raw_batch(), caps)
    if step_fn.compiled or device.type == "cuda":  # (graphs are CUDA-only)
        _warm_up(step_fn, data, cfg, dist, graphs)
    return TrainSetup(cfg, dist, device, data, model, step_fn, record)


def _fit_batches(step_fn: TrainStep, data: TrainData, cfg: Config, dist: DistInfo,
                 out: Path) -> None:
    """``data.batch_frames=auto`` on a GPU: measure each bucket's largest batch (or read the
    run folder's cache) and rebuild the train loader with those sizes."""
    if cfg.data.batch_frames != "auto" or step_fn.device.type != "cuda":
        return
    from myxtts.train.budget import auto_batch_sizes

    planned = bucket_shapes(data.sampler, cfg)
    echo = log.info if dist.rank == 0 else (lambda _: None)
    sizes = auto_batch_sizes(step_fn, planned, [s.batch for s in planned], cfg, out,
                             data.vocab_size, len(data.languages), dist, echo=echo)
    data.set_batch_sizes(sizes)


def _warm_up(step_fn: TrainStep, data: TrainData, cfg: Config, dist: DistInfo,
             graphs: bool) -> None:
    """Every bucket shape before step 1: compile and capture now, with a progress line per
    shape, instead of pausing the run later, and prove on a GPU that each bucket's worst case
    fits (``train.warmup``). Under DDP the ranks warm up without DDP's gradient hooks, like
    the auto budget's probe: a rank that runs out of memory must not leave the others
    waiting in an all-reduce; every rank then stops with its error (``agree``)."""
    from myxtts.train.graphs import CudaCapture
    from myxtts.train.warmup import warm_up

    shapes = sorted(set(bucket_shapes(data.sampler, cfg)), key=lambda s: s.frames)
    echo = log.info if dist.rank == 0 else (lambda _: None)
    runner, step_fn.runner = step_fn.runner, step_fn.model
    report, failure = None, None
    try:
        report = warm_up(step_fn, shapes, data.vocab_size, len(data.languages),
                         capture=CudaCapture(step_fn.device) if graphs else None, echo=echo)
    except TrainError as e:
        failure = e
    finally:
        step_fn.runner = runner
    agree(dist, failure)
    assert report is not None
    echo(f"warm-up: {len(shapes)} bucket shapes in {report.seconds:.1f} s "
         f"({report.graphs_compiled} graphs compiled, {report.shapes_captured} shapes captured "
         f"as CUDA graphs); {step_fn.mode} step")
