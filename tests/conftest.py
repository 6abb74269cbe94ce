"""Shared fixtures: small generated datasets and stores, and one trained micro run (helpers.py
holds the plain helpers)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.helpers import micro_config

# A test run started in the background of a non-interactive shell (`pytest &`) inherits
# SIGINT ignored, under nohup SIGHUP too, as would every process a test starts, and myxtts
# rightly keeps an ignored signal ignored: the tests of these signals need them live, as in
# a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if getattr(signal, "SIGHUP", None) and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` need CUDA: skipped (with the reason) where there is none."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


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
    from myxtts.data.prepare.build import prepare_store
    from myxtts.synthetic import make_demo_data

    root = tmp_path_factory.mktemp("micro")
    data = make_demo_data(root / "data", speakers=2, utterances=16, seed=3)
    cfg = micro_config(root / "unused")
    prepare_store(data, root / "store", cfg, workers=1, progress=False, echo=lambda *a: None)
    return root / "store"


@pytest.fixture(scope="session")
def audio_store(tmp_path_factory) -> Path:
    """Like ``micro_store`` but with the clips' audio kept (what the vocoder trains on)."""
    from myxtts.data.prepare.build import prepare_store
    from myxtts.synthetic import make_demo_data

    root = tmp_path_factory.mktemp("audio")
    data = make_demo_data(root / "data", speakers=2, utterances=16, seed=3)
    cfg = micro_config(root / "unused", "data.store_audio=true")
    prepare_store(data, root / "store", cfg, workers=1, progress=False, echo=lambda *a: None)
    return root / "store"


@pytest.fixture(scope="session")
def evaluated_run(micro_store, tmp_path_factory) -> Path:
    """A run folder of 4 micro steps on ``micro_store`` (checkpoints at step 4 and best.pt,
    and the evaluation of 2 validation utterances at step 4 in evaluation.json), trained
    once for the inference and the evaluation tests; the decoder never learns to stop, so
    every utterance decodes to ``max_decoder_frames`` (48) unless a test lowers it."""
    from myxtts.evaluate.training import TrainingEvaluation
    from myxtts.train.tts import train

    out = tmp_path_factory.mktemp("evaluated") / "run"
    train(micro_config(out, "train.max_steps=4", "model.max_decoder_frames=48",
                       "train.eval_every=4", "train.eval_utterances=2"), micro_store,
          progress=False, evaluation=TrainingEvaluation)
    return out
