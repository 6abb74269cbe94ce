"""Metric sinks: rank 0 writes JSONL (and TensorBoard), other ranks write nothing."""

from __future__ import annotations

import json

import numpy as np
import pytest

from myxtts.observe.loggers import NullLogger, build_logger
from myxtts.observe.progress import Progress


def test_rank0_writes_jsonl_rows_with_prefixes(tmp_path):
    logger = build_logger(tmp_path, rank=0, tensorboard=False)
    logger.scalars(5, {"loss": 1.5, "lr": 1e-3}, prefix="train/")
    logger.scalars(10, {"loss": 0.75}, prefix="val/")
    logger.audio("synth/0", np.zeros(10, np.float32), 22050, 10)  # JSONL keeps scalars only
    logger.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [5, 10]
    assert rows[0]["train/loss"] == 1.5 and rows[0]["train/lr"] == 1e-3 and rows[1]["val/loss"] == 0.75


def test_other_ranks_write_nothing(tmp_path):
    logger = build_logger(tmp_path, rank=1, tensorboard=True)
    assert type(logger) is NullLogger
    logger.scalars(1, {"loss": 1.0})
    assert list(tmp_path.iterdir()) == []


def test_tensorboard_receives_scalars_images_and_audio(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = build_logger(tmp_path, rank=0, tensorboard=True)
    logger.scalars(1, {"loss": 1.25, "lr": 3e-4}, prefix="train/")
    logger.scalars(7, {"loss": 0.5}, prefix="train/")
    logger.scalars(7, {"loss": 0.75}, prefix="val/")
    logger.image("mel/0", np.random.default_rng(0).normal(size=(8, 12)), 1)
    logger.audio("synth/0", np.zeros(2205, np.float32), 22050, 1)
    logger.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    read = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert read == {"train/loss": [(1, 1.25), (7, 0.5)], "train/lr": [(1, pytest.approx(3e-4))],
                    "val/loss": [(7, 0.75)]}
    (image,) = events.Images("mel/0")
    assert (image.step, image.width, image.height) == (1, 12, 8)
    (audio,) = events.Audio("synth/0")
    assert (audio.step, audio.sample_rate, audio.length_frames) == (1, 22050, 2205)


def test_progress_without_a_terminal_prints_log_lines(capsys):
    bar = Progress(total=100, initial=0, enabled=True)
    bar.tty, bar._bar = False, None  # as under CI or nohup
    bar.update_to(25, {"loss": 0.5, "utterances_per_s": 12.0, "data_wait_share": 0.031})
    bar.note("step 25: val loss 0.4000")
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("step 25/100 | loss 0.5000 | 12.0 utt/s") and "data-wait 3.1%" in err[0]
    assert err[1] == "step 25: val loss 0.4000"
    quiet = Progress(total=100, enabled=False)
    quiet.update_to(50, {"loss": 1.0})
    quiet.note("nothing")
    assert capsys.readouterr().err == ""
