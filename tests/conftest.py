"""Shared fixtures: small generated datasets and stores, and a fast model config for trainer tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from myxtts.config import Config, load_config

REPO = Path(__file__).resolve().parents[1]

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
        "train.synth_every=0", *overrides,
    ])


@pytest.fixture
def one_thread():
    """Tiny tensors: one intra-op thread is fastest, and immune to a busy machine (with 2
    threads on a loaded 2-core box, OpenMP waits made tiny-model tests 15x slower)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def micro_store(tmp_path_factory) -> Path:
    """A prepared store of 2 demo speakers x 16 short utterances (seconds to build)."""
    from myxtts.data.demo import make_demo_data
    from myxtts.data.prepare import prepare_store

    root = tmp_path_factory.mktemp("micro")
    data = make_demo_data(root / "data", speakers=2, utterances=16, seed=3)
    cfg = micro_config(root / "unused")
    prepare_store(data, root / "store", cfg, workers=1, progress=False, echo=lambda *a: None)
    return root / "store"
