"""User-facing training errors (printed as one line by the CLI), and how the trainer reads
the errors torch raises: which mean "out of memory", and the one line a warning names."""

from __future__ import annotations

import torch

# RuntimeErrors (not torch's OutOfMemoryError) that CUDA libraries raise when their own
# workspace allocation fails near the memory limit.
OOM_MARKERS = ("CUDA out of memory", "CUDA error: out of memory", "CUBLAS_STATUS_ALLOC_FAILED",
               "CUDNN_STATUS_ALLOC_FAILED")


class TrainError(RuntimeError):
    """A training run cannot start or continue; the message names the cause and the fix."""


def _causes(e: BaseException, context: bool = False) -> list[BaseException]:
    """``e`` and what it explicitly wraps: ``raise ... from``, and the compiler's
    ``BackendCompilerFailed.inner_exception`` (raised ``from None``). With ``context``,
    also the error being handled when it was raised (``__context__``): a CUDA graph capture
    that ran out of memory inside its ``with`` raises the capture's own error from
    ``__exit__``, with the out-of-memory error only as its context."""
    chain: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and len(chain) < 8 and cur not in chain:
        chain.append(cur)
        implicit = cur.__context__ if context and not cur.__suppress_context__ else None
        cur = cur.__cause__ or getattr(cur, "inner_exception", None) or implicit
    return chain


def is_out_of_memory(e: BaseException) -> bool:
    """The device ran out of memory: torch's ``OutOfMemoryError``, or cuBLAS/cuDNN failing to
    allocate (a plain RuntimeError), also when the compiler wrapped it. The auto budget
    lowers the batch on these; a compiled step must not fall back to eager for them. The
    errors ``e`` was raised while handling count too (a failed capture's)."""
    for err in _causes(e, context=True):
        if isinstance(err, torch.cuda.OutOfMemoryError):
            return True
        if isinstance(err, RuntimeError) and any(m in str(err) for m in OOM_MARKERS):
            return True
    return False


def error_summary(e: BaseException, limit: int = 200) -> str:
    """``Type: first informative line`` of an error, for a one-line warning. Names the root
    cause where the error wraps one (the compiler's first line is only ``backend='inductor'
    raised:``), and never fails on an empty message (dynamo raises bare AssertionErrors)."""
    chain = _causes(e)
    root = chain[-1]
    lines = [s.strip() for s in str(root).splitlines()]
    lines = [s for s in lines if s and not s.endswith("raised:")]
    name = type(root).__name__ if root is e else f"{type(e).__name__} from {type(root).__name__}"
    return f"{name}: {lines[0][:limit] if lines else '(no message)'}"
