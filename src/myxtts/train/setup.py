"""Everything a run needs before its first step, built the one way training builds it.

``myxtts train``, ``myxtts profile`` and every benchmark call :func:`build_setup`, so what
they measure is what a user runs: the memory caps, the data (``train.data``), the model
(fine-tuned from another run's, ``train.finetune``), the engine (``train.engine``: optimizer,
schedule, scaler, moving average, compile, CUDA graphs) restored from the checkpoint with
its random streams, then started up for the data's bucket shapes (auto batch sizes, warm-up,
capture); the train loader is built once, for the batch plan with the sizes the engine
chose, and the data position restored on it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.config import Config, ConfigError, config_from_dict, resolve_device
from myxtts.model.xtts import build_model
from myxtts.train import finetune
from myxtts.train.data import TrainData, TrainSource, bucket_shapes, is_store, open_data
from myxtts.train.distributed import DistInfo, agree, init_distributed
from myxtts.train.engine import TrainEngine, Workload
from myxtts.train.errors import TrainError
from myxtts.train.memory import apply_caps, check_feature_memory, resolve_caps
from myxtts.train.run import seed_everything

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
    engine: TrainEngine
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


def build_setup(cfg: Config, data_path: str | Path, resume_path: Path | None,
                init_from: str | Path | None = None, compile_model: bool | None = None
                ) -> TrainSetup:
    """Data, model and engine from ``cfg`` (and the checkpoint at ``resume_path``, or the
    trained model ``init_from`` fine-tunes), the engine started up for the data's bucket shapes
    and the loader at the batch sizes it chose. ``compile_model`` overrides what
    ``train.compile`` resolves to (benchmarks time both)."""
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
    source, failure = None, None
    try:
        source = open_data(cfg, data_path, device, dist, state, base)
    except (TrainError, ConfigError, OSError, ValueError) as e:  # e.g. a store missing on a node
        failure = e
    agree(dist, failure)
    assert source is not None
    if state is not None:
        source.check_vocabulary(state)
    if base is not None:
        finetune.check_freeze(cfg.train.freeze, base, source.tokenizer)
    model = build_model(cfg, source.vocab_size, len(source.languages), source.mel_mean,
                        source.mel_std)
    if base is not None:
        finetune.load_base_weights(model, base, source.tokenizer)
        if dist.rank == 0:
            log.info("%s", finetune.describe(base_file, base, source.tokenizer))
    engine = TrainEngine(cfg, model.to(device), device, dist, compile_model)
    if state is not None:
        engine.load_state_dict(state)  # (this rank's random streams too)
    sizes = engine.start_up(workload(source, cfg, engine))
    data = None
    try:  # the train loader, built once: for the plan at the sizes the engine fitted
        data = source.train_data(source.plan.with_batch_sizes(sizes))
    except (TrainError, ConfigError, OSError, ValueError) as e:  # e.g. /dev/shm on one node
        failure = e
    agree(dist, failure)
    assert data is not None
    data.continue_from(state, record)
    if on_the_fly:
        check_feature_memory(data.loader.feature_work(), caps)
    return TrainSetup(cfg, dist, device, data, engine, record)


def workload(data: TrainSource, cfg: Config, engine: TrainEngine) -> Workload:
    """What the engine starts up for: the train buckets' shapes at their planned sizes, the
    largest validation batch, and the data role's largest feature batch when it runs on the
    training GPU (both need room beside CUDA graphs)."""
    val = None if data.val_sampler is None else max(
        bucket_shapes(data.val_sampler, cfg), key=lambda s: s.batch * s.frames)
    work = data.feature_work(data.plan)
    role = work.run if work is not None and work.device == engine.device else None
    return Workload(data.plan.batch_shapes(cfg.data.ref_frames, cfg.audio.n_mels),
                    data.vocab_size, len(data.languages), val, role, Path(cfg.train.output_dir))


def configure_device(device: torch.device) -> None:
    """On a GPU: make it the current device (events, streams and syncs default to the
    training GPU) and allow TF32 matmuls and convolutions."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
