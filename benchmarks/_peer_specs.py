"""What ``_peers.py`` is given (``data_pipeline.py --part coqui_spec|lhotse_spec``): the
clips or features, texts and token ids, and the batches of every epoch, from our own
sampler, so a peer batches exactly the utterances ours does. Written as JSON (and the
store's mels as one .npy) by this interpreter, which has myxtts; read by the peers', which
has not."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from _plans import digest, otf_config, raw_train, store_plan

PLAN_EPOCHS = 40  # epochs of batches a peer is given (cycled if a run outlasts them)


def audio_settings(cfg) -> dict:
    a = cfg.audio
    return {"sample_rate": a.sample_rate, "n_fft": a.n_fft, "hop_length": a.hop_length,
            "win_length": a.win_length, "n_mels": a.n_mels, "fmin": a.fmin, "fmax": a.fmax}


def texts_of(data: Path, cfg, ids: list[str]) -> list[str]:
    from myxtts.data.prepare.readers import read_dataset

    text = {u.id: u.text for u in read_dataset(data, cfg).all}
    return [text[i] for i in ids]


def part_coqui_spec(args: argparse.Namespace) -> dict:
    """The on-the-fly loader's train clips and batches (``_plans.raw_train``)."""
    cfg = otf_config()
    _, raw, sampler, durations, plan = raw_train(args.data, cfg)
    spec = {"peer": "coqui", "audio": audio_settings(cfg), "paths": [str(p) for p in raw.paths],
            "texts": texts_of(args.data, cfg, raw.ids), "durations": durations.tolist(),
            "plan": [sampler.batches(e) for e in range(PLAN_EPOCHS)], "digest": digest(plan)}
    args.out.write_text(json.dumps(spec))
    return {"spec": str(args.out), "digest": spec["digest"]}


def part_lhotse_spec(args: argparse.Namespace) -> dict:
    """The store's train mels (float32, one .npy, with offsets), token ids and batches."""
    import numpy as np

    from myxtts.config import Config

    cfg = Config()
    train, sampler, plan, frames = store_plan(args.store, cfg)
    mels = np.concatenate([np.asarray(train.mel(i), np.float32) for i in range(len(train))])
    np.save(args.out.with_suffix(".npy"), mels)
    offsets = np.concatenate([[0], np.cumsum(frames)]).tolist()
    spec = {"peer": "lhotse", "storage": args.storage, "audio": audio_settings(cfg),
            "mels": str(args.out.with_suffix(".npy")), "offsets": offsets,
            "texts": [f"utterance {i}" for i in range(len(train))],
            "tokens": [np.asarray(train.tokens(i), np.int64).tolist() for i in range(len(train))],
            "durations": (frames / cfg.audio.frames_per_second).tolist(),
            "plan": [sampler.batches(e) for e in range(PLAN_EPOCHS)], "digest": digest(plan)}
    args.out.write_text(json.dumps(spec))
    return {"spec": str(args.out), "digest": spec["digest"]}
