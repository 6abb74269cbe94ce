"""Free-running generation: KV cache == recomputation, batch invariance, stop and length guard."""

from __future__ import annotations

import pytest
import torch

from myxtts.config import config_from_dict
from myxtts.data.batch import crop
from myxtts.model.dummy import random_batch, randomize_weights
from myxtts.model.xtts import XTTS, build_model

N_MELS, N_TOKENS = 16, 40
NEVER = 1.0  # a stop threshold no probability exceeds

pytestmark = pytest.mark.usefixtures("one_thread")


def make_model(frames_per_step: int = 2, seed: int = 0) -> XTTS:
    cfg = config_from_dict({
        "audio": {"n_mels": N_MELS},
        "model": dict(d_model=32, n_heads=2, text_layers=1, decoder_layers=2, cond_layers=1,
                      cond_latents=4, prenet_dim=32, postnet_channels=16, postnet_layers=3,
                      frames_per_step=frames_per_step, max_decoder_frames=40),
    })
    mean, std = torch.linspace(-6, -2, N_MELS), torch.linspace(1.0, 2.0, N_MELS)
    return randomize_weights(build_model(cfg, N_TOKENS, 1, mean, std).eval(), seed)


def inputs(batch):
    return (batch["tokens"], batch["token_lengths"], batch["language_ids"], batch["ref_mel"],
            batch["ref_lengths"])


BATCH = random_batch(N_MELS, N_TOKENS, [5, 9, 7], [2, 2, 2], [6, 12, 10])


def test_kv_cache_generation_equals_full_recomputation():
    for r in (1, 3):
        model = make_model(frames_per_step=r)
        n_frames = 13  # not a multiple of 3: the last group is cropped
        gen = model.generate_frames(*inputs(BATCH), max_frames=n_frames, stop_threshold=NEVER,
                                    prenet_dropout=False)
        assert gen["mel_pre"].shape == (3, n_frames, N_MELS)
        assert gen["lengths"].tolist() == [n_frames] * 3
        # teacher-force the generated frames: every step must be reproduced from scratch
        forced = dict(BATCH, mel=model.denormalize(gen["mel_pre"]),
                      mel_lengths=torch.full((3,), n_frames),
                      stop_target=torch.zeros(3, n_frames))
        out = model(forced, prenet_dropout=False)
        torch.testing.assert_close(out["mel_pre"], gen["mel_pre"], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(out["stop_logits"], gen["stop_logits"], atol=1e-4, rtol=1e-4)
        mel, lengths = model.generate(*inputs(BATCH), max_frames=n_frames, stop_threshold=NEVER,
                                      prenet_dropout=False)
        torch.testing.assert_close(mel, model.denormalize(out["mel_post"]), atol=1e-4, rtol=1e-4)


def test_generation_is_batch_invariant():
    model = make_model()
    mel, lengths = model.generate(*inputs(BATCH), max_frames=12, stop_threshold=NEVER,
                                  prenet_dropout=False)
    for i in range(3):
        mel1, len1 = model.generate(*inputs(crop(BATCH, i)), max_frames=12,
                                    stop_threshold=NEVER, prenet_dropout=False)
        assert len1.tolist() == [lengths[i].item()]
        torch.testing.assert_close(mel1[0], mel[i, : int(len1[0])], atol=1e-4, rtol=1e-4)


def test_prenet_dropout_is_on_at_inference_by_default():
    model = make_model()
    torch.manual_seed(0)
    a, _ = model.generate(*inputs(BATCH), max_frames=6, stop_threshold=NEVER)
    b, _ = model.generate(*inputs(BATCH), max_frames=6, stop_threshold=NEVER)
    assert not torch.allclose(a, b)
    c, _ = model.generate(*inputs(BATCH), max_frames=6, stop_threshold=NEVER, prenet_dropout=False)
    d, _ = model.generate(*inputs(BATCH), max_frames=6, stop_threshold=NEVER, prenet_dropout=False)
    assert torch.equal(c, d)


def test_max_length_guard_and_default():
    model = make_model()
    mel, lengths = model.generate(*inputs(BATCH), max_frames=7, stop_threshold=NEVER,
                                  prenet_dropout=False)
    assert mel.shape == (3, 7, N_MELS) and lengths.tolist() == [7, 7, 7]
    _, lengths = model.generate(*inputs(BATCH), stop_threshold=NEVER, prenet_dropout=False)
    assert lengths.tolist() == [40, 40, 40]  # model.max_decoder_frames


def test_stop_threshold_is_honoured():
    model = make_model()
    gen = model.generate_frames(*inputs(BATCH), max_frames=20, stop_threshold=1e-9,
                                prenet_dropout=False)
    assert gen["lengths"].tolist() == [1, 1, 1]  # the first frame already "fires"
    assert gen["mel_pre"].shape[1] == 2  # and decoding ended after one step


def test_each_utterance_stops_on_its_own(monkeypatch):
    """Scripted stop logits: utterance b fires at frame stop_at[b]; lengths freeze there, the
    others keep decoding unchanged, and the loop ends once all have stopped."""
    model = make_model()
    reference, _ = model.generate(*inputs(BATCH), max_frames=12, stop_threshold=NEVER,
                                  prenet_dropout=False)
    original = model.decoder.step
    stop_at = torch.tensor([4, 9, 2])  # frame indices; r = 2 -> steps 2, 4, 1
    calls = []

    def scripted(prev, cache, pos, prenet_dropout):
        mel, stop = original(prev, cache, pos, prenet_dropout)
        calls.append(pos)
        frames = pos * 2 + torch.arange(2)  # [r]
        fire = frames[None, :] == stop_at[:, None]  # [B, r]
        return mel, torch.where(fire, 10.0, -10.0)

    monkeypatch.setattr(model.decoder, "step", scripted)
    mel, lengths = model.generate(*inputs(BATCH), max_frames=40, prenet_dropout=False)
    assert lengths.tolist() == [5, 10, 3]
    assert calls == [0, 1, 2, 3, 4]  # stopped after the last utterance's stop step
    assert mel.shape == (3, 10, N_MELS)
    for i, n in enumerate(lengths.tolist()):
        assert mel[i, n:].abs().sum() == 0
    # frames before each stop are the un-stopped decoding's, beyond the postnet's reach (6)
    torch.testing.assert_close(mel[1, :4], reference[1, :4], atol=1e-5, rtol=1e-5)

    calls.clear()
    _, lengths = model.generate(*inputs(BATCH), max_frames=7, prenet_dropout=False)
    assert lengths.tolist() == [5, 7, 3]  # utterance 1 would stop at 10 but the guard is 7
