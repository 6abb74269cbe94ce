"""The evaluation in an XTTS-v2 fine-tuning run (``train.eval_every``): what it logs and keeps
in the run, that it changes nothing of what trains, and the refusal to run without it.

The reduced model's random GPT never says its stop code, so each clip lasts its cap; the
HiFi-GAN decoder (full size) costs about 0.6 s per second of audio on one CPU thread, so
here an utterance is cut at its true length (``CAP``) instead of ``myxtts evaluate``'s
three times that."""

from __future__ import annotations

import json
import math

import pytest
import torch

import myxtts.evaluate.xtts_training as xtts_training
from myxtts.artifacts import checkpoint as ck
from myxtts.data.xtts_store import XttsStore
from myxtts.evaluate.record import read_evaluation
from myxtts.evaluate.xtts_training import XttsTrainingEvaluation
from myxtts.train.errors import TrainError
from myxtts.train.xtts.recipe import train_xtts
from tests.xtts_v2.test_finetune import _config, _newest, store  # noqa: F401 (a fixture)

pytestmark = pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")
CHEAP = ("mcd_db", "f0_rmse_cents", "voicing_error", "duration_ratio")
EVALUATED = ("train.eval_every=2", "train.eval_utterances=1")

CAPPED: list[int] = []  # the true lengths in codes the evaluation capped


def CAP(codes: int) -> int:
    CAPPED.append(codes)
    return codes + 1


@pytest.fixture(scope="module")
def evaluated_run(store, reduced_folder, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("xtts_evaluated") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(xtts_training, "length_cap", CAP)
        train_xtts(_config(out, *EVALUATED), store, init_from=reduced_folder, progress=False,
                   evaluation=XttsTrainingEvaluation)
    return out


@pytest.mark.slow
def test_fine_tuning_keeps_its_last_evaluation_and_logs_it(evaluated_run, store):  # noqa: F811
    record = read_evaluation(evaluated_run)
    assert record["step"] == 4 and record["utterances"] == 1
    assert record["against"] == "the true recording"
    metrics = record["metrics"]
    assert {"mcd_db", "voicing_error", "duration_ratio"} <= set(metrics) <= set(CHEAP) | {"similarity"}
    assert all(math.isfinite(v) for v in metrics.values())
    assert metrics["mcd_db"] > 0  # a model of random weights is far from the truth
    assert metrics["duration_ratio"] > 0
    logged = [json.loads(line) for line in (evaluated_run / "metrics.jsonl").open()]
    evaluated = [row for row in logged if "eval/mcd_db" in row]
    assert [row["step"] for row in evaluated] == [2, 4]
    assert {k: evaluated[-1][f"eval/{k}"] for k in metrics} == pytest.approx(metrics)
    first = XttsStore.open(store, "val").audio_lengths[0]
    assert CAPPED == [int(first / 1024)]  # the first validation clip, capped by its length


@pytest.mark.slow
def test_evaluating_does_not_change_what_trains(evaluated_run, store, reduced_folder,  # noqa: F811
                                                tmp_path):
    """4 steps with evaluations after steps 2 and 4 end with the weights (and their average,
    where kept) of 4 steps without, bit for bit: the evaluation runs on a forked RNG in eval
    mode and puts train mode back."""
    plain = tmp_path / "plain"
    train_xtts(_config(plain), store, init_from=reduced_folder, progress=False)
    a, b = _newest(plain), _newest(evaluated_run)
    assert a[ck.PROGRESS]["step"] == b[ck.PROGRESS]["step"] == 4
    for key in (ck.MODEL, ck.EMA):
        if a.get(key) is None:
            assert b.get(key) is None
            continue
        assert a[key].keys() == b[key].keys()
        for name, weight in a[key].items():
            assert torch.equal(weight, b[key][name]), (key, name)


def test_eval_every_without_an_evaluation_is_refused_before_any_work(store, reduced_folder,  # noqa: F811
                                                                     tmp_path):
    out = tmp_path / "run"
    with pytest.raises(TrainError, match="train.eval_every=2 but no evaluation was given"):
        train_xtts(_config(out, *EVALUATED), store, init_from=reduced_folder, progress=False)
    assert not out.exists()


@pytest.mark.slow
def test_the_last_evaluation_travels_with_the_run_and_its_bundle(evaluated_run, tmp_path):
    """`myxtts evaluate` of the run, or of the bundle `myxtts export` makes of it, reports the
    run's last evaluation in training; a bundle re-exported keeps it; a folder as
    downloaded has none."""
    from myxtts.artifacts.xtts_v2 import read_xtts_v2_bundle
    from myxtts.cli.main import main
    from myxtts.evaluate.xtts_speaking import XttsV2SpeakingModel

    record = read_evaluation(evaluated_run)
    bundle, again = tmp_path / "run.safetensors", tmp_path / "again.safetensors"
    assert main(["export", str(evaluated_run), "-o", str(bundle)]) == 0
    assert read_xtts_v2_bundle(bundle).evaluation == record
    assert main(["export", str(bundle), "-o", str(again)]) == 0
    assert read_xtts_v2_bundle(again).evaluation == record
    assert XttsV2SpeakingModel(evaluated_run, "cpu").training_record == record
    assert XttsV2SpeakingModel(bundle, "cpu").training_record == record
    folder = tmp_path / "coqui"
    assert main(["export", str(evaluated_run), "--format", "xtts", "-o", str(folder)]) == 0
    assert XttsV2SpeakingModel(folder, "cpu").training_record is None
