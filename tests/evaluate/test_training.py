"""The evaluation in training (``train.eval_every``): what it logs and keeps in the run,
that it changes nothing of what trains, the bundle that carries it, and the loop's refusal
to run without it."""

from __future__ import annotations

import json

import pytest
import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.artifacts.bundle import export, read_bundle
from myxtts.artifacts.trained import load_trained
from myxtts.cli.main import main
from myxtts.evaluate.harness import training_record
from myxtts.evaluate.record import read_evaluation
from myxtts.evaluate.training import TrainingEvaluation
from myxtts.train.errors import TrainError
from myxtts.train.tts import train
from tests.helpers import micro_config

pytestmark = pytest.mark.usefixtures("one_thread")
CHEAP = ("mcd_db", "f0_rmse_cents", "voicing_error", "duration_ratio")


def test_training_keeps_its_last_evaluation_and_logs_it(evaluated_run):
    record = read_evaluation(evaluated_run)
    assert record["step"] == 4 and record["utterances"] == 2
    assert record["against"] == "the vocoded truth" and record["vocoder"] == "griffin-lim"
    metrics = record["metrics"]
    assert {"mcd_db", "voicing_error", "duration_ratio"} <= set(metrics) <= set(CHEAP) | {"similarity"}
    assert metrics["mcd_db"] > 0  # 4 steps of training are far from the truth
    logged = [json.loads(line) for line in (evaluated_run / "metrics.jsonl").open()]
    evaluated = [row for row in logged if "eval/mcd_db" in row]
    assert [row["step"] for row in evaluated] == [4]
    assert {k: evaluated[-1][f"eval/{k}"] for k in metrics} == pytest.approx(metrics)


@pytest.mark.slow
def test_evaluating_in_training_does_not_change_what_trains(micro_store, tmp_path):
    """3 steps with an evaluation after steps 2 and 3 end with the weights of 3 steps without,
    bit for bit: evaluation draws on a forked RNG and leaves the data order alone."""
    states = []
    for name, extra in (("plain", []), ("evaluated", ["train.eval_every=2",
                                                      "train.eval_utterances=1"])):
        train(micro_config(tmp_path / name, "train.max_steps=3", "model.max_decoder_frames=24",
                           *extra), micro_store, progress=False, evaluation=TrainingEvaluation)
        states.append(ck.load(tmp_path / name / "checkpoints" / "ckpt_00000003.pt"))
    assert (tmp_path / "evaluated" / "evaluation.json").is_file()
    assert _same(states[0][ck.MODEL], states[1][ck.MODEL])
    assert _same(states[0][ck.EMA], states[1][ck.EMA])


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


def test_export_carries_the_last_evaluation(evaluated_run, tmp_path):
    """`myxtts export` reads the run's evaluation.json into the bundle, from which `myxtts
    evaluate` reads it as it reads a run folder's own; ``export`` carries what it is given."""
    record = read_evaluation(evaluated_run)
    assert record is not None
    bundle = tmp_path / "model.safetensors"
    assert main(["export", str(evaluated_run), "-o", str(bundle)]) == 0
    assert read_bundle(bundle).evaluation == record
    assert training_record(load_trained(bundle)) == training_record(load_trained(evaluated_run)) == record
    bare = export(evaluated_run, tmp_path / "bare.safetensors")
    assert bare.evaluation is None and read_bundle(bare.path).evaluation is None
    assert training_record(load_trained(bare.path)) is None


def test_eval_every_without_an_evaluation_is_refused_before_any_work(micro_store, tmp_path):
    """The loop sits below ``myxtts.evaluate`` and is handed the evaluation; a caller that
    sets ``train.eval_every`` and hands none is told so, not trained unscored."""
    out = tmp_path / "run"
    with pytest.raises(TrainError, match="train.eval_every=2 but no evaluation was given"):
        train(micro_config(out, "train.max_steps=2", "train.eval_every=2"), micro_store,
              progress=False)
    assert not out.exists()
