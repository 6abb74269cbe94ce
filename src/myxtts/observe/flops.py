"""Model FLOPs per training step and the utilisation they imply (achieved TFLOP/s, MFU).

Why count rather than estimate: the step mixes attention over three sequence lengths,
convolutions and a self-fed second decoder pass, so "6 x parameters x tokens" is off by a
different factor per bucket shape. ``FlopCounterMode`` counts what the step runs, once per
bucket shape, on a ``meta``-device copy of the model (``train.efficiency``): it computes and
allocates nothing and never touches the run's weights or random streams. Attention is counted
through the math SDPA kernel, as MFU is defined on the model's FLOPs, not on what a kernel
recomputes. :func:`peak_tflops` knows the dense tensor-core peaks of common NVIDIA GPUs;
``train.peak_tflops`` sets any other.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode


def count_flops(fn: Callable[[], object]) -> float:
    """FLOPs of everything ``fn()`` runs (matmuls, convolutions, attention via math SDPA)."""
    with sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as counter:
        fn()
    return float(counter.get_total_flops())


def batch_key(batch: dict[str, torch.Tensor]) -> tuple[int, int, int]:
    """``(B, L_text, T_mel)``: a batch's padded shape, read from tensor metadata (no sync)."""
    return (int(batch["tokens"].shape[0]), int(batch["tokens"].shape[1]), int(batch["mel"].shape[1]))


class StepFlops:
    """Forward + backward FLOPs of one micro-batch, counted once per shape key.

    ``count(key)`` counts the FLOPs of a micro-batch of that ``batch_key`` (in practice
    ``train.efficiency.meta_step_counter``); calling the object with a key or a batch
    returns the cached count."""

    def __init__(self, count: Callable[[Hashable], float]) -> None:
        self.count = count
        self.by_shape: dict[Hashable, float] = {}

    def __call__(self, key_or_batch: Hashable | dict[str, torch.Tensor]) -> float:
        key = batch_key(key_or_batch) if isinstance(key_or_batch, dict) else key_or_batch
        if key not in self.by_shape:
            self.by_shape[key] = float(self.count(key))
        return self.by_shape[key]

    def total(self, keys: list[Hashable]) -> float:
        """FLOPs of micro-batches of these shapes (each shape counted on first sight)."""
        return sum(self(k) for k in keys)


def achieved_tflops(flops: float, seconds: float) -> float:
    return flops / seconds / 1e12 if seconds > 0 else 0.0


def mfu(flops: float, seconds: float, peak_tflops: float) -> float:
    """Model FLOPs utilisation: achieved FLOP/s over the device's peak at this precision."""
    if peak_tflops <= 0:
        raise ValueError(f"peak_tflops must be > 0, got {peak_tflops}")
    return achieved_tflops(flops, seconds) / peak_tflops


# Dense (no sparsity) tensor-core peaks from NVIDIA's data sheets, TFLOP/s:
# (bf16/fp16 with fp32 accumulation, tf32). Matched as whole words of the device name,
# first match wins, so the more specific names come first.
PEAK_TFLOPS: list[tuple[str, float, float]] = [
    ("H200", 989.0, 494.0),
    ("H100 PCIe", 756.0, 378.0),
    ("H100 NVL", 835.0, 418.0),
    ("H100", 989.0, 494.0),  # SXM
    ("H800", 989.0, 494.0),
    ("GH200", 989.0, 494.0),
    ("A100", 312.0, 156.0),
    ("A800", 312.0, 156.0),
    ("L40S", 362.0, 183.0),
    ("L40", 181.0, 90.5),
    ("L4", 121.0, 60.0),
    ("A10", 125.0, 62.5),
    ("RTX 6000 Ada", 364.0, 182.0),
    ("RTX A6000", 155.0, 77.4),
    ("RTX 4090", 165.2, 82.6),
    ("RTX 4080", 97.5, 48.7),
    ("RTX 3090", 71.0, 35.6),
    ("V100", 125.0, 0.0),  # fp16 only: no bf16, no tf32
    ("T4", 65.0, 0.0),
]


def peak_tflops(device_name: str, dtype: torch.dtype) -> float | None:
    """The device's dense peak at this training precision, or None when unknown (a CPU, a
    GPU not in :data:`PEAK_TFLOPS`, or fp32 on a GPU without TF32: MFU is then not shown
    unless ``train.peak_tflops`` says it)."""
    for name, half, tf32 in PEAK_TFLOPS:  # whole words: an "RTX A1000" is no A100
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(name)}(?![A-Za-z0-9])", device_name, re.I):
            value = half if dtype in (torch.bfloat16, torch.float16) else tf32
            return value or None
    return None
