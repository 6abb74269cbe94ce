"""Model FLOPs: counted matmuls and attention, once per batch shape, without touching training."""

from __future__ import annotations

import pytest
import torch

from myxtts.model.dummy import random_batch
from myxtts.observe.flops import StepFlops, achieved_tflops, batch_key, count_flops, mfu


def test_counts_matmuls_forward_and_backward():
    lin = torch.nn.Linear(16, 8, bias=False)
    x = torch.randn(4, 16)
    assert count_flops(lambda: lin(x)) == 2 * 4 * 16 * 8
    # backward adds the weight gradient (the input needs none): twice the forward
    assert count_flops(lambda: lin(x).sum().backward()) == 2 * (2 * 4 * 16 * 8)


def test_attention_is_counted_whatever_kernel_the_device_would_pick():
    q, k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 7, 4), torch.randn(2, 3, 7, 4)
    flops = count_flops(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v))
    assert flops == 2 * (2 * 2 * 3 * 5 * 7 * 4)  # Q K^T and weights x V


def test_step_flops_counts_each_shape_once_and_leaves_no_gradients():
    lin = torch.nn.Linear(80, 80)
    calls = []

    def loss_fn(batch):
        calls.append(batch_key(batch))
        return {"loss": lin(batch["mel"]).square().mean()}

    flops = StepFlops(loss_fn, lambda: lin.zero_grad(set_to_none=True))
    a = random_batch(80, 30, [5, 7], [10, 12], [4, 4])
    b = random_batch(80, 30, [5, 7, 3], [10, 12, 9], [4, 4, 4])
    fa, fb = flops(a), flops(b)
    assert flops(a) == fa and len(calls) == 2  # cached: the shape is counted once
    assert fb > fa and lin.weight.grad is None  # counting left no gradient behind
    assert flops.total([batch_key(a), batch_key(b), batch_key(a)]) == 2 * fa + fb


def test_utilisation_figures():
    assert achieved_tflops(3e12, 2.0) == pytest.approx(1.5)
    assert mfu(3e12, 2.0, peak_tflops=15.0) == pytest.approx(0.1)
    assert achieved_tflops(1.0, 0.0) == 0.0
    with pytest.raises(ValueError, match="peak_tflops"):
        mfu(1.0, 1.0, 0.0)
