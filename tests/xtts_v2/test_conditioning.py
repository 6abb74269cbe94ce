"""The voice conditioning's packed rows: rows of different lengths, one with a silent tail
kept as a single weighted frame, give each row's latents as a pass of that row alone over
every frame does, and the same gradients."""

from __future__ import annotations

import torch

from myxtts.model.xtts_v2.conditioning import MelStyleEncoder, PackedRows, PerceiverResampler


def _latents(encoder, perceiver, mel, packed=None):
    frames = encoder(mel, packed)
    if packed is None:
        return perceiver(frames.transpose(1, 2))
    rows = torch.nn.utils.rnn.pad_sequence(frames.split(packed.lengths), batch_first=True)
    weights = torch.nn.utils.rnn.pad_sequence(packed.weights.split(packed.lengths),
                                              batch_first=True)
    return perceiver(rows, weights)


def test_packed_rows_equal_each_row_alone_over_every_frame():
    torch.manual_seed(0)
    encoder, perceiver = MelStyleEncoder(80, 64, 4, blocks=2), PerceiverResampler(64, depth=1)
    g = torch.Generator().manual_seed(1)
    speech = torch.randn(80, 300, generator=g)
    short = torch.randn(80, 120, generator=g)
    silent = torch.randn(80, 1, generator=g)
    tailed = torch.cat([short, silent.expand(80, 180)], dim=1)  # 300 frames, 180 the same

    alone = [_latents(encoder, perceiver, m[None]) for m in (speech, tailed)]
    grads_alone = torch.autograd.grad(sum(a.square().sum() for a in alone),
                                      list(encoder.parameters()) + list(perceiver.parameters()))

    weights = [torch.ones(300), torch.cat([torch.ones(120), torch.tensor([180.0])])]
    packed = PackedRows.of(weights)
    assert packed.lengths == (300, 121) and packed.biases[0] is None
    mel = torch.cat([speech, short, silent], dim=1).t()  # [421, 80] frames first
    got = _latents(encoder, perceiver, mel, packed)
    grads = torch.autograd.grad(got.square().sum(),
                                list(encoder.parameters()) + list(perceiver.parameters()))

    torch.testing.assert_close(got, torch.cat(alone), rtol=0, atol=2e-5)
    # some gradients are zero but for rounding (a key's bias cannot move a softmax): each is
    # held to the scale of the largest
    scale = max(float(w.abs().max()) for w in grads_alone)
    for mine, want in zip(grads, grads_alone):
        torch.testing.assert_close(mine, want, rtol=1e-3, atol=1e-5 * scale)
