"""What several test modules share: paths and the fast model config for trainer tests."""

from __future__ import annotations

import os
from pathlib import Path

from myxtts.config import Config, load_config

REPO = Path(__file__).resolve().parents[1]


def beside_repo(*parts: str) -> Path:
    """``../shared/PARTS`` next to the checkout, or next to a folder above it (a worktree
    kept deeper, such as ``/work/wt/NAME``); the nearest that exists, else ``../shared``."""
    for folder in REPO.parents:
        if (found := folder.joinpath("shared", *parts)).exists():
            return found
    return REPO.parent.joinpath("shared", *parts)


# Real speech next to the repository (../shared/data/ljspeech-mini); tests that need it
# skip cleanly where it is absent.
LJSPEECH_MINI = Path(os.environ.get("MYXTTS_LJSPEECH_MINI",
                                    beside_repo("data", "ljspeech-mini")))

# A model much smaller than the tiny preset: trainer mechanics, not quality, are under test.
MICRO_MODEL = [
    "model.d_model=32", "model.n_heads=2", "model.text_layers=1", "model.decoder_layers=1",
    "model.cond_layers=1", "model.cond_latents=4", "model.prenet_dim=32",
    "model.postnet_channels=32", "model.postnet_layers=2",
]


def micro_config(output_dir: Path, *overrides: str) -> Config:
    return load_config(overrides=[
        *MICRO_MODEL, f"train.output_dir={output_dir}", "train.tensorboard=false",
        "data.batch_frames=1200", "data.num_buckets=4", "data.num_workers=0",
        "train.warmup_steps=2", "train.log_every=2", "train.val_every=4", "train.ckpt_every=4",
        "train.synth_every=0", "train.device=cpu", *overrides,
    ])


def train_crashing_at(cfg: Config, data: Path, call: int) -> None:
    """``train(cfg, data)`` with its ``call``-th training step raising "simulated crash" (the
    checkpoints before it stay, as after a killed run); the error propagates."""
    from unittest import mock

    from myxtts.train.engine import TrainEngine
    from myxtts.train.tts import train

    real, calls = TrainEngine.step, []

    def crashing(self, batches):
        calls.append(1)
        if len(calls) == call:
            raise RuntimeError("simulated crash")
        return real(self, batches)

    with mock.patch.object(TrainEngine, "step", crashing):
        train(cfg, data, progress=False)


def full_disk_for_checkpoints(monkeypatch, suffix: str = ".pt") -> object:
    """Every checkpoint file (``*.pt``; or whatever ends in ``suffix``, e.g. ``best.pt``)
    written from now on fails as on a full disk (ENOSPC); other files are written. Returns
    the real writer, to put back."""
    import errno

    from myxtts.artifacts import checkpoint as ck

    real = ck.atomic_write

    def full(path, data, *a, **k):
        if str(path).endswith(suffix):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, data, *a, **k)

    monkeypatch.setattr(ck, "atomic_write", full)
    return real
