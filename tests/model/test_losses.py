"""Losses: exact masking, the Fourier guided-attention penalty, and that a tiny model learns."""

from __future__ import annotations

import math

import pytest
import torch

from myxtts.config import ConfigError, TrainConfig, config_from_dict, load_config
from myxtts.model.decoder import fourier_features, normalised_positions
from myxtts.model.dummy import random_batch, randomize_weights
from myxtts.model.losses import compute_losses, guided_penalty, per_utterance_losses
from myxtts.model.xtts import build_model

N_MELS, N_TOKENS = 16, 40

pytestmark = pytest.mark.usefixtures("one_thread")


def small_cfg(**train):
    return config_from_dict({
        "audio": {"n_mels": N_MELS},
        "model": dict(d_model=32, n_heads=2, text_layers=1, decoder_layers=2, cond_layers=1,
                      cond_latents=4, prenet_dim=32, postnet_channels=16, postnet_layers=3,
                      frames_per_step=2),
        "train": train,
    })


def fake_outputs(batch, n_text, seed=0):
    gen = torch.Generator().manual_seed(seed)
    b, t, n = batch["mel"].shape
    s = -(-t // 2)
    attn = torch.rand(b, s, n_text, generator=gen).softmax(-1)
    feats = fourier_features(normalised_positions(batch["token_lengths"], n_text))
    return {
        "mel_pre": torch.randn(b, t, n, generator=gen),
        "mel_post": torch.randn(b, t, n, generator=gen),
        "mel_target": torch.randn(b, t, n, generator=gen),
        "stop_logits": torch.randn(b, t, generator=gen) * 3,
        "align_moments": attn @ feats,
        "step_lengths": (batch["mel_lengths"] + 1) // 2,
    }


def exact_guided(attn, token_lengths, step_lengths, sigma):
    """Reference: sum_n A[s, n] (1 - exp(-(p_n - q_s)^2 / (2 sigma^2))) per step, [B, S]."""
    p = normalised_positions(token_lengths, attn.shape[-1])  # [B, L]
    q = normalised_positions(step_lengths, attn.shape[1])  # [B, S]
    w = 1 - torch.exp(-((p[:, None, :] - q[:, :, None]) ** 2) / (2 * sigma**2))
    return (attn * w).sum(-1)


def test_losses_ignore_padding_exactly_and_match_a_naive_loop():
    cfg = TrainConfig(mel_l2_weight=0.5, stop_pos_weight=5.0, guided_attn_weight=2.0)
    batch = random_batch(N_MELS, N_TOKENS, [5, 9], [7, 12], [4, 4])
    out = fake_outputs(batch, 9)
    losses = compute_losses(out, batch, cfg)
    # garbage in every padded position of outputs and targets changes nothing
    noisy_out = {k: v.clone() for k, v in out.items()}
    noisy_batch = {k: v.clone() for k, v in batch.items()}
    for key in ("mel_pre", "mel_post", "mel_target", "stop_logits"):
        noisy_out[key][0, 7:] = 99.0
    noisy_out["align_moments"][0, 4:] = 99.0
    noisy_batch["stop_target"][0, 7:] = 0.0
    noisy_losses = compute_losses(noisy_out, noisy_batch, cfg)
    for k in losses:
        torch.testing.assert_close(noisy_losses[k], losses[k])
    # naive reference: loop over real frames only
    diffs_l1, diffs_l2, stops = [], [], []
    for b, n in enumerate(batch["mel_lengths"].tolist()):
        d_pre = out["mel_pre"][b, :n] - out["mel_target"][b, :n]
        d_post = out["mel_post"][b, :n] - out["mel_target"][b, :n]
        diffs_l1.append((d_pre.abs().flatten(), d_post.abs().flatten()))
        diffs_l2.append((d_pre**2 + d_post**2).flatten())
        x, y = out["stop_logits"][b, :n], batch["stop_target"][b, :n]
        stops.append(-(5.0 * y * torch.log(torch.sigmoid(x)) + (1 - y) * torch.log(torch.sigmoid(-x))))
    mel_l1 = torch.cat([a for a, _ in diffs_l1]).mean()
    post_l1 = torch.cat([p for _, p in diffs_l1]).mean()
    torch.testing.assert_close(losses["mel_l1"], mel_l1)
    torch.testing.assert_close(losses["post_l1"], post_l1)
    torch.testing.assert_close(losses["mel_l2"], torch.cat(diffs_l2).mean())
    torch.testing.assert_close(losses["stop"], torch.cat(stops).mean())
    total = mel_l1 + post_l1 + 0.5 * losses["mel_l2"] + losses["stop"] + 2.0 * losses["guided"]
    torch.testing.assert_close(losses["loss"], total)
    assert "mel_l2" not in compute_losses(out, batch, TrainConfig())


@pytest.mark.parametrize("sigma", [0.1, 0.2, 0.4, 0.6])
def test_fourier_guided_penalty_equals_the_explicit_one(sigma):
    batch = random_batch(N_MELS, N_TOKENS, [5, 9], [7, 12], [4, 4])
    out = fake_outputs(batch, 9, seed=3)
    gen = torch.Generator().manual_seed(1)
    attn = torch.rand(2, 6, 9, generator=gen).pow(4)
    attn[0, :, 5:] = 0  # no weight on padded text
    attn = attn / attn.sum(-1, keepdim=True)
    moments = attn @ fourier_features(normalised_positions(batch["token_lengths"], 9))
    penalty = guided_penalty(moments, out["step_lengths"], sigma)
    expected = exact_guided(attn, batch["token_lengths"], out["step_lengths"], sigma)
    torch.testing.assert_close(penalty, expected, atol=2e-4, rtol=0)


def test_guided_loss_prefers_the_diagonal():
    n_steps, n_text = 20, 10
    lengths_s, lengths_t = torch.tensor([n_steps]), torch.tensor([n_text])
    p = normalised_positions(lengths_t, n_text)[0]
    q = normalised_positions(lengths_s, n_steps)[0]
    feats = fourier_features(p)  # [L, 2K]

    def penalty(attn):
        return guided_penalty((attn @ feats)[None], lengths_s, 0.2).mean()

    diagonal = torch.softmax(-((q[:, None] - p[None]) ** 2) / 0.005, dim=-1)  # [S, L]
    anti = torch.softmax(-((1 - q[:, None] - p[None]) ** 2) / 0.005, dim=-1)
    uniform = torch.full((n_steps, n_text), 1 / n_text)
    assert penalty(diagonal) < 0.05
    assert penalty(diagonal) < penalty(uniform) < penalty(anti)
    assert penalty(anti) > 0.5


def test_model_guided_term_matches_its_explicit_attention():
    cfg = small_cfg(guided_attn_sigma=0.3)
    model = randomize_weights(build_model(cfg, N_TOKENS, 1, None, None).eval())
    batch = random_batch(N_MELS, N_TOKENS, [5, 9, 7], [11, 23, 17], [6, 12, 10])
    out = model(batch)
    per_utt = per_utterance_losses(out, batch, cfg.train)["guided"]
    attn = model.alignment(batch)  # [B, S, L]
    steps = out["step_lengths"]
    exact = exact_guided(attn, batch["token_lengths"], steps, 0.3)
    real = torch.arange(attn.shape[1])[None] < steps[:, None]
    expected = (exact * real).sum(1) / steps
    torch.testing.assert_close(per_utt, expected, atol=1e-4, rtol=0)


def test_unsupported_sigma_is_refused_by_the_config_and_the_loss():
    with pytest.raises(ConfigError, match=r"train.guided_attn_sigma must be in \[0.1, 0.6\].*0.05"):
        load_config(overrides=["train.guided_attn_sigma=0.05"])
    batch = random_batch(N_MELS, N_TOKENS, [5], [7], [4])  # built around the config check
    with pytest.raises(ValueError, match="sigma=0.05 is outside"):
        compute_losses(fake_outputs(batch, 5), batch, TrainConfig(guided_attn_sigma=0.05))


@pytest.mark.slow
def test_training_step_traces_to_one_graph():
    """torch.compile precondition: no host syncs or data-dependent branches (graph breaks)."""
    cfg = small_cfg()
    model = build_model(cfg, N_TOKENS, 1, None, None).train()
    batch = random_batch(N_MELS, N_TOKENS, [5, 9], [11, 16], [6, 8])

    def step(b):
        return compute_losses(model(b), b, cfg.train)["loss"]

    explanation = torch._dynamo.explain(step)(batch)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


@pytest.mark.slow
def test_tiny_model_overfits_one_batch():
    cfg = small_cfg()
    torch.manual_seed(0)
    model = build_model(cfg, N_TOKENS, 1, None, None).train()
    batch = random_batch(N_MELS, N_TOKENS, [6, 9], [14, 20], [8, 8])
    # a smooth, learnable target: a few sinusoids over time and frequency
    t = torch.arange(20)[:, None].float()
    f = torch.arange(N_MELS)[None].float()
    mel = torch.sin(0.3 * t + 0.5 * f) + torch.cos(0.11 * t * (f + 1) / N_MELS)
    batch["mel"] = torch.stack([mel, mel.flip(0)]) * (
        torch.arange(20)[None] < batch["mel_lengths"][:, None])[..., None]
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    first = None
    for _ in range(100):
        losses = compute_losses(model(batch), batch, cfg.train)
        opt.zero_grad()
        losses["loss"].backward()
        opt.step()
        first = first if first is not None else {k: v.item() for k, v in losses.items()}
    model.eval()
    final = compute_losses(model(batch), batch, cfg.train)
    assert final["mel_l1"].item() < first["mel_l1"] / 5
    assert final["post_l1"].item() < first["post_l1"] / 5
    assert final["stop"].item() < first["stop"] / 10
    assert final["loss"].item() < first["loss"] / 5
    assert math.isfinite(final["loss"].item())
