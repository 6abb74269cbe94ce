"""Commands that read a store or a run take its settings: no --set repeated on every command,
a conflicting one refused naming both values, and never a suggestion to --force."""

from __future__ import annotations

import pytest

from myxtts.cli.main import main


@pytest.fixture(scope="module")
def bilingual_store(tmp_path_factory):
    """The demo's two languages, prepared with text.languages=[en,fa] (not the default)."""
    from myxtts.data.prepare.build import prepare_store
    from myxtts.synthetic import make_demo_data
    from tests.helpers import micro_config

    root = tmp_path_factory.mktemp("bilingual")
    data = make_demo_data(root / "data", speakers=3, utterances=6, seed=2, languages=("en", "fa"))
    cfg = micro_config(root / "unused", "text.languages=[en,fa]")
    prepare_store(data, root / "store", cfg, workers=1, progress=False, echo=lambda *a: None)
    return root / "store"


def test_a_store_brings_its_own_text_and_audio_settings(bilingual_store, capsys):
    from myxtts.cli.common import config_from_args
    from myxtts.cli.main import build_parser

    args = build_parser().parse_args(["train", str(bilingual_store)])
    cfg = config_from_args(args, data=args.data)
    assert cfg.text.languages == ["en", "fa"]
    rc = main(["doctor", str(bilingual_store), "--set", "train.compile=off", "--device", "cpu"])
    out = capsys.readouterr().out
    assert rc == 0 and "other features" not in out, out
    rc = main(["train", str(bilingual_store), "--set", "text.languages=[en]", "--max-steps", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and "text.languages: the store" in err and "['en', 'fa']" in err
    assert "--force" not in err and err.count("\n") == 1


@pytest.fixture(scope="module")
def small_run(micro_store, tmp_path_factory):
    """A 2-step run of the micro model with d_model 48 (not the default size)."""
    from myxtts.train.tts import train
    from tests.helpers import micro_config

    run = tmp_path_factory.mktemp("settings") / "run"
    train(micro_config(run, "train.max_steps=2", "train.ckpt_every=2", "train.val_every=100",
                       "model.d_model=48"), micro_store, progress=False)
    return run


@pytest.mark.slow
def test_profile_measures_a_runs_own_model(micro_store, small_run, capsys, caplog):
    import json
    import logging

    with caplog.at_level(logging.INFO):
        rc = main(["profile", str(micro_store), "--run", str(small_run), "--steps", "1",
                   "--json", "--device", "cpu", "--set", "data.batch_frames=1200"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err[-2000:]
    assert json.loads(captured.out)["setup"]["preset"] == "tiny"
    assert f"resuming from {small_run}/checkpoints/" in caplog.text  # its weights
    assert "differs from the checkpoint" not in caplog.text  # d_model 48 came with the run


def test_doctor_reads_a_run_folder_as_a_run(small_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    (run / "checkpoints" / "ckpt_00000003.pt").write_bytes(b"")  # a damaged newer one
    rc = main(["doctor", str(run), "--set", "train.compile=off", "--device", "cpu"])
    out = capsys.readouterr().out
    assert rc == 0 and "resumes from ckpt_00000002.pt (step 2)" in out, out
    assert "ckpt_00000003.pt is empty" in out and "malformed row" not in out


def test_train_names_the_model_size_it_trains_and_picks_one_worth_the_device(
        micro_store, tmp_path, monkeypatch):
    import myxtts.cli.common as common
    from myxtts.cli.common import config_with_size
    from myxtts.cli.main import build_parser

    def parsed(*extra: str):
        args = build_parser().parse_args(["train", str(micro_store), "--output-dir",
                                          str(tmp_path / "run"), *extra])
        return config_with_size(args, [], args.data)

    cfg, line = parsed("--device", "cpu")
    assert cfg.model.preset == "tiny" and line.startswith("model: tiny, the default on a CPU")
    monkeypatch.setattr(common, "resolve_device", lambda *a: __import__("torch").device("cuda"))
    cfg, line = parsed()
    assert cfg.model.preset == "small" and line.startswith("model: small, the default on a GPU")
    cfg, line = parsed("--model-size", "base")
    assert cfg.model.preset == "base" and line == "model: base (as configured)"
    cfg, line = parsed("--set", "model.d_model=64")
    assert cfg.model.preset == "tiny" and cfg.model.d_model == 64
