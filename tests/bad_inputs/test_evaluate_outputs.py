"""``myxtts evaluate`` guards its outputs and says what it scored: ``--out`` is checked before
any scoring -- never one of its inputs (the run it scores holds the evaluation.json its bundle
carries), never another run folder, store or dataset, never a file, always writable -- an
evaluation stopped half-way leaves the previous one's table, CSV and clips as they were;
``--max`` spreads its choice over the languages, a reference that cannot be used gives way to
another clip of the speaker, and nothing evaluated is one line, not an empty table."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from myxtts.audio.io import load_audio
from myxtts.cli.main import main
from myxtts.config import load_config
from myxtts.data.store import FeatureStore
from myxtts.evaluate import harness
from myxtts.evaluate.mel_speaking import MelSpeakingModel
from myxtts.evaluate.record import read_evaluation
from myxtts.evaluate.training import TrainingEvaluation
from myxtts.inference.errors import SynthesisError
from myxtts.metrics.truth import MAX_LENGTH_RATIO
from myxtts.train.tts import train
from tests.bad_inputs.conftest import snapshot
from tests.bad_inputs.test_files_and_folders import _error
from tests.helpers import micro_config
from tests.test_bad_inputs import _wav


@pytest.mark.parametrize("where, needles", [
    ("model", ("is MODEL",)), ("inside model", ("lies inside MODEL",)),
    ("data", ("is DATA",)), ("store", ("a feature store",)), ("other run", ("a training run",)),
    ("file", ("it is a file",)), ("unwritable", ("cannot write",))])
def test_out_is_checked_before_any_scoring(where, needles, micro_run, micro_store, tmp_path,
                                           capsys):
    data = micro_store.parent / "data"
    other = tmp_path / "other-run"
    (other / "checkpoints").mkdir(parents=True)
    (tmp_path / "a-file").write_text("mine\n")
    out = {"model": micro_run, "inside model": micro_run / "evaluation", "data": data,
           "store": micro_store, "other run": other, "file": tmp_path / "a-file",
           "unwritable": "/proc/self/evaluation"}[where]
    before = snapshot(micro_run, micro_store, data, other, tmp_path / "a-file")
    line = _error(["evaluate", str(micro_run), str(data), "--out", str(out), "--asr", "none",
                   "--max", "1", "--device", "cpu"], capsys, "--out", *needles)
    assert "utterance 1/" not in capsys.readouterr().err  # nothing was scored
    assert snapshot(micro_run, micro_store, data, other, tmp_path / "a-file") == before, line
    assert not (micro_run / "evaluation").exists()


def test_an_evaluation_stopped_half_way_leaves_the_previous_one_whole(micro_run, micro_store,
                                                                      tmp_path, monkeypatch):
    out = tmp_path / "eval"
    (out / "audio").mkdir(parents=True)
    (out / "evaluation.json").write_text(json.dumps({"previous": True}))
    (out / "utterances.csv").write_text("id\nold\n")
    (out / "audio" / "old.model.wav").write_bytes(b"old clip")
    before = snapshot(out)

    def stopped(*args, audio_dir=None, **kwargs):  # scores one utterance, then Ctrl-C
        from myxtts.audio.io import save_wav

        save_wav(audio_dir / "new.model.wav", np.zeros(100, np.float32), 22050)
        raise KeyboardInterrupt

    monkeypatch.setattr(harness, "evaluate", stopped)
    rc = main(["evaluate", str(micro_run), str(micro_store.parent / "data"), "--out", str(out),
               "--keep-audio", "--asr", "none", "--device", "cpu"])
    assert rc == 130
    assert snapshot(out) == before  # no new clip beside the old table, no staging left


def _lj(root, rows: dict[str, tuple[str, str, float]]):
    """An LJSpeech folder with speaker and language columns: id -> (speaker, language, s)."""
    texts = {"en": "the cat sat on the mat", "fa": "سلام دنیا خوب است"}
    lines = []
    for uid, (speaker, language, seconds) in rows.items():
        _wav(root / "wavs" / f"{uid}.wav", seconds)
        lines.append(f"{uid}|{texts[language]}|{texts[language]}|{speaker}|{language}")
    (root / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def test_max_spreads_the_choice_over_the_languages(tmp_path):
    """4 English and 16 Persian utterances, --max 4: both languages are scored (a plain
    seeded draw gave 4 Persian ones: no English row, no CER anywhere)."""
    rows = {f"en{i}": ("anna", "en", 1.0) for i in range(4)}
    rows |= {f"fa{i}": ("babak", "fa", 1.0) for i in range(16)}
    data = _lj(tmp_path / "data", rows)
    cfg = load_config(overrides=["text.languages=[en,fa]"])
    for seed in range(10):
        cases, _ = harness.pick_cases(data, cfg, "all", ["en", "fa"], 4, seed)
        assert sorted({c.language for c in cases}) == ["en", "fa"], (seed, cases)
        assert len(cases) == 4


def test_a_reference_that_cannot_be_used_gives_way_to_another_clip_of_the_speaker(micro_run,
                                                                                 tmp_path):
    model = MelSpeakingModel.open(micro_run, device="cpu")
    model.load()
    synth = model.synth
    short, long = _wav(tmp_path / "short.wav", 0.3), _wav(tmp_path / "long.wav", 2.0)
    sr = synth.cfg.audio.sample_rate
    load = {p: (lambda p=p: load_audio(p, synth.cfg.audio)) for p in (short, long)}
    case = harness.Case("u1", "the cat sat", "en", "anna", "short", load[long], load[short],
                           [("long", load[long])])
    chosen, latents = harness._with_usable_reference(model, case)
    assert chosen.reference_id == "long" and len(chosen.load_reference()) > sr
    assert latents.shape[0] == 1
    with pytest.raises(SynthesisError, match="no usable reference clip of speaker anna among 1"):
        harness._with_usable_reference(model, harness.Case(
            "u1", "t", "en", "anna", "short", load[long], load[short]))


def test_nothing_evaluated_is_one_line_and_a_failure(micro_run, tmp_path, capsys):
    """Every clip too short to clone a voice from: no empty table with exit code 0, but one
    line saying why."""
    data = _lj(tmp_path / "data", {f"u{i}": ("anna", "en", 0.35) for i in range(4)})
    _error(["evaluate", str(micro_run), str(data), "--split", "all", "--asr", "none",
            "--device", "cpu"], capsys, "nothing could be evaluated", "reference")


def test_rows_left_out_or_doubtful_are_each_said(tmp_path):
    """A raw dataset evaluated as prepare would train it: a row in a language the model does
    not speak, a clip beyond data.max_duration_s and one below data.min_duration_s are left
    out, and a clip recorded at 8 kHz is named as a muffled reference -- each in a note."""
    rows = {f"u{i}": ("anna", "en", 1.0) for i in range(4)}
    data = _lj(tmp_path / "data", rows)
    meta = data / "metadata.csv"
    _wav(data / "wavs" / "fr0.wav", 1.0)
    _wav(data / "wavs" / "long0.wav", 40.0)
    _wav(data / "wavs" / "short0.wav", 0.1)
    _wav(data / "wavs" / "tel0.wav", 1.0, sr=8000)
    meta.write_text(meta.read_text(encoding="utf-8") + "".join(
        f"{uid}|{text}|{text}|anna|{lang}\n" for uid, text, lang in [
            ("fr0", "le chat est noir", "fr"), ("long0", "a long one", "en"),
            ("short0", "a short one", "en"), ("tel0", "over the phone", "en")]),
        encoding="utf-8")
    cfg = load_config(overrides=["data.max_duration_s=20"])
    cases, notes = harness.pick_cases(data, cfg, "all", ["en"], 20, 0)
    said = " | ".join(notes)
    assert sorted(c.id for c in cases) == ["tel0", "u0", "u1", "u2", "u3"], said
    assert "1 utterance in fr left out: the model speaks en" in said
    assert "2 clips outside data.min_duration_s..max_duration_s" in said
    assert "1 clip recorded below 16000 Hz" in said


@pytest.mark.slow
def test_training_evaluation_scores_each_utterance_once_with_evaluates_length_cap(micro_store,
                                                                               tmp_path):
    """``train.eval_every`` over a validation split of 2 utterances asked for 8: 2 scored
    (the validation sampler repeats utterances to fill its batches; a repeat is no new
    utterance), and a model that never stops is cut at 3x the true length, as
    ``myxtts evaluate`` cuts it, so "duration ratio" means one thing in both printouts."""
    n_val = len(FeatureStore.open(micro_store, "val"))
    run = tmp_path / "run"
    train(micro_config(run, "train.max_steps=2", "train.eval_every=2", "train.eval_utterances=8",
                       "model.max_decoder_frames=2000", "data.batch_frames=2400"), micro_store,
          progress=False, evaluation=TrainingEvaluation)
    done = read_evaluation(run)
    assert done["utterances"] == n_val < 8
    assert done["metrics"]["duration_ratio"] <= MAX_LENGTH_RATIO + 0.05


@pytest.mark.slow
def test_a_short_reference_is_warned_about_once_per_utterance(micro_run, tmp_path, caplog):
    data = _lj(tmp_path / "data", {f"u{i}": ("anna", "en", 0.6) for i in range(2)})
    with caplog.at_level(logging.WARNING, logger="myxtts.inference.synthesizer"):
        ev = harness.evaluate(micro_run, data, max_utterances=1, split="all", asr="none",
                                 device="cpu")
    said = [r.getMessage() for r in caplog.records if "under half" in r.getMessage()]
    assert len(ev.cases) == 1 and len(said) == 1, said
