"""A CPU stand-in for CUDA graph capture, so the graphed training step is tested without a GPU.

``RecordingCapture(fn)`` runs ``fn`` once under a dispatch mode that records every aten op
it executes with the very tensor objects it used; the returned replay re-executes the
recorded ops and writes each result into the tensor the op produced at capture time -- what
a CUDA graph does with fixed addresses. So, exactly as on a GPU:

* Python does not run again at replay: a value the step computed on the host at capture
  time (a float learning rate, a Python-side counter) stays baked in;
* a tensor rebound in Python during capture (``x = x + y`` instead of ``x.add_(y)``) keeps
  its capture-time inputs, so a running sum would stop accumulating;
* reading a device value on the host inside the step (``.item()``, ``bool(t)``, a tensor
  made from host data) is refused, as capture refuses it;
* random ops draw new numbers at each replay.

Ops whose output aliases an input (views, ``detach``) are not replayed: the alias follows
its base, which the ops before it refresh in place.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

# ops that read a device value on the host or make a tensor from host data: a CUDA graph
# capture fails on them (or they sync the stream)
HOST_READS = {"aten._local_scalar_dense", "aten.is_nonzero", "aten.equal", "aten.nonzero",
              "aten.lift_fresh", "aten.lift_fresh_copy", "aten.masked_select", "aten.unique"}


class HostReadError(RuntimeError):
    """The captured function read a device value on the host."""


def _op_name(func) -> str:
    return str(func).rsplit(".", 1)[0] if str(func).count(".") > 1 else str(func)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _op_name(func)
        if name in HOST_READS:
            raise HostReadError(f"{func} inside a captured step: a host read / host data "
                                f"(a CUDA graph cannot capture it)")
        out = func(*args, **kwargs)
        mutates = any(a.alias_info is not None and a.alias_info.is_write
                      for a in func._schema.arguments)
        inputs = {_storage(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        aliases = bool(outs) and all(_storage(t) in inputs for t in outs)
        if not mutates and not aliases:
            self.ops.append((func, args, kwargs, out))
        elif mutates:
            self.ops.append((func, args, kwargs, None))
        return out


def _write_back(captured, fresh) -> None:
    if isinstance(captured, torch.Tensor):
        with torch.no_grad():
            captured.copy_(fresh)
    elif isinstance(captured, list | tuple):
        for c, f in zip(captured, fresh):
            _write_back(c, f)


class RecordingCapture:
    """``capture(fn) -> replay`` with CUDA-graph semantics on any device (see module doc)."""

    def __init__(self) -> None:
        self.captures = 0

    def __call__(self, fn: Callable[[], None]) -> Callable[[], None]:
        recorder = _Recorder()
        with recorder:
            fn()
        ops = recorder.ops
        self.captures += 1

        def replay() -> None:
            with torch.no_grad():
                for func, args, kwargs, out in ops:
                    fresh = func(*args, **kwargs)
                    if out is not None:
                        _write_back(out, fresh)

        return replay

    def problem(self) -> str | None:
        """What a failed capture left wrong with the device: nothing, on the CPU."""
        return None


def assert_no_host_reads(fn: Callable[[], object]) -> None:
    """Run ``fn`` and fail on any host read of a tensor value inside it (see HOST_READS)."""
    with _Recorder():
        fn()
