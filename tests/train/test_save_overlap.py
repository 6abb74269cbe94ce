"""A checkpoint's host copy in flight (the background saver's side stream): the next step's
forward and backward passes run beside it, and whatever writes the saved tensors in place
-- the update, uncaptured or replayed, and swapping the weights' moving average in for
validation -- waits for the copy first, on the GPU. Modelled on the CPU: the stream the
waits go to is a recorder, the phases come from the engine's markers."""

from __future__ import annotations

import torch

from myxtts.model.xtts import build_model
from myxtts.train.distributed import DistInfo
from myxtts.train.engine import TrainEngine
from tests.helpers import micro_config
from tests.train.graph_recorder import RecordingCapture
from tests.train.test_graphs import N_MELS, N_TOKENS, SHAPES, _batches, _pair


class Stream:
    """Stand-in for the training stream: records the events it was made to wait for."""

    def __init__(self, log: list) -> None:
        self.log = log

    def wait_event(self, event) -> None:
        self.log.append(f"wait {event}")


def _engine(tmp_path, log, monkeypatch, *overrides) -> TrainEngine:
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream(log))
    cfg = micro_config(tmp_path, f"audio.n_mels={N_MELS}", *overrides)
    torch.manual_seed(0)
    return TrainEngine(cfg, build_model(cfg, N_TOKENS, 1, None, None), torch.device("cpu"),
                       DistInfo(), compile_model=False)


def test_the_update_waits_for_the_copy_and_the_passes_before_it_do_not(tmp_path, one_thread,
                                                                       monkeypatch):
    log: list[str] = []
    engine = _engine(tmp_path, log, monkeypatch, "train.grad_accum_steps=2")
    engine.step(_batches(0, 2))
    engine.after_copy("copy-1")
    with engine.timed(log.append):
        engine.step(_batches(1, 2))
        engine.step(_batches(2, 2))  # the copy was waited for once: no second wait
    assert log == ["forward", "backward", "forward", "backward", "wait copy-1", "optimizer",
                   "forward", "backward", "forward", "backward", "optimizer"]


def test_swapping_the_weight_average_in_waits_for_the_copy(tmp_path, one_thread, monkeypatch):
    log: list[str] = []
    engine = _engine(tmp_path, log, monkeypatch, "train.ema_decay=0.9")
    engine.step(_batches(0, 1))
    engine.after_copy("copy-2")
    with engine.evaluating():
        log.append("validation")
    with engine.evaluating(raw_weights=True):  # no swap: nothing written, nothing to wait for
        log.append("raw validation")
    assert log == ["wait copy-2", "validation", "raw validation"]


def test_a_replayed_update_waits_for_the_copy_after_the_replayed_passes(tmp_path, one_thread,
                                                                        monkeypatch):
    log: list[str] = []
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream(log))
    _, (_, engine) = _pair(tmp_path)
    engine.warm_up(SHAPES, engine.task.worst_case, capture=RecordingCapture(), echo=lambda s: None)
    engine.after_copy("copy-3")
    with engine.timed(log.append):
        engine.step(_batches(0, 1))
    assert log == ["forward+backward", "wait copy-3", "optimizer"]
