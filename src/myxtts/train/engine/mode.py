"""How the training step runs, decided in one place: precision, compiled blocks, CUDA graphs.

:func:`plan_step` turns ``train.precision``, ``train.compile``, ``train.cuda_graphs`` and
``train.activation_checkpointing`` into a :class:`StepPlan` for this device, process count
and optimizer. Checkpointed blocks recompute their dropout in the backward pass, rewinding
the random stream to where the forward drew it. Eager blocks do that through the default
CUDA generator, which a capture records (torch >= 2.10 allows the rewind while capturing);
compiled blocks use private generators ``torch.cuda.graph`` does not register. So with
checkpointing, dropout and graphs the blocks run uncompiled (the graph already removes the
launch overhead compiling saves); on an older torch the step is not captured.
"""


from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import torch

from myxtts.config import Config, ConfigError

# the first torch whose CUDA graph capture lets torch.utils.checkpoint rewind the generator
CHECKPOINT_CAPTURE_TORCH = (2, 10)


def native_bf16() -> bool:
    """The current GPU computes bf16 in hardware (Ampere or newer). torch's plain
    ``is_bf16_supported()`` also says yes where bf16 is only emulated (a V100, a T4), which
    runs far slower than fp16 there."""
    try:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # pragma: no cover - torch before the argument existed: native only
        return torch.cuda.is_bf16_supported()


def resolve_precision(precision: str, device: torch.device) -> torch.dtype:
    """auto: bf16 on GPUs that compute it natively, fp16 on older GPUs, fp32 on CPU."""
    if precision == "fp32" or (precision == "auto" and device.type != "cuda"):
        return torch.float32
    if precision == "bf16":
        return torch.bfloat16
    if precision == "fp16":
        return torch.float16
    with torch.cuda.device(device):
        return torch.bfloat16 if native_bf16() else torch.float16


def resolve_compile(mode: str, device: torch.device) -> bool:
    return mode == "on" or (mode == "auto" and device.type == "cuda")


def resolve_graphs(mode: str, device: torch.device, dtype: torch.dtype, distributed: bool,
                   fused: bool) -> bool:
    """Whether to capture the step as CUDA graphs (``train.cuda_graphs``). ``auto``: on a
    CUDA device for a single process in bf16/fp32 with fused AdamW; ``on`` where that is
    impossible is an error naming the reason (DDP's gradient hooks and fp16's loss scaler
    are not captured; the non-fused optimizer reads the skip flag on the host)."""
    why = None
    if device.type != "cuda":
        why = f"training runs on {device.type}"
    elif distributed:
        why = "several processes (DDP) train"
    elif dtype == torch.float16:
        why = "train.precision is fp16 (its grad scaler steps on the host)"
    elif not fused:
        why = "fused AdamW is unavailable"
    if why is None:
        return mode != "off"
    if mode == "on":
        raise ConfigError(f"train.cuda_graphs=on but {why}; use --set train.cuda_graphs=auto")
    return False


class StepMode(StrEnum):
    """How a step runs: ``graphed`` (captured CUDA graphs replayed; their blocks may be
    compiled too), ``compiled`` (the transformer blocks, ``train.compile``) or ``eager``."""

    EAGER = "eager"
    COMPILED = "compiled"
    GRAPHED = "graphed"

    @classmethod
    def of(cls, compiled: bool, graphed: bool) -> StepMode:
        return cls.GRAPHED if graphed else cls.COMPILED if compiled else cls.EAGER


@dataclass(frozen=True)
class StepPlan:
    """What the config asks of the step on this device (:func:`plan_step`)."""

    compile: bool  # compile the transformer blocks (train.compile)
    graphs: bool  # capture the step as CUDA graphs in the warm-up (train.cuda_graphs)
    note: str | None = None  # why the plan differs from what the keys alone would give

    @property
    def mode(self) -> StepMode:
        return StepMode.of(self.compile, self.graphs)


def torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def plan_step(cfg: Config, device: torch.device, distributed: bool, fused: bool) -> StepPlan:
    """The step's mode, decided once from ``train.compile``, ``train.cuda_graphs``,
    ``train.precision`` and ``train.activation_checkpointing`` for this device, process count
    and optimizer (``fused``: fused AdamW). ``train.cuda_graphs=on`` where graphs are
    impossible is a ConfigError. Checkpointed blocks with dropout are captured only
    uncompiled, and only on a torch that allows it (the module docstring says why)."""
    dtype = resolve_precision(cfg.train.precision, device)
    compile_ = resolve_compile(cfg.train.compile, device)
    graphs = resolve_graphs(cfg.train.cuda_graphs, device, dtype, distributed, fused)
    if not (graphs and cfg.train.activation_checkpointing and cfg.model.dropout > 0):
        return StepPlan(compile_, graphs)
    if torch_version() < CHECKPOINT_CAPTURE_TORCH:
        need = ".".join(map(str, CHECKPOINT_CAPTURE_TORCH))
        if cfg.train.cuda_graphs == "on":
            raise ConfigError(f"train.cuda_graphs=on with train.activation_checkpointing needs "
                              f"torch >= {need} (this is {torch.__version__}); use --set "
                              f"train.cuda_graphs=auto")
        return StepPlan(compile_, False, f"the step is not captured as CUDA graphs: "
                        f"checkpointed blocks with dropout need torch >= {need} inside a capture")
    if not compile_:
        return StepPlan(False, True)
    return StepPlan(False, True, "the transformer blocks run uncompiled inside the CUDA graphs: "
                    "activation checkpointing recomputes their dropout, which only eager blocks "
                    "replay exactly in a capture (set train.cuda_graphs=off to compile them)")
