"""XTTS teacher-forced pass: shapes, padding invariance, causality, checkpoints, sizes."""

from __future__ import annotations

import io

import pytest
import torch

from myxtts.config import config_from_dict
from myxtts.data.batch import crop
from myxtts.model.dummy import random_batch, randomize_weights
from myxtts.model.losses import per_utterance_losses
from myxtts.model.xtts import XTTS, build_model, count_parameters

N_MELS, N_TOKENS = 16, 40

pytestmark = pytest.mark.usefixtures("one_thread")


def small_cfg(**model):
    m = dict(d_model=32, n_heads=2, text_layers=1, decoder_layers=2, cond_layers=1,
             cond_latents=4, prenet_dim=32, postnet_channels=16, postnet_layers=3,
             frames_per_step=2, max_decoder_frames=40)
    m.update(model)
    return config_from_dict({"audio": {"n_mels": N_MELS}, "text": {"languages": ["en", "fa"]},
                             "model": m})


def make_model(cfg=None, seed=0) -> XTTS:
    cfg = cfg or small_cfg()
    mean, std = torch.linspace(-6, -2, N_MELS), torch.linspace(1.0, 2.0, N_MELS)
    model = build_model(cfg, N_TOKENS, 2, mean, std).eval()
    return randomize_weights(model, seed)


def batch3(**kw):
    # lengths chosen so the first utterance is the shortest in every dimension and T is odd
    return random_batch(N_MELS, N_TOKENS, [5, 9, 7], [11, 23, 17], [6, 12, 10], n_languages=2,
                        **kw)


def test_forward_shapes_and_domains():
    model, batch = make_model(), batch3()
    out = model(batch)
    b, t = 3, 23
    assert out["mel_pre"].shape == out["mel_post"].shape == out["mel_target"].shape == (b, t, N_MELS)
    assert out["stop_logits"].shape == (b, t)
    assert out["align_moments"].shape[:2] == (b, 12)  # ceil(23 / 2) steps
    assert out["step_lengths"].tolist() == [6, 12, 9]
    # the target is the normalised mel, zero on padding
    expected = (batch["mel"][1] - model.mel_mean) / model.mel_std
    torch.testing.assert_close(out["mel_target"][1], expected)
    assert out["mel_target"][0, 11:].abs().sum() == 0


