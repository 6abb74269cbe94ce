"""The phase clock's arithmetic: marks become per-phase durations that add up to the step."""

from __future__ import annotations

import pytest
import torch

from myxtts.diagnose.profile.phases import COPY, PhaseClock, Spread, phase_stats


def scripted(times):
    clock = PhaseClock(torch.device("cpu"))
    it = iter(times)
    clock._now = lambda: next(it)  # the marks read these instead of the wall clock
    return clock


def test_marks_become_phases_that_sum_to_the_step():
    # step 1: start 0, fetched 1, forward 3, backward 6, optimizer 7; step 2 starts at 8
    # step 2 with two micro-batches: fetched 8.5, fwd 9, bwd 10, fwd 11, bwd 13, opt 14; end 16
    clock = scripted([0, 1, 3, 6, 7, 8, 8.5, 9, 10, 11, 13, 14, 16])
    for marks in (["forward", "backward"], ["forward", "backward", "forward", "backward"]):
        clock.start()
        clock.fetched()
        for m in marks:
            clock.mark(m)
        clock.mark("optimizer")
    clock.finish()
    first, second = clock.steps()
    assert first == {"data wait": 1, "forward": 2, "backward": 3, "optimizer": 1, "other": 1,
                     "step": 8}
    assert second == {"data wait": 0.5, "forward": 0.5 + 1, "backward": 1 + 2, "optimizer": 1,
                      "other": 2, "step": 8}
    for s in (first, second):
        assert sum(v for k, v in s.items() if k != "step") == pytest.approx(s["step"])


def test_a_graph_replay_is_one_forward_backward_phase():
    clock = scripted([0, 2, 5, 6, 6.5])
    clock.start()
    clock.fetched()
    clock.mark("forward+backward")
    clock.mark("optimizer")
    clock.finish()
    (step,) = clock.steps()
    assert step == {"data wait": 2, "forward+backward": 3, "optimizer": 1, "other": 0.5, "step": 6.5}


def test_stats_count_a_missing_phase_as_zero_and_keep_the_copy_apart():
    steps = [{"data wait": 1.0, "forward": 2.0, "step": 3.0}, {"forward": 4.0, "step": 4.0}]
    stats = phase_stats(steps, copies=[0.5, 0.7])
    assert stats["data wait"].mean == 0.5 and stats["forward"].mean == 3.0
    assert stats["step"].mean == 3.5
    assert stats[COPY].mean == pytest.approx(0.6)
    assert "backward" not in stats and COPY not in phase_stats(steps, [])


def test_spread_percentiles():
    s = Spread.of([float(x) for x in range(11)])  # 0..10
    assert (s.mean, s.p10, s.p90) == (5.0, 1.0, 9.0)
    assert Spread.of([]).mean == 0.0


def test_an_unknown_phase_is_refused():
    with pytest.raises(ValueError, match="unknown step phase"):
        PhaseClock(torch.device("cpu")).mark("backwards")
