"""XTTS-v2's decode step replayed as a CUDA graph gives the codes and latents of the eager
step, and a failed capture leaves a working eager decode (GPU only)."""

from __future__ import annotations

import pytest
import torch

from myxtts.inference.xtts_v2 import decode, graphed
from myxtts.model.xtts_v2.config import XttsV2Args, XttsV2Config, XttsV2Sampling
from myxtts.model.xtts_v2.gpt import XttsGpt

pytestmark = pytest.mark.gpu


def _gpt() -> XttsGpt:
    torch.manual_seed(0)
    config = XttsV2Config(args=XttsV2Args(gpt_layers=2, gpt_n_model_channels=256, gpt_n_heads=4),
                          number_text_tokens=300, start_text_token=298, stop_text_token=0)
    return XttsGpt(config).cuda().eval()


def test_graphed_decoding_equals_eager_decoding(monkeypatch):
    gpt = _gpt()
    voice = torch.randn(1, 32, 256, device="cuda")
    tokens = torch.randint(3, 290, (1, 12), device="cuda")
    sampling = XttsV2Sampling(repetition_penalty=5.0)
    replays = []
    real = graphed.GraphedStep.__call__
    monkeypatch.setattr(graphed.GraphedStep, "__call__",
                        lambda self, c: replays.append(1) or real(self, c))
    with_graph = list(decode.stream_codes(gpt, voice, tokens, sampling, greedy=True, max_codes=24))
    assert len(replays) == len(with_graph) - 1  # every step after the prefill replayed
    monkeypatch.setattr(decode, "graphed_step", lambda *a: None)
    eager = list(decode.stream_codes(gpt, voice, tokens, sampling, greedy=True, max_codes=24))
    assert [int(c) for c, _ in with_graph] == [int(c) for c, _ in eager]
    torch.testing.assert_close(torch.stack([h for _, h in with_graph]),
                               torch.stack([h for _, h in eager]), rtol=0, atol=1e-4)


def test_a_failed_capture_falls_back_to_the_eager_step(monkeypatch):
    gpt = _gpt()
    voice = torch.randn(1, 32, 256, device="cuda")
    tokens = torch.randint(3, 290, (1, 12), device="cuda")
    expected = decode.generate_codes(gpt, voice, tokens, greedy=True, max_codes=16)

    def broken(*args, **kwargs):
        raise RuntimeError("capture refused")

    monkeypatch.setattr(torch.cuda, "CUDAGraph", broken)
    got = decode.generate_codes(gpt, voice, tokens, greedy=True, max_codes=16)
    assert torch.equal(got, expected)
    torch.randn(16, device="cuda")  # the device still works
    torch.cuda.synchronize()


def test_graphed_batched_pieces_equal_eager_batched_pieces(monkeypatch):
    """Rows of different text lengths (left-padded, the cache's ``keep`` mask in the graph)."""
    gpt = _gpt()
    voice = torch.randn(1, 32, 256, device="cuda")
    rows = [torch.randint(3, 290, (n,), device="cuda") for n in (12, 5, 9)]
    sampling = XttsV2Sampling(repetition_penalty=5.0)
    with_graph = decode.decode_pieces(gpt, voice, rows, sampling, greedy=True, max_codes=24)
    monkeypatch.setattr(decode, "graphed_step", lambda *a: None)
    eager = decode.decode_pieces(gpt, voice, rows, sampling, greedy=True, max_codes=24)
    for (codes, latents), (codes_eager, latents_eager) in zip(with_graph, eager):
        assert torch.equal(codes, codes_eager)
        torch.testing.assert_close(latents, latents_eager, rtol=0, atol=1e-4)