def test_padding_invariance_outputs_and_losses():
    model, batch = make_model(), batch3()
    cfg = small_cfg()
    out = model(batch)
    per_utt = per_utterance_losses(out, batch, cfg.train)
    for i in range(3):
        one = crop(batch, i)
        out1 = model(one)
        n, s = int(batch["mel_lengths"][i]), int(out["step_lengths"][i])
        for key in ("mel_pre", "mel_post", "mel_target", "stop_logits"):
            torch.testing.assert_close(out1[key][0, :n], out[key][i, :n], atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(out1["align_moments"][0, :s], out["align_moments"][i, :s],
                                   atol=2e-5, rtol=1e-4)
        losses1 = per_utterance_losses(out1, one, cfg.train)
        for key, value in per_utt.items():
            torch.testing.assert_close(losses1[key][0], value[i], atol=2e-5, rtol=1e-4)


def test_padding_content_is_ignored():
    """Garbage in padded tokens / frames / reference frames changes no real output."""
    model, batch = make_model(), batch3()
    out = model(batch)
    noisy = {k: v.clone() for k, v in batch.items()}
    for key, lengths in (("mel", "mel_lengths"), ("ref_mel", "ref_lengths")):
        pad = torch.arange(noisy[key].shape[1])[None] >= noisy[lengths][:, None]
        noisy[key][pad] = 37.0
    pad = torch.arange(noisy["tokens"].shape[1])[None] >= noisy["token_lengths"][:, None]
    noisy["tokens"][pad] = 7
    out2 = model(noisy)
    real = torch.arange(23)[None] < batch["mel_lengths"][:, None]
    for key in ("mel_pre", "mel_post", "stop_logits"):
        torch.testing.assert_close(out2[key][real], out[key][real], atol=1e-5, rtol=1e-5)


def test_decoder_is_causal():
    model, batch = make_model(), batch3()
    r, t0 = 2, 13
    changed = {k: v.clone() for k, v in batch.items()}
    changed["mel"][:, t0:] += torch.randn_like(changed["mel"][:, t0:]) * 3
    out, out2 = model(batch), model(changed)
    safe = (t0 // r + 1) * r  # frames predicted from inputs < t0 only
    torch.testing.assert_close(out2["mel_pre"][:, :safe], out["mel_pre"][:, :safe])
    torch.testing.assert_close(out2["stop_logits"][:, :safe], out["stop_logits"][:, :safe])
    assert not torch.allclose(out2["mel_pre"][1, safe:], out["mel_pre"][1, safe:])
    # the postnet looks (layers * kernel // 2) frames ahead of its input
    margin = 3 * (5 // 2)
    torch.testing.assert_close(out2["mel_post"][:, : safe - margin], out["mel_post"][:, : safe - margin])


def test_state_dict_round_trip_gives_identical_outputs():
    model, batch = make_model(seed=0), batch3()
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    assert "mel_mean" in state and "mel_std" in state  # normalisation travels with the weights
    other = make_model(seed=1)
    other.mel_mean.zero_()
    other.load_state_dict(state)
    a, b = model(batch), other(batch)
    for key in ("mel_pre", "mel_post", "stop_logits", "align_moments"):
        assert torch.equal(a[key], b[key])


def test_alignment_weights_are_text_distributions():
    model, batch = make_model(), batch3()
    align = model.alignment(batch)  # [B, S, L]
    assert align.shape == (3, 12, 9)
    torch.testing.assert_close(align.sum(-1), torch.ones(3, 12))
    assert align[0, :, 5:].abs().max() == 0  # padded text gets no attention


def test_prenet_dropout_switch():
    model, batch = make_model(), batch3()
    torch.manual_seed(0)
    a = model(batch, prenet_dropout=True)["mel_pre"]
    b = model(batch, prenet_dropout=True)["mel_pre"]
    assert not torch.allclose(a, b)  # dropout active although the model is in eval mode
    assert torch.equal(model(batch)["mel_pre"], model(batch)["mel_pre"])


def test_bad_mel_stats_shape_is_a_clear_error():
    with pytest.raises(ValueError, match=r"mel_mean/mel_std must have shape \[16\]"):
        build_model(small_cfg(), N_TOKENS, 2, torch.zeros(80), torch.ones(80))


def test_preset_parameter_counts():
    counts = {p: count_parameters(config_from_dict({"model": {"preset": p}}))
              for p in ("tiny", "small", "base")}
    assert 1.5e6 <= counts["tiny"] <= 4e6
    assert 20e6 <= counts["small"] <= 40e6
    assert 85e6 <= counts["base"] <= 115e6
    cfg = small_cfg()
    real = sum(p.numel() for p in build_model(cfg, 100, 2, None, None).parameters())
    assert count_parameters(cfg) == real


def test_self_feed_replaces_inputs_with_the_models_own_predictions():
    """Scheduled sampling: probability 0 is plain teacher forcing; probability 1 feeds every
    step the model's own prediction of the previous group, so a change to the ground truth
    at group k reaches the output one step later than under teacher forcing (k + 2, via the
    first pass's prediction of group k + 1), and the outputs differ from teacher forcing."""
    model, batch = make_model(), batch3()  # eval mode: no dropout, deterministic
    r, k = 2, 5
    teacher = model(batch)
    zero = model(batch, self_feed=torch.tensor(0.0))
    for key in ("mel_pre", "mel_post", "stop_logits"):
        assert torch.equal(zero[key], teacher[key])
    own = model(batch, self_feed=torch.tensor(1.0))
    assert not torch.allclose(own["mel_pre"][:, r:], teacher["mel_pre"][:, r:], atol=1e-3)
    # step 0 is fed the go frame either way
    torch.testing.assert_close(own["mel_pre"][:, :r], teacher["mel_pre"][:, :r])
    changed = {key: v.clone() for key, v in batch.items()}
    changed["mel"][:, k * r:] += torch.randn_like(changed["mel"][:, k * r:]) * 3
    own2 = model(changed, self_feed=torch.tensor(1.0))
    safe = (k + 2) * r  # steps 0..k+1 never see group k or later
    torch.testing.assert_close(own2["mel_pre"][:, :safe], own["mel_pre"][:, :safe])
    assert not torch.allclose(own2["mel_pre"][1, safe:], own["mel_pre"][1, safe:])
    # the target stays the ground truth
    assert torch.equal(own["mel_target"], teacher["mel_target"])


def test_frame_dropout_hides_the_ground_truth_inputs_in_training_only():
    """With (nearly) every input group dropped, the teacher-forced outputs no longer depend on
    the ground-truth frames; in eval mode frame dropout is off and they do."""
    cfg = small_cfg(frame_dropout=0.999, dropout=0.0, prenet_dropout=0.0)
    model, batch = make_model(cfg), batch3()
    changed = {k: v.clone() for k, v in batch.items()}
    changed["mel"] += torch.randn_like(changed["mel"]) * 3
    model.train()
    torch.manual_seed(0)
    a = model(batch)
    torch.manual_seed(0)
    b = model(changed)
    torch.testing.assert_close(a["mel_pre"], b["mel_pre"])
    model.eval()
    assert not torch.allclose(model(batch)["mel_pre"], model(changed)["mel_pre"])
