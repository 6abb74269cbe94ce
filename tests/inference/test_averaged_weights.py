"""A checkpoint with a moving average of the weights speaks with the average; with
``raw_weights`` (``synthesize --raw-weights``) with the trained weights."""

from __future__ import annotations

import pytest
import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.artifacts.averaged import UPDATES, WEIGHTS
from myxtts.artifacts.runs import resolve_checkpoint
from myxtts.cli.main import main
from myxtts.inference.synthesizer import Synthesizer


@pytest.fixture(scope="module")
def averaged(run, tmp_path_factory):
    """The run's checkpoint with an average that differs from its weights."""
    state = ck.load(resolve_checkpoint(run))
    gen = torch.Generator().manual_seed(0)
    weights = {k: v + 0.05 * torch.randn(v.shape, generator=gen)
               for k, v in state[ck.MODEL].items() if v.is_floating_point() and "mel_" not in k}
    state[ck.EMA] = {WEIGHTS: weights, UPDATES: torch.tensor(4.0)}
    path = tmp_path_factory.mktemp("ema") / "averaged.pt"
    ck.save(path, {k: v for k, v in state.items() if k != ck.FORMAT})
    return path, weights


def test_the_average_is_spoken_unless_raw_weights(run, averaged):
    path, weights = averaged
    saved = ck.load(resolve_checkpoint(run))
    assert ck.EMA in saved  # the default run keeps an average, and speaks with it
    default = Synthesizer.from_checkpoint(run, device="cpu").model.state_dict()
    for k, v in saved[ck.EMA]["weights"].items():
        assert torch.equal(default[k], v), k
    ema = Synthesizer.from_checkpoint(path, device="cpu").model.state_dict()
    raw = Synthesizer.from_checkpoint(path, device="cpu", raw_weights=True).model.state_dict()
    for k, v in saved[ck.MODEL].items():
        assert torch.equal(raw[k], v)
        assert torch.equal(ema[k], weights[k] if k in weights else v), k


def test_synthesize_raw_weights_flag(run, averaged, micro_store, tmp_path):
    path, _ = averaged
    ref = sorted((micro_store.parent / "data" / "wavs").glob("*.wav"))[0]
    base = ["synthesize", "-r", str(ref), "--device", "cpu", "-t", "lamo tesi."]
    outs = {}
    for name, extra in (("run_raw", ["-c", str(run), "--raw-weights"]),
                        ("raw", ["-c", str(path), "--raw-weights"]), ("ema", ["-c", str(path)])):
        outs[name] = tmp_path / f"{name}.wav"
        assert main(base + extra + ["-o", str(outs[name])]) == 0
    assert outs["raw"].read_bytes() == outs["run_raw"].read_bytes()  # the same trained weights
    assert outs["ema"].read_bytes() != outs["raw"].read_bytes()
