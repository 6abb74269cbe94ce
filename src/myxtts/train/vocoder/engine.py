"""The vocoder's training engine: generator, discriminators, their two AdamW optimizers and
compile, behind the same surface as the TTS engine (``train.engine.TrainEngine``): ``step``,
``read``, ``state_dict`` / ``load_state_dict``, ``evaluating``.

One GAN step: discriminators, then generator, no host sync.

Why this order (HiFi-GAN, Vocos): the discriminators learn from the generator's current
output (detached), then the generator is updated against them with mel L1 (+ multi-resolution
STFT) for content and least-squares adversarial + feature-matching losses for fine structure.
Before ``vocoder.disc_start`` only reconstruction trains, so the discriminators start on
plausible audio. Loss terms are summed on the device and read once per log interval
(``read``). Precision: bf16 autocast where native, else fp32; fp16 is refused (loss scaling
with two adversarial optimizers is fragile, and this small model fits fp32). The iSTFT, the
mel and the STFT losses always run in float32.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any

import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.artifacts import vocoder as vck
from myxtts.audio.mel import MelSpectrogram
from myxtts.config import Config, ConfigError
from myxtts.model.vocoder.losses import (
    MultiResolutionSTFTLoss,
    discriminator_loss,
    feature_matching_loss,
    generator_adv_loss,
    mel_l1,
)
from myxtts.train.engine import StepMode, lr_factor, native_bf16, resolve_compile

LOSS_KEYS = ("loss", "mel_l1", "stft", "adv", "fm", "disc")


def vocoder_precision(precision: str, device: torch.device) -> torch.dtype:
    """``train.precision`` for the vocoder: auto = bf16 on GPUs that compute it natively,
    else fp32; fp16 is refused with the reason."""
    if precision == "fp16":
        raise ConfigError("train.precision=fp16 is not supported for the vocoder (GAN training "
                          "with fp16 loss scaling is unstable); use bf16 or fp32")
    if precision == "bf16":
        return torch.bfloat16
    if precision == "fp32" or device.type != "cuda":
        return torch.float32
    with torch.cuda.device(device):
        return torch.bfloat16 if native_bf16() else torch.float32


def _adamw(params: Any, cfg: Config, device: torch.device) -> torch.optim.Optimizer:
    kw: dict[str, Any] = dict(lr=cfg.vocoder.lr, betas=(cfg.vocoder.beta1, cfg.vocoder.beta2),
                              weight_decay=0.0)
    if device.type == "cuda":
        kw["fused"] = True
    return torch.optim.AdamW(params, **kw)


class VocoderEngine:
    """``step(batch)`` trains on one batch {"mel" [B, N, n_mels], "wav" [B, N*hop]} already on
    ``device``; ``read()`` returns the mean loss terms since the last read. ``steps`` counts
    the steps taken (a checkpoint's progress step on resume): the schedule and
    ``vocoder.disc_start`` are functions of it."""

    def __init__(self, generator: torch.nn.Module, discriminators: torch.nn.Module, cfg: Config,
                 device: torch.device) -> None:
        self.cfg, self.device = cfg, device
        self.steps = 0
        self.gen, self.disc = generator, discriminators
        self.dtype = vocoder_precision(cfg.train.precision, device)
        self.opt_g = _adamw(generator.parameters(), cfg, device)
        self.opt_d = _adamw(discriminators.parameters(), cfg, device)
        self.mel = MelSpectrogram(cfg.audio).to(device)
        self.stft_loss = MultiResolutionSTFTLoss(cfg.audio).to(device)
        self.compiled = resolve_compile(cfg.train.compile, device)
        # One segment shape for the whole run: a plain compile, no dynamic shapes needed.
        self.gen_fn = torch.compile(generator) if self.compiled else generator
        self.disc_fn = torch.compile(discriminators) if self.compiled else discriminators
        self.sums = {k: torch.zeros((), device=device) for k in LOSS_KEYS}
        self.count = 0

    @property
    def model(self) -> torch.nn.Module:
        """The generator: what synthesis uses."""
        return self.gen

    @property
    def modules(self) -> list[torch.nn.Module]:
        """Every module whose weights a checkpoint saves (generator and discriminators)."""
        return [self.gen, self.disc]

    @property
    def mode(self) -> StepMode:
        return StepMode.of(self.compiled, graphed=False)

    def _autocast(self) -> Any:
        if self.dtype == torch.float32:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def _clip(self, module: torch.nn.Module) -> None:
        if self.cfg.train.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(module.parameters(), self.cfg.train.grad_clip,
                                           foreach=True)

    def step(self, batch: dict[str, torch.Tensor]) -> None:
        """One GAN step on ``batch`` (module docstring); no host sync."""
        step, v = self.steps, self.cfg.vocoder
        mel, real = batch["mel"], batch["wav"]
        gan = step >= v.disc_start  # a host int: no sync
        # The schedule is a function of the step (train.warmup_steps, cosine to
        # train.min_lr_ratio): nothing to save for resume, and it holds for both optimizers.
        lr = v.lr * lr_factor(step, self.cfg.train)
        for opt in (self.opt_g, self.opt_d):
            for group in opt.param_groups:
                group["lr"] = lr
        with self._autocast():
            fake = self.gen_fn(mel).float()  # [B, N*hop]
        zero = torch.zeros((), device=self.device)
        d_loss = zero
        if gan:
            with self._autocast():
                real_logits, _ = self.disc_fn(real)
                fake_logits, _ = self.disc_fn(fake.detach())
                d_loss = discriminator_loss(real_logits, fake_logits)
            self.opt_d.zero_grad(set_to_none=True)
            d_loss.backward()
            self._clip(self.disc)
            self.opt_d.step()
        mel_loss = mel_l1(self.mel, fake, real)
        stft = self.stft_loss(fake, real) if v.stft_weight > 0 else zero
        adv = fm = zero
        if gan:
            with self._autocast():
                with torch.no_grad():
                    _, real_feats = self.disc_fn(real)
                fake_logits, fake_feats = self.disc_fn(fake)
                adv = generator_adv_loss(fake_logits)
                fm = feature_matching_loss(real_feats, fake_feats)
        total = v.mel_weight * mel_loss + v.stft_weight * stft + v.adv_weight * adv + v.fm_weight * fm
        self.opt_g.zero_grad(set_to_none=True)
        total.backward()
        self._clip(self.gen)
        self.opt_g.step()
        with torch.no_grad():
            for k, value in zip(LOSS_KEYS, (total, mel_loss, stft, adv, fm, d_loss)):
                self.sums[k] += value.detach().float()
        self.count += 1
        self.steps += 1

    def read(self) -> dict[str, float]:
        """Mean of each loss term since the last read (the interval's one host sync)."""
        if self.count == 0:
            return {}
        values = torch.stack([self.sums[k] for k in LOSS_KEYS]).cpu().tolist()
        out = {k: val / self.count for k, val in zip(LOSS_KEYS, values)}
        for t in self.sums.values():
            t.zero_()
        self.count = 0
        out["lr"] = self.opt_g.param_groups[0]["lr"]
        return out

    @contextlib.contextmanager
    def evaluating(self) -> Iterator[None]:
        """Inside the ``with``: the generator in eval mode without gradients (validation,
        samples); train mode again on leaving."""
        training = self.gen.training
        self.gen.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            self.gen.train(training)

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint entries the engine owns (``artifacts.vocoder`` keys): weights, both
        optimizers and the random streams (``artifacts.checkpoint.rng_state``)."""
        return {vck.GENERATOR: self.gen.state_dict(), vck.DISCRIMINATORS: self.disc.state_dict(),
                vck.OPTIMIZERS: {"opt_g": self.opt_g.state_dict(),
                                 "opt_d": self.opt_d.state_dict()},
                ck.RNG: ck.rng_state(self.device)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a vocoder checkpoint: weights, both optimizers, the step count and
        the random streams."""
        self.gen.load_state_dict(state[vck.GENERATOR])
        self.disc.load_state_dict(state[vck.DISCRIMINATORS])
        self.opt_g.load_state_dict(state[vck.OPTIMIZERS]["opt_g"])
        self.opt_d.load_state_dict(state[vck.OPTIMIZERS]["opt_d"])
        self.steps = ck.TrainingProgress.from_state_dict(state[ck.PROGRESS]).step
        ck.restore_rng(state, self.device)
