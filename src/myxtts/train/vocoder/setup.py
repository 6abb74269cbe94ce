"""Everything a vocoder run needs before its first step.

``build_vocoder_setup`` finds the store (preparing one with audio from a raw dataset),
takes the store's audio section (the vocoder learns the store's mel definition), builds
generator, discriminators and the step for the checkpoint it is given (the architecture
from the checkpoint, how the run goes from the command line); the recipe restores its state
(``train.vocoder.recipe.VocoderRecipe.restore``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.config import Config, config_from_dict, resolve_device
from myxtts.data.prepare.build import prepare_store
from myxtts.data.store import FeatureStore, StoreError, read_manifest
from myxtts.data.store.format import store_state
from myxtts.model.vocoder.discriminators import Discriminators
from myxtts.model.vocoder.generator import VocosGenerator
from myxtts.train.errors import TrainError
from myxtts.train.run import seed_everything
from myxtts.train.vocoder.engine import VocoderEngine

log = logging.getLogger(__name__)
ARCHITECTURE_KEYS = ("preset", "dim", "ff_mult", "layers", "kernel", "disc_channels", "periods")


def find_store(cfg: Config, data: str | Path, progress: bool) -> Path:
    """``data`` if it is a store; a raw dataset is prepared (with audio) into RUN/store."""
    data = Path(data)
    if store_state(data) in ("complete", "partial"):  # a partial one: read_manifest explains
        return data
    if not data.exists():
        raise StoreError(f"{data} does not exist; pass a store from `myxtts prepare --audio` "
                         f"or a dataset folder")
    store = Path(cfg.train.output_dir) / "store"
    log.info("%s is a raw dataset: preparing a store with audio in %s", data, store)
    prep = config_from_dict({**cfg.to_dict(), "data": {**cfg.to_dict()["data"], "store_audio": True}})
    prepare_store(data, store, prep, progress=progress, echo=log.info)
    return store


@dataclass
class VocoderSetup:
    """A vocoder run ready for step 1 (``cfg``: with the store's audio section and, on
    resume, the checkpoint's architecture)."""

    cfg: Config
    device: torch.device
    engine: VocoderEngine
    train: FeatureStore
    val: FeatureStore


def build_vocoder_setup(cfg: Config, data: str | Path, saved: dict[str, Any] | None,
                        progress: bool) -> VocoderSetup:
    """Store and engine (generator, discriminators, optimizers) from ``cfg``, on one device
    in one process; ``saved``: the checkpoint to resume, whose architecture the run takes
    (its state is restored by the recipe: ``VocoderRecipe.restore``)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise TrainError("train-vocoder runs in one process on one device; start it without "
                         "torchrun (a small GAN vocoder does not need several GPUs)")
    store = find_store(cfg, data, progress)
    manifest = read_manifest(store)
    if cfg.audio != config_from_dict({"audio": manifest["audio"]}).audio:
        log.info("using the store's audio section (the vocoder learns the store's mel definition)")
    wanted = cfg.to_dict()
    if saved is not None:
        # The architecture comes from the checkpoint (the weights need it); how the run goes
        # (steps, device, intervals, losses, lr, fine-tuning source) from this command
        # line, so e.g. --tts-checkpoint can start fine-tuning from a trained vocoder.
        arch = {k: saved[ck.CONFIG]["vocoder"][k] for k in ARCHITECTURE_KEYS}
        wanted["vocoder"] = {**wanted["vocoder"], **arch}
    cfg = config_from_dict({**wanted, "audio": manifest["audio"]})
    device = resolve_device(cfg.train.device, "train.device")
    if device.type == "cuda":  # events and streams default to the current GPU (cuda:0 else)
        torch.cuda.set_device(device)
    train_store = FeatureStore.open(store, "train")
    train_store.require_audio()
    val_store = FeatureStore.open(store, "val")
    if len(val_store) == 0:
        val_store = train_store
    seed_everything(cfg.train.seed)
    mean = torch.as_tensor(train_store.mel_mean)
    std = torch.as_tensor(train_store.mel_std)
    gen = VocosGenerator(cfg.audio, cfg.vocoder, mean, std).to(device)
    disc = Discriminators(cfg.audio, cfg.vocoder).to(device)
    engine = VocoderEngine(gen, disc, cfg, device)
    return VocoderSetup(cfg, device, engine, train_store, val_store)
