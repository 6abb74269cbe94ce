"""Training losses of the XTTS model, exact about padding and free of host syncs.

Every term is a sum over *real* elements divided by their count, per utterance
(``per_utterance_losses``: validation, tests) or over the batch (``compute_losses``,
frame-weighted: training). No ``.item()`` and no branching on tensor values, so the step
compiles into one static graph per batch shape. Terms, in the normalised mel domain: masked
L1 of decoder and postnet outputs, optional masked MSE (``train.mel_l2_weight``), masked BCE
of the stop logits (``train.stop_pos_weight``), and guided attention (Tachibana et al. 2017)
from the decoder's Fourier moments (``myxtts.model.decoder``). ``loss = mel_l1 + post_l1 +
mel_l2_weight * mel_l2 + stop + guided_attn_weight * guided``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from myxtts.config import GUIDED_SIGMA_RANGE, TrainConfig
from myxtts.model.decoder import GUIDED_PERIOD, fourier_features, normalised_positions
from myxtts.model.layers import lengths_to_mask


def gaussian_cosine_coefficients(sigma: float, n_terms: int, device: torch.device | None = None
                                 ) -> tuple[float, Tensor]:
    """Cosine-series coefficients of exp(-d^2 / (2 sigma^2)) on |d| <= 1 (half-period P).

    Closed form (the Gaussian's Fourier transform): a_0 = sigma*sqrt(2 pi) / (2P),
    a_k = sigma*sqrt(2 pi) / P * exp(-(w_k sigma)^2 / 2), w_k = k pi / P. Periodisation
    error is exp(-(2P - 1)^2 / (2 sigma^2)) and truncation error ~exp(-(w_K sigma)^2 / 2),
    both < 1e-4 for sigma in ``config.GUIDED_SIGMA_RANGE`` (the config refuses other values).
    """
    lo, hi = GUIDED_SIGMA_RANGE
    if not lo <= sigma <= hi:
        raise ValueError(f"sigma={sigma} is outside [{lo}, {hi}], where this series is exact")
    scale = sigma * math.sqrt(2 * math.pi) / GUIDED_PERIOD
    w = torch.arange(1, n_terms + 1, device=device, dtype=torch.float32) * (math.pi / GUIDED_PERIOD)
    return scale / 2, scale * torch.exp(-0.5 * (w * sigma) ** 2)


def guided_penalty(moments: Tensor, step_lengths: Tensor, sigma: float) -> Tensor:
    """moments [B, S, 2K] = [E cos(w_k p), E sin(w_k p)] -> penalty [B, S] = 1 - E[G(p - q)],
    q = (s + 0.5) / S_b the normalised decoder position of step s in utterance b."""
    n_terms = moments.shape[-1] // 2
    a0, a = gaussian_cosine_coefficients(sigma, n_terms, moments.device)  # float, [K]
    q_feats = fourier_features(normalised_positions(step_lengths, moments.shape[1]))  # [B,S,2K]
    # cos(w(p - q)) = cos(wp)cos(wq) + sin(wp)sin(wq): one product over all 2K channels
    expected_g = a0 + (moments.float() * q_feats * torch.cat([a, a])).sum(-1)  # [B, S]
    return 1.0 - expected_g


def _masked_sum(x: Tensor, mask: Tensor) -> Tensor:
    """x [B, T, ...] summed over real (mask [B, T]) elements per utterance -> [B]."""
    while mask.dim() < x.dim():
        mask = mask[..., None]
    return (x * mask.to(x.dtype)).flatten(1).sum(1)


def loss_sums(outputs: dict[str, Tensor], batch: dict[str, Tensor], train_cfg: TrainConfig
              ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Per-utterance sums [B] of every term and the element counts [B] they average over."""
    mel_lengths = batch["mel_lengths"]
    pre, post, target = outputs["mel_pre"].float(), outputs["mel_post"].float(), outputs["mel_target"]
    b, t, n_mels = target.shape
    frames = lengths_to_mask(mel_lengths, t)  # [B, T]
    n_frames = frames.sum(1).float()  # [B]
    sums = {
        "mel_l1": _masked_sum((pre - target).abs(), frames),
        "post_l1": _masked_sum((post - target).abs(), frames),
    }
    counts = {"mel_l1": n_frames * n_mels, "post_l1": n_frames * n_mels}
    if train_cfg.mel_l2_weight > 0:
        sums["mel_l2"] = _masked_sum((pre - target) ** 2 + (post - target) ** 2, frames)
        counts["mel_l2"] = n_frames * n_mels
    # new_full launches a fill kernel; torch.tensor(x, device=cuda) would copy from the host
    # and synchronise the stream every step (and cannot be captured in a CUDA graph)
    pos_weight = target.new_full((), train_cfg.stop_pos_weight)
    stop = F.binary_cross_entropy_with_logits(outputs["stop_logits"].float(), batch["stop_target"],
                                              pos_weight=pos_weight, reduction="none")  # [B, T]
    sums["stop"], counts["stop"] = _masked_sum(stop, frames), n_frames
    moments, step_lengths = outputs["align_moments"], outputs["step_lengths"]
    steps = lengths_to_mask(step_lengths, moments.shape[1])  # [B, S]
    penalty = guided_penalty(moments, step_lengths, train_cfg.guided_attn_sigma)  # [B, S]
    sums["guided"], counts["guided"] = _masked_sum(penalty, steps), steps.sum(1).float()
    return sums, counts


def _total(terms: dict[str, Tensor], train_cfg: TrainConfig) -> Tensor:
    total = terms["mel_l1"] + terms["post_l1"] + terms["stop"]
    total = total + train_cfg.guided_attn_weight * terms["guided"]
    if "mel_l2" in terms:
        total = total + train_cfg.mel_l2_weight * terms["mel_l2"]
    return total


def compute_losses(outputs: dict[str, Tensor], batch: dict[str, Tensor], train_cfg: TrainConfig
                   ) -> dict[str, Tensor]:
    """Batch losses (0-dim float32 tensors): 'loss' (weighted total), 'mel_l1', 'post_l1',
    'stop', 'guided' and 'mel_l2' when train.mel_l2_weight > 0. Each term is averaged over all
    real elements of the batch (frame-weighted), so padding never counts."""
    sums, counts = loss_sums(outputs, batch, train_cfg)
    terms = {k: sums[k].sum() / counts[k].sum().clamp(min=1.0) for k in sums}
    terms["loss"] = _total(terms, train_cfg)
    return terms


def per_utterance_losses(outputs: dict[str, Tensor], batch: dict[str, Tensor],
                         train_cfg: TrainConfig) -> dict[str, Tensor]:
    """Same terms as ``compute_losses`` but one value per utterance: each [B]."""
    sums, counts = loss_sums(outputs, batch, train_cfg)
    terms = {k: sums[k] / counts[k].clamp(min=1.0) for k in sums}
    terms["loss"] = _total(terms, train_cfg)
    return terms
