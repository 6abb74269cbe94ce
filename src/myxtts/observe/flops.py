"""Model FLOPs per training step and the utilisation they imply (achieved TFLOP/s, MFU).

Why count rather than estimate: the XTTS step mixes attention over three sequence lengths
(text, reference latents, mel steps), convolutions and a self-fed second decoder pass; a
closed-form "6 x parameters x tokens" is off by a different factor for every bucket shape.
``torch.utils.flop_counter.FlopCounterMode`` counts the matmuls and convolutions the step
actually runs. Counting costs one extra eager forward + backward, so it is done once per
bucket shape and cached: a training epoch has at most ``data.num_buckets`` shapes.

Attention is counted through the math SDPA kernel: the flash and memory-efficient
kernels are not counted the same way on every device and torch version, and MFU is
defined on the model's FLOPs, not on what a given kernel happens to recompute.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch


def count_flops(fn: Callable[[], object]) -> float:
    """FLOPs of everything ``fn()`` runs (matmuls, convolutions, attention via math SDPA)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    with sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as counter:
        fn()
    return float(counter.get_total_flops())


def batch_key(batch: dict[str, torch.Tensor]) -> tuple[int, int, int]:
    """``(B, L_text, T_mel)``: a batch's padded shape, read from tensor metadata (no sync)."""
    return (int(batch["tokens"].shape[0]), int(batch["tokens"].shape[1]), int(batch["mel"].shape[1]))


class StepFlops:
    """Forward + backward FLOPs of a training step, counted once per batch shape.

    ``loss_fn(batch)`` returns the loss dict of one micro-batch (``TrainStep.loss``);
    ``zero_grad()`` drops the gradients the counting backward left behind, so a count
    between two optimizer steps never changes training.
    """

    def __init__(self, loss_fn: Callable[[dict], dict], zero_grad: Callable[[], None]) -> None:
        self.loss_fn, self.zero_grad = loss_fn, zero_grad
        self.by_shape: dict[Hashable, float] = {}

    def __call__(self, batch: dict[str, torch.Tensor]) -> float:
        key = batch_key(batch)
        if key not in self.by_shape:
            self.by_shape[key] = count_flops(lambda: self.loss_fn(batch)["loss"].backward())
            self.zero_grad()
        return self.by_shape[key]

    def total(self, keys: list[Hashable]) -> float:
        """FLOPs of steps over batches of these (already counted) shapes."""
        return sum(self.by_shape[k] for k in keys)


def achieved_tflops(flops: float, seconds: float) -> float:
    return flops / seconds / 1e12 if seconds > 0 else 0.0


def mfu(flops: float, seconds: float, peak_tflops: float) -> float:
    """Model FLOPs utilisation: achieved FLOP/s over the device's peak at this precision."""
    if peak_tflops <= 0:
        raise ValueError(f"peak_tflops must be > 0, got {peak_tflops}")
    return achieved_tflops(flops, seconds) / peak_tflops
