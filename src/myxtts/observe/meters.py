"""Throughput and data-wait meters that never sync the GPU on the hot path.

Why this is subtle: without per-step host syncs the host runs ahead of the GPU,
so the host's time inside ``next(loader)`` is not GPU idle time. On CUDA we record
an event when a step's work has been queued and one when the next step's work
begins; the gap between them on the compute stream is time the GPU sat idle
waiting for the host. Of that gap, the part the host spent waiting for data is the
data wait (``min(gpu_gap, host_wait)``). Events are read once per log interval (the
only sync). On CPU there is no asynchrony: the host's wait is the data wait.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import torch


@dataclass
class IntervalStats:
    steps: int
    seconds: float
    data_wait_s: float
    utterances: int
    audio_s: float

    @property
    def data_wait_share(self) -> float:
        return self.data_wait_s / self.seconds if self.seconds > 0 else 0.0

    @property
    def utterances_per_s(self) -> float:
        return self.utterances / self.seconds if self.seconds > 0 else 0.0

    @property
    def audio_s_per_s(self) -> float:
        return self.audio_s / self.seconds if self.seconds > 0 else 0.0

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0


@dataclass
class StepTimer:
    """Call ``wait_begin()`` before fetching a batch, ``wait_end()`` after it arrived,
    ``step_end(utterances, audio_s)`` once the step's work is queued, ``collect()`` at
    log intervals (this syncs on CUDA) to get an :class:`IntervalStats`."""

    device: torch.device
    _t0: float = field(default_factory=time.perf_counter)
    _wait_start: float = 0.0
    _host_waits: list[float] = field(default_factory=list)
    _gpu_pairs: list[tuple[torch.cuda.Event, torch.cuda.Event]] = field(default_factory=list)
    _last_end: object = None
    _steps: int = 0
    _utts: int = 0
    _audio_frames: float = 0.0

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def wait_begin(self) -> None:
        self._wait_start = time.perf_counter()

    def wait_end(self) -> None:
        self._host_waits.append(time.perf_counter() - self._wait_start)
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            if self._last_end is not None:
                self._gpu_pairs.append((self._last_end, start))
            else:  # first step of the interval: its gap is not measurable on the GPU
                self._gpu_pairs.append((None, start))  # type: ignore[arg-type]

    def step_end(self, utterances: int, audio_s: float) -> None:
        self._steps += 1
        self._utts += utterances
        self._audio_frames += audio_s
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._last_end = end

    def collect(self) -> IntervalStats:
        if self.cuda:
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        seconds = now - self._t0
        if self.cuda:
            wait = 0.0
            for (prev_end, start), host in zip(self._gpu_pairs, self._host_waits):
                gap = host if prev_end is None else prev_end.elapsed_time(start) / 1e3
                wait += min(gap, host)
        else:
            wait = sum(self._host_waits)
        stats = IntervalStats(self._steps, seconds, wait, self._utts, self._audio_frames)
        self._t0 = now
        self._host_waits.clear()
        self._gpu_pairs.clear()
        self._last_end = None
        self._steps = self._utts = 0
        self._audio_frames = 0.0
        return stats


class SavedBytes:
    """Bytes autograd keeps for the backward pass of what runs inside the ``with``
    (``torch.autograd.graph.saved_tensors_hooks``): each storage once (views share one), the
    model's parameters left out (they are kept anyway). Device independent: how activation
    checkpointing is measured where no GPU reports a peak (a checkpointed block saves its
    inputs through these hooks and nothing of its inside)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self._seen: set[int] = set()
        self.nbytes = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> Any:
        key = t.untyped_storage().data_ptr()
        if key not in self._params and key not in self._seen:
            self._seen.add(key)
            self.nbytes += t.untyped_storage().nbytes()
        return t

    def __enter__(self) -> SavedBytes:
        self._hooks.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._hooks.__exit__(kind, value, tb)
