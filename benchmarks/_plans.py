"""The batches every loader of ``data_pipeline.py`` is timed on, made once by our own
samplers so a peer batches exactly the utterances ours does: the on-the-fly loader's train
clips and plan (``raw_train``), the store's (``store_plan``), and a short digest that
proves two processes were given the same plan."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def otf_config():
    """The on-the-fly runs' config: features on the CPU, like the per-item peers'."""
    from myxtts.config import load_config  # deferred: benchmarks parse arguments first

    return load_config(overrides=["data.data_device=cpu"])


def raw_train(data: Path, cfg) -> tuple:
    """The on-the-fly loader's train split, its bucket sampler (as ``build_onthefly_loader``
    builds it) and the clips' source durations; ``plan``: the first epochs' batches."""
    import numpy as np  # deferred: benchmarks parse arguments first

    from myxtts.audio.io import audio_info
    from myxtts.data.feed.loader import build_sampler
    from myxtts.data.feed.onthefly import read_raw_splits

    splits = read_raw_splits(data, cfg)
    raw = splits[0]["train"]
    sampler = build_sampler(raw.est_frames, np.array([len(t) for t in raw.tokens], np.int64), cfg,
                            seed=cfg.data.shuffle_seed)
    durations = np.array([audio_info(p).duration_s for p in raw.paths])
    plan = [sampler.batches(e) for e in range(3)]
    return splits, raw, sampler, durations, plan


def store_plan(store: Path, cfg, epochs: int = 3) -> tuple:
    """The store's train split, its sampler as ``build_loader`` builds it and the first
    ``epochs`` epochs' batches."""
    import numpy as np  # deferred: benchmarks parse arguments first

    from myxtts.data.feed.loader import build_sampler
    from myxtts.data.store import FeatureStore

    train = FeatureStore.open(store, "train", cfg)
    sampler = build_sampler(train.mel_lengths, train.token_lengths, cfg,
                            seed=cfg.data.shuffle_seed)
    return train, sampler, [sampler.batches(e) for e in range(epochs)], np.asarray(train.mel_lengths)


def digest(plan: list) -> str:
    """12 hex digits of a plan's batches."""
    return hashlib.sha1(json.dumps(plan).encode()).hexdigest()[:12]
