"""`myxtts evaluate` and the evaluation kept in training, on the package's micro run (which
evaluates 2 validation utterances at its last step, ``train.eval_every``)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

from myxtts.artifacts.bundle import export, read_bundle
from myxtts.artifacts.evaluation import read_evaluation
from myxtts.artifacts.trained import load_trained
from myxtts.cli.main import main
from myxtts.config import config_from_dict
from myxtts.inference.evaluation import pick_cases
from myxtts.metrics import EvaluationError, missing

pytestmark = pytest.mark.usefixtures("one_thread")
CHEAP = ("mcd_db", "f0_rmse_cents", "voicing_error", "duration_ratio")


@pytest.fixture(scope="module")
def dataset(micro_store):
    return micro_store.parent / "data"


@pytest.fixture(scope="module")
def cfg(run):
    return config_from_dict(load_trained(run).config)


def test_training_keeps_its_last_evaluation_and_logs_it(run):
    record = read_evaluation(run)
    assert record["step"] == 4 and record["utterances"] == 2
    assert record["against"] == "the vocoded truth" and record["vocoder"] == "griffin-lim"
    metrics = record["metrics"]
    assert {"mcd_db", "voicing_error", "duration_ratio"} <= set(metrics) <= set(CHEAP) | {"similarity"}
    assert metrics["mcd_db"] > 0  # 4 steps of training are far from the truth
    logged = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    evaluated = [row for row in logged if "eval/mcd_db" in row]
    assert [row["step"] for row in evaluated] == [4]
    assert {k: evaluated[-1][f"eval/{k}"] for k in metrics} == pytest.approx(metrics)


def test_evaluating_in_training_does_not_change_what_trains(micro_store, tmp_path):
    """3 steps with an evaluation after steps 2 and 3 end with the weights of 3 steps without,
    bit for bit: evaluation draws on a forked RNG and leaves the data order alone."""
    from myxtts.artifacts import checkpoint as ck
    from myxtts.train.loop import train
    from tests.helpers import micro_config

    states = []
    for name, extra in (("plain", []), ("evaluated", ["train.eval_every=2",
                                                      "train.eval_utterances=1"])):
        train(micro_config(tmp_path / name, "train.max_steps=3", "model.max_decoder_frames=24",
                           *extra), micro_store, progress=False)
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


def test_export_carries_the_last_evaluation(run, tmp_path):
    done = export(run, tmp_path / "model.safetensors")
    assert done.evaluation == read_evaluation(run)
    assert read_bundle(done.path).evaluation == read_evaluation(run)
    assert load_trained(done.path).evaluation == load_trained(run).evaluation == done.evaluation


def test_cases_clone_another_clip_of_the_speaker_the_same_from_a_store_or_its_dataset(
        run, cfg, dataset, audio_store):
    """A store prepared with --audio gives the dataset's validation utterances, their
    reference clips and their audio (to int16 rounding)."""
    languages = ["en"]
    from_data, notes = pick_cases(dataset, cfg, "val", languages, 20, seed=0)
    from_store, _ = pick_cases(audio_store, cfg, "val", languages, 20, seed=0)
    assert not notes and len(from_data) == 2  # the micro data's 2 validation utterances
    assert [(c.id, c.speaker, c.reference_id) for c in from_data] == \
        [(c.id, c.speaker, c.reference_id) for c in from_store]
    for case, same in zip(from_data, from_store):
        assert case.reference_id != case.id and case.reference_id.split("_")[0] == case.speaker
        np.testing.assert_allclose(case.load_truth(), same.load_truth(), atol=1.5 / 32767)
    everything, _ = pick_cases(dataset, cfg, "all", languages, 5, seed=0)
    assert len(everything) == 5
    assert pick_cases(dataset, cfg, "all", languages, 5, seed=0)[0][0].id == everything[0].id


def test_a_store_without_audio_or_a_language_the_model_lacks_is_said_in_one_line(
        cfg, micro_store, dataset):
    with pytest.raises(EvaluationError, match="has no audio .* pass the dataset it was prepared"):
        pick_cases(micro_store, cfg, "val", ["en"], 20, seed=0)
    with pytest.raises(EvaluationError, match="2 utterances in en left out: the model speaks fa"):
        pick_cases(dataset, cfg, "val", ["fa"], 20, seed=0)


def test_evaluate_a_bundle_beside_the_ground_truth(run, dataset, tmp_path, capsys):
    """One utterance through the CLI: the table, the JSON and CSV, the kept audio, the run's
    last evaluation from the bundle; the truth row scores the ceiling against itself."""
    if missing("pocketsphinx", "resemblyzer", "speechmos", "onnxruntime", "librosa"):
        pytest.skip('the eval extra is not installed (pip install "myxtts[eval]")')
    bundle = export(run, tmp_path / "model.safetensors").path
    out = tmp_path / "eval"
    rc = main(["evaluate", str(bundle), str(dataset), "--max", "1", "--out", str(out),
               "--keep-audio", "--device", "cpu"])
    printed = capsys.readouterr().out
    assert rc == 0
    assert "en (1 utterance)" in printed and "truth, vocoded" in printed
    assert "last evaluation in training (step 4, 2 utterances" in printed
    summary = json.loads((out / "evaluation.json").read_text())["summary"]["en"]
    truth, vocoded, model = summary["truth"], summary["truth, vocoded"], summary["model"]
    assert truth["mcd_db"] == 0 and truth["voicing_error"] == 0 and truth["duration_ratio"] == 1
    assert truth["rtf"] is None and model["rtf"] > 0
    assert 0 < truth["similarity"] <= 1 and 1 <= truth["ovrl"] <= 5
    assert 0 < vocoded["mcd_db"] < model["mcd_db"]  # Griffin-Lim loses less than 4 steps of training
    assert model["cer"] is not None  # the micro data's language is "en": pocketsphinx listens
    rows = list(csv.DictReader((out / "utterances.csv").open()))
    assert [r["row"] for r in rows] == ["model", "truth, vocoded", "truth"]
    assert len({r["id"] for r in rows}) == 1 and rows[0]["reference_id"] != rows[0]["id"]
    kept = sorted(p.name for p in (out / "audio").iterdir())
    assert kept == [f"{rows[0]['id']}.model.wav", f"{rows[0]['id']}.vocoded.wav"]


def test_data_that_cannot_be_evaluated_is_one_line(run, micro_store, tmp_path, capsys):
    for data, says in ((tmp_path, "no recognised dataset metadata"),
                       (micro_store, "has no audio (prepared without --audio)")):
        assert main(["evaluate", str(run), str(data), "--asr", "none"]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1 and err.startswith("myxtts evaluate: error:")
