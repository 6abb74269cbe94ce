"""``myxtts evaluate`` guards its outputs: ``--out`` is checked before any scoring -- never one
of its inputs (the run it scores holds the evaluation.json its bundle carries), never another
run folder, store or dataset, never a file, always writable -- and an evaluation stopped
half-way leaves the previous one's table, CSV and clips as they were, with nothing of its own
beside them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from myxtts.cli.main import main
from myxtts.inference import evaluation
from tests.bad_inputs.conftest import snapshot
from tests.bad_inputs.test_files_and_folders import _error


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

    monkeypatch.setattr(evaluation, "evaluate", stopped)
    rc = main(["evaluate", str(micro_run), str(micro_store.parent / "data"), "--out", str(out),
               "--keep-audio", "--asr", "none", "--device", "cpu"])
    assert rc == 130
    assert snapshot(out) == before  # no new clip beside the old table, no staging left
