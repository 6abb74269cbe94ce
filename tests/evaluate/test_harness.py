"""`myxtts evaluate` on the suite's evaluated micro run: the utterances it picks, the table,
JSON and CSV it writes, and data it cannot evaluate said in one line."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from myxtts.artifacts.bundle import export
from myxtts.artifacts.trained import load_trained
from myxtts.cli.main import main
from myxtts.config import config_from_dict
from myxtts.evaluate.harness import pick_cases
from myxtts.evaluate.record import read_evaluation
from myxtts.metrics import EvaluationError, missing

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def dataset(micro_store):
    return micro_store.parent / "data"


@pytest.fixture(scope="module")
def cfg(evaluated_run):
    return config_from_dict(load_trained(evaluated_run).config)


@pytest.mark.slow
def test_cases_clone_another_clip_of_the_speaker_the_same_from_a_store_or_its_dataset(
        evaluated_run, cfg, dataset, audio_store):
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


@pytest.mark.slow
def test_evaluate_a_bundle_beside_the_ground_truth(evaluated_run, dataset, tmp_path, capsys):
    """One utterance through the CLI: the table, the JSON and CSV, the kept audio, the run's
    last evaluation from the bundle; the truth row scores the ceiling against itself."""
    if missing("pocketsphinx", "resemblyzer", "speechmos", "onnxruntime", "librosa"):
        pytest.skip('the eval extra is not installed (pip install "myxtts[eval]")')
    bundle = export(evaluated_run, tmp_path / "model.safetensors", evaluation=read_evaluation(evaluated_run)).path
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


def test_data_that_cannot_be_evaluated_is_one_line(evaluated_run, micro_store, tmp_path, capsys):
    for data, says in ((tmp_path, "no recognised dataset metadata"),
                       (micro_store, "has no audio (prepared without --audio)")):
        assert main(["evaluate", str(evaluated_run), str(data), "--asr", "none"]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1 and err.startswith("myxtts evaluate: error:")
