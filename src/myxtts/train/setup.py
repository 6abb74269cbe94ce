"""The steps of a TTS run's setup (``train.tts.TTSRecipe.setup`` runs them in order, so
``myxtts train``, ``myxtts profile`` and every benchmark set a run up the one way).

:func:`resume_config`: the architecture from the checkpoint resumed; :func:`open_source`:
the device, seeding, memory caps and the data with its bucket plan (``train.data``);
:func:`workload`: what the engine starts up for (auto batch sizes, warm-up, capture);
:func:`train_data`: the train loader, built once for the sizes the engine chose.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from myxtts.config import Config, ConfigError, config_from_dict, resolve_device
from myxtts.train import finetune
from myxtts.train.data import TrainData, TrainSource, bucket_shapes, is_store, open_data
from myxtts.train.distributed import DistInfo, agree
from myxtts.train.engine import TrainEngine, Workload
from myxtts.train.errors import TrainError
from myxtts.train.memory import MemoryCaps, apply_caps, resolve_caps
from myxtts.train.run import seed_everything

log = logging.getLogger(__name__)

# Architecture keys come from the checkpoint on resume (a changed preset cannot load).
_ARCH_SECTIONS = ("audio", "text", "model")


def resume_config(cfg: Config, saved: dict[str, Any]) -> Config:
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


def open_source(cfg: Config, data_path: str | Path, device: torch.device, dist: DistInfo,
                state: dict[str, Any] | None, base: dict[str, Any] | None
                ) -> tuple[TrainSource, MemoryCaps]:
    """The device made current and seeded, the memory caps applied, and the data opened for
    ``cfg`` (its bucket plan made from the lengths, no loader yet): every rank stops alike
    when one cannot open it. ``state``: the checkpoint resumed (its vocabulary must cover
    the data's); ``base``: the model a fine-tuning run starts from."""
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
    return source, caps


def train_data(source: TrainSource, sizes: list[int], dist: DistInfo) -> TrainData:
    """The train loader, built once: for the bucket plan at the sizes the engine fitted
    (every rank stops alike when one cannot build it, e.g. /dev/shm full on one node)."""
    data, failure = None, None
    try:
        data = source.train_data(source.plan.with_batch_sizes(sizes))
    except (TrainError, ConfigError, OSError, ValueError) as e:
        failure = e
    agree(dist, failure)
    assert data is not None
    return data


def workload(data: TrainSource, cfg: Config, engine: TrainEngine) -> Workload:
    """What the engine starts up for: the train buckets' shapes at their planned sizes, the
    worst cases of the engine's task (``engine.TTSTask`` over the data's vocabulary), the
    largest validation batch, and the data role's largest feature batch when it runs on the
    training GPU (both need room beside CUDA graphs)."""
    val = None if data.val_sampler is None else max(
        bucket_shapes(data.val_sampler, cfg), key=lambda s: s.batch * s.frames)
    work = data.feature_work(data.plan)
    role = work.run if work is not None and work.device == engine.device else None
    return Workload(data.plan.batch_shapes(cfg.data.ref_frames, cfg.audio.n_mels),
                    engine.task.worst_case, val, role, Path(cfg.train.output_dir))


def configure_device(device: torch.device) -> None:
    """On a GPU: make it the current device (events, streams and syncs default to the
    training GPU) and allow TF32 matmuls and convolutions."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
