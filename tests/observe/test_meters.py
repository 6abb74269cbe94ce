"""StepTimer on the CPU: data wait is the host's time in next(loader), per interval."""

from __future__ import annotations

import time

import pytest
import torch

from myxtts.observe import meters
from myxtts.observe.meters import IntervalStats, StepTimer


class FakeClock:
    """Starts at the real clock (the timer takes its first reading on construction)."""

    def __init__(self) -> None:
        self.now = time.perf_counter()

    def __call__(self) -> float:
        return self.now


def test_wait_share_throughput_and_reset(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(meters.time, "perf_counter", clock)
    timer = StepTimer(torch.device("cpu"))
    for wait_s, compute_s in ((0.5, 1.5), (0.0, 2.0)):  # 4 s in all, 0.5 s of it waiting
        timer.wait_begin()
        clock.now += wait_s
        timer.wait_end()
        clock.now += compute_s
        timer.step_end(utterances=8, audio_s=20.0)
    stats = timer.collect()
    assert (stats.steps, stats.seconds, stats.utterances) == (2, pytest.approx(4.0, abs=0.01), 16)
    assert stats.data_wait_share == pytest.approx(0.125, rel=0.01)
    assert stats.steps_per_s == pytest.approx(0.5, rel=0.01) and stats.audio_s_per_s == pytest.approx(10.0, rel=0.01)
    clock.now += 1.0
    empty = timer.collect()  # a new interval: nothing carried over
    assert (empty.steps, empty.data_wait_s, empty.seconds) == (0, 0.0, pytest.approx(1.0))


def test_an_empty_interval_has_no_rates():
    stats = IntervalStats(steps=0, seconds=0.0, data_wait_s=0.0, utterances=0, audio_s=0.0)
    assert (stats.data_wait_share, stats.steps_per_s, stats.utterances_per_s) == (0.0, 0.0, 0.0)
