"""The GPT blocks' own dropout on the CPU: the share it zeroes, the scale of the rest, its
gradient, and the written-out attention it runs under (equal to SDPA's when nothing drops)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from myxtts.model.xtts_v2.blocks import GptStack, attention_with_dropout, dropout


def test_dropout_zeroes_a_share_p_and_scales_the_rest():
    torch.manual_seed(0)
    x = torch.full((400_000,), 2.0, requires_grad=True)
    y = dropout(x, 0.1, True)
    kept = y != 0
    # binomial: the share's standard deviation is ~5e-4 at this size
    assert abs(kept.float().mean().item() - 0.9) < 0.004
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 2.0 / 0.9))
    y.sum().backward()
    torch.testing.assert_close(x.grad, kept.float() / 0.9)
    assert dropout(x, 0.1, False) is x and dropout(x, 0.0, True) is x
    torch.manual_seed(1)
    a = dropout(torch.ones(1000), 0.5, True)
    torch.manual_seed(1)
    assert torch.equal(a, dropout(torch.ones(1000), 0.5, True))  # the global generator's


@pytest.mark.parametrize("padded", [False, True])
def test_attention_with_nothing_dropped_equals_sdpa(padded):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 9, 16, generator=g) for _ in range(3))
    mask = None
    if padded:  # row 1's last three keys are padding
        keys = torch.ones(2, 9, dtype=torch.bool)
        keys[1, 6:] = False
        mask = (torch.ones(9, 9, dtype=torch.bool).tril()[None] & keys[:, None, :])[:, None]
    # p below 2**-31 zeroes nothing and scales by 1 in float32
    got = attention_with_dropout(q, k, v, mask, 1e-10)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_stack_in_training_drops_and_in_eval_does_not():
    torch.manual_seed(0)
    stack = GptStack(32, 4, 2, dropout=0.1)
    x = torch.randn(2, 7, 32)
    stack.eval()
    with torch.no_grad():
        first, again = stack(x), stack(x)
    assert torch.equal(first, again)
    stack.train()
    with torch.no_grad():
        a, b = stack(x), stack(x)
    assert not torch.allclose(a, b)
    assert not torch.allclose(a, first)
