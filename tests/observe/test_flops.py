"""Model FLOPs: counted matmuls and attention, once per batch shape, without touching training."""

from __future__ import annotations

import pytest
import torch

from myxtts.model.dummy import random_batch
from myxtts.observe.flops import (
    StepFlops,
    achieved_tflops,
    batch_key,
    count_flops,
    mfu,
    peak_tflops,
)


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


def test_step_flops_counts_each_shape_once():
    calls = []

    def count(key):
        calls.append(key)
        return float(key[0] * key[2])

    flops = StepFlops(count)
    a = random_batch(80, 30, [5, 7], [10, 12], [4, 4])
    b = random_batch(80, 30, [5, 7, 3], [10, 12, 9], [4, 4, 4])
    fa, fb = flops(a), flops(batch_key(b))
    assert flops(batch_key(a)) == fa == 24.0 and fb == 36.0
    assert calls == [(2, 7, 12), (3, 7, 12)]  # cached: each shape counted once
    assert flops.total([batch_key(a), batch_key(b), batch_key(a)]) == 2 * fa + fb
    assert len(calls) == 2


def test_peak_table_matches_the_most_specific_name():
    assert peak_tflops("NVIDIA H100 80GB HBM3", torch.bfloat16) == 989.0
    assert peak_tflops("NVIDIA H100 PCIe", torch.bfloat16) == 756.0
    assert peak_tflops("NVIDIA A100-SXM4-80GB", torch.float32) == 156.0  # TF32
    assert peak_tflops("NVIDIA GeForce RTX 4090", torch.float16) == 165.2
    assert peak_tflops("Tesla V100-SXM2-16GB", torch.float32) is None  # no TF32
    assert peak_tflops("Some Future GPU", torch.bfloat16) is None
    assert peak_tflops("NVIDIA L4", torch.bfloat16) == 121.0  # not taken for an L40
    assert peak_tflops("NVIDIA RTX A1000", torch.bfloat16) is None  # no A100
    assert peak_tflops("NVIDIA T400", torch.bfloat16) is None  # no T4


def test_utilisation_figures():
    assert achieved_tflops(3e12, 2.0) == pytest.approx(1.5)
    assert mfu(3e12, 2.0, peak_tflops=15.0) == pytest.approx(0.1)
    assert achieved_tflops(1.0, 0.0) == 0.0
    with pytest.raises(ValueError, match="peak_tflops"):
        mfu(1.0, 1.0, 0.0)
