"""Nothing silently wrong or misleading: a setting that would quietly do something else than
the user meant is refused naming the key (``train.keep_last=0`` would keep every checkpoint,
about 1.7 GB each at the base size, until the disk fills), and a failure names the file
that failed and what survived."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.artifacts.errors import ArtifactError
from myxtts.artifacts.runs import CheckpointManager
from myxtts.cli.main import main
from myxtts.data.prepare.records import speaker_label
from myxtts.data.store.verify import verify_store
from myxtts.train.engine import task as task_module
from tests.bad_inputs.test_files_and_folders import _error, _run
from tests.helpers import MICRO_MODEL, full_disk_for_checkpoints
from tests.test_bad_inputs import _wav


@pytest.mark.parametrize("value", ["0", "-2"])
def test_keeping_no_checkpoint_is_refused_naming_the_key(value, micro_store, tmp_path, capsys):
    _error(["train", str(micro_store), "--output-dir", str(tmp_path / "run"), "--set",
            f"train.keep_last={value}"], capsys, "train.keep_last", ">= 1")
    assert not (tmp_path / "run").exists()


def test_a_disk_that_fills_after_the_step_checkpoint_names_the_file_that_failed(tmp_path,
                                                                               monkeypatch):
    """The step checkpoint and latest.txt were written, then best.pt hit the full disk: the
    line names best.pt and says which checkpoint a resume takes (not that the step's
    checkpoint failed and an older one survives)."""
    manager = CheckpointManager(tmp_path / "checkpoints", keep_last=2)
    state = {"model": {"w": torch.ones(3)}, ck.PROGRESS: {"step": 2}}
    manager.save(state, 2)
    full_disk_for_checkpoints(monkeypatch, suffix="best.pt")
    with pytest.raises(ArtifactError) as e:
        manager.save(state, 4, val_loss=1.0, is_best=True)
    said = str(e.value)
    assert said.startswith(f"cannot write {manager.dir / 'best.pt'} at step 4 (the disk is full)")
    assert "ckpt_00000004.pt was written" in said and said.endswith(
        f"{manager.path_of(4)} is the one a resume takes")
    assert manager.latest() == manager.path_of(4)


@pytest.mark.parametrize("command", ["train", "inspect-data"])
def test_a_store_copied_without_its_manifest_is_named_as_such(command, micro_store, tmp_path,
                                                              capsys):
    store = tmp_path / "store"
    shutil.copytree(micro_store, store)
    (store / "manifest.json").unlink()
    argv = [command, str(store)] + (["--output-dir", str(tmp_path / "run")]
                                    if command == "train" else [])
    _error(argv, capsys, "a feature store without its manifest.json", "copy the whole store")


def test_a_reference_that_is_no_audio_gets_a_references_fix(micro_run, tmp_path, capsys):
    """A text file named .wav given with -r: the line names it and asks for another
    recording of the voice, not to "remove it from the dataset" (there is none)."""
    notes = tmp_path / "notes.txt.wav"
    notes.write_text("some notes, not audio\n", encoding="utf-8")
    line = _error(["synthesize", "-c", str(micro_run), "-t", "hello", "-r", str(notes), "-o",
                   str(tmp_path / "out.wav")], capsys, str(notes), "another recording of the voice")
    assert "dataset" not in line and not (tmp_path / "out.wav").exists()


@pytest.mark.slow
def test_steps_skipped_for_nan_are_counted_in_a_closing_line(micro_store, tmp_path, capsys,
                                                             monkeypatch):
    """A NaN in the data that the store's finite-check record missed makes some steps
    non-finite; they are skipped (the run goes on), and the run's last lines say how many
    and how to check the store -- also with --quiet, where no "loss nan" is ever shown."""
    real, calls = task_module.compute_losses, [0]

    def every_fourth_nan(*args, **kwargs):
        calls[0] += 1
        losses = real(*args, **kwargs)
        return {k: v * float("nan") for k, v in losses.items()} if calls[0] % 4 == 0 else losses

    monkeypatch.setattr(task_module, "compute_losses", every_fourth_nan)
    argv = ["train", str(micro_store), "--output-dir", str(tmp_path / "run"), "--max-steps", "8",
            "--quiet"]
    for item in [*MICRO_MODEL, "train.val_every=100", "train.synth_every=0",
                 "train.tensorboard=false", "data.num_workers=0", "train.device=cpu"]:
        argv += ["--set", item]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "2 step(s) of this run were skipped for a non-finite loss" in err, err
    assert f"myxtts prepare --verify {micro_store}" in err


def _edited_store(micro_store, tmp_path, key: str, band: int, value: float):
    store = tmp_path / "store"
    shutil.copytree(micro_store, store)
    manifest = json.loads((store / "manifest.json").read_text(encoding="utf-8"))
    manifest["mel_stats"][key][band] = value
    (store / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return store


@pytest.mark.parametrize("value", [1e-30, -1.0, float("nan")])
def test_mel_statistics_no_prepare_writes_are_named_field_and_band(value, micro_store, tmp_path,
                                                                   capsys):
    """A std of 1e-30 trained at a loss in the thousands, -1 was called "features hold NaN"
    (they did not): both, and NaN, name the manifest field and band, in train and verify."""
    store = _edited_store(micro_store, tmp_path, "std", 3, value)
    _error(["train", str(store), "--output-dir", str(tmp_path / "run")], capsys,
           "manifest.json: mel_stats.std of band 3", "rebuild the store")
    problems = verify_store(store)
    assert len(problems) == 1 and "mel_stats.std of band 3" in problems[0], problems
    assert "hold NaN" not in problems[0]


def test_verify_recomputes_the_statistics_and_names_a_field_that_differs(micro_store, tmp_path):
    store = _edited_store(micro_store, tmp_path, "mean", 5, 0.5)
    problems = verify_store(store)
    said = "mel_stats.mean does not match the train mels (band 5: 0.5 recorded"
    assert len(problems) == 1 and said in problems[0], problems
    assert verify_store(micro_store) == []


@pytest.mark.slow
def test_a_dataset_prepare_would_reject_whole_is_no_problem_free_inspection(tmp_path, capsys):
    """40 silent clips: their headers are fine, so inspect-data and doctor said "problems:
    none" and prepare then kept nothing. Decoded as prepare decodes them, every one is
    reported, and the doctor blocks."""
    data = tmp_path / "silent"
    rows = [f"s{i}|the cat sat on the mat {i}" for i in range(40)]
    for i in range(40):
        _wav(data / "wavs" / f"s{i}.wav", 1.0, value=0.0)
    (data / "metadata.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    rc, text, _ = _run(["inspect-data", str(data)], capsys)
    assert rc == 0 and "silent audio (40)" in text and "40 clip(s), 40 of them would be " \
        "skipped" in text, text
    rc, text, _ = _run(["doctor", str(data)], capsys)
    assert rc == 1 and "dataset audio: " in text and "all 40 clip(s) decoded" in text, text


def test_the_journeys_summaries_say_what_they_count(tmp_path, capsys):
    """A Common Voice speaker is listed by a short form of its 64-digit client_id; rows
    that the configured languages drop are a problem, not "problems: none" below the line
    that counts them; prepare says its hours are of trimmed clips."""
    client = "a3f9" * 16
    assert speaker_label(client) == "a3f9a3f9\u2026" and speaker_label("anna") == "anna"
    data = tmp_path / "data"
    rows = [f"u{i}|the cat sat on the mat {i}|the cat sat on the mat {i}|{client}|en"
            for i in range(6)] + [f"f{i}|سلام دنیا {i}|سلام دنیا {i}|{client}|fa"
                                  for i in range(2)]
    for line in rows:
        _wav(data / "wavs" / f"{line.split('|')[0]}.wav", 1.0)
    (data / "metadata.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    rc, text, _ = _run(["inspect-data", str(data)], capsys)
    assert rc == 0 and "problems: none" not in text and "unknown language (1)" in text, text
    assert "a3f9a3f9\u2026" in text and client not in text.split("problem")[0], text
    rc, text, _ = _run(["prepare", str(data), "--out", str(tmp_path / "store"), "--set",
                        "text.languages=[en,fa]"], capsys)
    assert rc == 0 and "after trimming their leading and trailing silence" in text, text
