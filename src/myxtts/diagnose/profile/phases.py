"""Where a training step's time goes: a clock that marks phase boundaries and the per-phase
statistics of a window of steps.

On a GPU the marks are CUDA events on the compute stream, read after one sync at the window's
end, so each phase is timed on the GPU's own timeline and the host never waits inside the
window. ``data wait`` runs from the mark before the fetch (reached when the GPU finished the
previous step) to the mark after it (queued once the batch arrived): exactly the GPU's idle
time for data. Then ``forward``, ``backward``, ``optimizer`` (``forward+backward`` for a graph
replay) and ``other`` (host bookkeeping between steps). On a CPU the marks are wall clock with
synchronisation, and the report says so. The host->device copy runs on the prefetcher's side
stream and is shown beside the phases, not in their sum.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

# The phases of the step's timeline, in order; their means add up to the step time.
TIMELINE = ("data wait", "forward", "backward", "forward+backward", "optimizer", "other")
COPY = "host->device copy"
_START, _FETCHED = "<start>", "<fetched>"
_STEP_MARKS = ("forward", "backward", "forward+backward", "optimizer")  # the engine's phase names


class PhaseClock:
    """``start()`` before a step's fetch, ``fetched()`` after it, the step's own marks via
    ``mark`` (hand it to ``TrainEngine.timed``), ``finish()`` after the window's last step;
    then ``steps()`` gives each step's phase durations in seconds."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self._marks: list[tuple[str, Any]] = []

    def _now(self) -> Any:
        if self.cuda:  # on the training device's compute stream, whichever GPU is current
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(self.device))
            return ev
        return time.perf_counter()

    def start(self) -> None:
        self._marks.append((_START, self._now()))

    def fetched(self) -> None:
        self._marks.append((_FETCHED, self._now()))

    def mark(self, phase: str) -> None:
        if phase not in _STEP_MARKS:  # an unknown phase would be in the step, not the table
            raise ValueError(f"unknown step phase {phase!r}; expected one of {_STEP_MARKS}")
        self._marks.append((phase, self._now()))

    def finish(self) -> None:
        """The end of the last step (a final start mark), then one sync on a GPU."""
        self.start()
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def _seconds(self, a: Any, b: Any) -> float:
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a

    def steps(self) -> list[dict[str, float]]:
        """Per step: phase -> seconds (phases that did not occur are absent), and ``step``."""
        out: list[dict[str, float]] = []
        starts = [i for i, (name, _) in enumerate(self._marks) if name == _START]
        for a, b in zip(starts, starts[1:]):
            marks = self._marks[a:b + 1]
            phases: dict[str, float] = {}
            for (_, t0), (name, t1) in zip(marks, marks[1:]):
                phase = "data wait" if name == _FETCHED else "other" if name == _START else name
                phases[phase] = phases.get(phase, 0.0) + self._seconds(t0, t1)
            phases["step"] = self._seconds(marks[0][1], marks[-1][1])
            out.append(phases)
        return out


@dataclass
class Spread:
    """Mean and spread of one figure over the window's steps (seconds)."""

    mean: float
    p10: float
    p90: float

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        if not values:
            return cls(0.0, 0.0, 0.0)
        ordered = sorted(values)
        pick = lambda q: ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]  # noqa: E731
        return cls(statistics.fmean(values), pick(0.1), pick(0.9))

    def as_dict(self) -> dict[str, float]:
        return {"mean_s": self.mean, "p10_s": self.p10, "p90_s": self.p90}


def phase_stats(steps: list[dict[str, float]], copies: list[float]) -> dict[str, Spread]:
    """Spread of every phase that occurred (a missing phase counts 0 in steps without it),
    of the step, and of the side-stream copy (per batch)."""
    present = [p for p in TIMELINE if any(p in s for s in steps)]
    stats = {p: Spread.of([s.get(p, 0.0) for s in steps]) for p in present}
    stats["step"] = Spread.of([s["step"] for s in steps])
    if copies:
        stats[COPY] = Spread.of(copies)
    return stats


def copy_seconds(copy_log: list[tuple[Any, Any]]) -> list[float]:
    """Durations of the logged side-stream copies whose events have completed."""
    out = []
    for start, end in copy_log:
        if end.query():
            out.append(start.elapsed_time(end) / 1e3)
    return out
