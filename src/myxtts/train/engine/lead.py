"""How far the host may run ahead of the GPU: at most ``MAX_LEAD_STEPS`` queued steps.

Why: the step never syncs, so on the store path (where nothing else throttles the host)
Python would queue step after step while the GPU works through the first ones, and every
queued step keeps its input batches alive (their memory is recorded on the compute stream
until the kernels that read them ran): prefetched batches would pile up far beyond what
the memory plan counted. After queuing a step, :class:`StepLead` records a CUDA event and
waits on the event of the step ``MAX_LEAD_STEPS`` before it: the host stays a couple of
steps ahead -- enough to keep the GPU's queue full -- and the batches in flight stay
bounded. Costs nothing when the GPU is the slower side, which is the point of the loop:
the markers are blocking events, so the waiting host thread sleeps in the driver instead
of spinning a core that the loader's workers and the checkpoint writer could use.
On a CPU every step is synchronous: nothing to bound.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

MAX_LEAD_STEPS = 2  # queued steps the host may be ahead of the GPU


class StepLead:
    """Call :meth:`queued` after each step is queued. ``event``: makes the marker recorded
    per step (a CUDA event on a GPU; tests pass a stand-in with ``record`` and
    ``synchronize``)."""

    def __init__(self, device: torch.device, max_lead: int = MAX_LEAD_STEPS,
                 event: Callable[[], Any] | None = None) -> None:
        if max_lead < 1:
            raise ValueError(f"the host must be allowed at least one step ahead, got {max_lead}")
        self.enabled = event is not None or device.type == "cuda"
        self.max_lead = max_lead
        self._event = event or functools.partial(torch.cuda.Event, blocking=True)
        self._pending: deque[Any] = deque()

    def queued(self) -> None:
        """A step was queued: mark it, and wait until at most ``max_lead`` are pending."""
        if not self.enabled:
            return
        marker = self._event()
        marker.record()
        self._pending.append(marker)
        while len(self._pending) > self.max_lead:
            self._pending.popleft().synchronize()

    @property
    def pending(self) -> int:
        """Steps queued and not known to be finished."""
        return len(self._pending)

    def clear(self) -> None:
        """Forget the markers (after a sync that finished every queued step)."""
        self._pending.clear()
