"""The inference tests' trained run: one micro model, trained once for the whole package."""

from __future__ import annotations

from pathlib import Path

import pytest

from myxtts.train.loop import train
from tests.helpers import micro_config


@pytest.fixture(scope="package")
def run(micro_store, tmp_path_factory) -> Path:
    """A run folder of 4 micro steps on ``micro_store`` (checkpoints at step 4 and best.pt,
    and the evaluation of 2 validation utterances at step 4 in evaluation.json); the decoder
    never learns to stop, so every utterance decodes to ``max_decoder_frames`` (48) unless a
    test lowers it."""
    out = tmp_path_factory.mktemp("inference") / "run"
    train(micro_config(out, "train.max_steps=4", "model.max_decoder_frames=48",
                       "train.eval_every=4", "train.eval_utterances=2"), micro_store,
          progress=False)
    return out
