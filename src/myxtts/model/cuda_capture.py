"""What a failed CUDA graph capture leaves behind, undone: shared by the training step's
graphs (``train.engine.graphs``) and XTTS-v2's decode step (``inference.xtts_v2.graphed``).
"""

from __future__ import annotations

from typing import Any

import torch


def end_failed_capture(index: int, stream: torch.cuda.Stream, pool: Any) -> bool:
    """After a capture raised: ``stream`` is the thread's current stream again, and if the
    caching allocator still routed the capture into ``pool`` (torch's ``capture_end`` did
    not get that far), that capture ends and its use of the pool is given back (torch's
    private calls, the pair its own pool context manager ends with; no public call does
    this). Returns whether it had to: False where the capture never began allocating or
    torch ended it (the allocator refuses to end it twice, which is fine)."""
    torch.cuda.set_stream(stream)
    end = getattr(torch._C, "_cuda_endAllocateToPool", None) or getattr(
        torch._C, "_cuda_endAllocateCurrentStreamToPool", None)
    if end is None:  # pragma: no cover - every torch >= 2.4 has one of the two
        return False
    try:
        end(index, pool)
    except RuntimeError:  # "not currently recording to" the pool: nothing to end
        return False
    torch._C._cuda_releasePool(index, pool)
    return True
