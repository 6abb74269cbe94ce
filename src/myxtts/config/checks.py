"""Values that type-check but cannot work: each refused with the key, the value and what
would be valid; and device settings resolved against the machine at hand."""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any

from myxtts.config.bounds import excerpt
from myxtts.config.sections import GUIDED_SIGMA_RANGE, Config, ConfigError, FreezePart

MAX_LR = 1.0  # Adam/AdamW learning rates above this move weights by more than their scale
MAX_SEED = 2**32 - 1  # numpy's generators take seeds in [0, 2**32)


def check_config(cfg: Config) -> None:
    """Reject impossible values, naming the key and what would be valid."""
    a, m, dt, t = cfg.audio, cfg.model, cfg.data, cfg.train
    _finite(cfg)

    def positive(section: str, obj: Any, *keys: str, allow_zero: bool = False) -> None:
        for k in keys:
            v = getattr(obj, k)
            if v < 0 or (v == 0 and not allow_zero):
                raise ConfigError(f"{section}.{k} must be {'>= 0' if allow_zero else '> 0'}, got {v}")

    positive("audio", a, "sample_rate", "n_fft", "hop_length", "win_length", "n_mels", "log_floor")
    positive("audio", a, "fmin", "trim_db", allow_zero=True)
    if a.win_length > a.n_fft:
        raise ConfigError(f"audio.win_length ({a.win_length}) must be <= audio.n_fft ({a.n_fft})")
    if a.hop_length > a.win_length:
        raise ConfigError(f"audio.hop_length ({a.hop_length}) must be <= audio.win_length ({a.win_length})")
    if a.fmax > a.sample_rate / 2:
        raise ConfigError(f"audio.fmax ({a.fmax}) must be <= sample_rate/2 ({a.sample_rate / 2})")
    if a.fmin >= a.fmax:
        raise ConfigError(f"audio.fmin ({a.fmin}) must be < audio.fmax ({a.fmax})")
    x = cfg.xtts
    positive("xtts", x, "text_loss_weight", "code_loss_weight", allow_zero=True)
    positive("xtts", x, "cond_min_s")
    if x.cond_min_s > x.cond_max_s:
        raise ConfigError(f"xtts.cond_min_s ({x.cond_min_s}) must be <= xtts.cond_max_s "
                          f"({x.cond_max_s})")
    if not cfg.text.languages:
        raise ConfigError("text.languages must name at least one language, e.g. [en]")
    if cfg.text.default_language not in cfg.text.languages:
        raise ConfigError(f"text.default_language {excerpt(cfg.text.default_language)} is not in "
                          f"text.languages {cfg.text.languages}")
    if not 0.0 <= dt.val_fraction < 1.0:
        raise ConfigError(f"data.val_fraction must be in [0, 1), got {dt.val_fraction}")
    positive("data", dt, "min_duration_s", "max_duration_s", "max_text_tokens", "refs_per_utterance",
             "ref_frames", "num_buckets")
    if dt.batch_frames != "auto":
        positive("data", dt, "batch_frames")
    if not 0.0 < dt.auto_batch_memory_share <= 1.0:
        raise ConfigError(f"data.auto_batch_memory_share is a share of GPU memory in (0, 1], got "
                          f"{dt.auto_batch_memory_share} (0.85 leaves room for fragmentation)")
    positive("data", dt, "max_batch_size", "prefetch_batches", "min_val_utterances",
             "max_val_utterances", allow_zero=True)
    if dt.num_workers < -1:
        raise ConfigError(f"data.num_workers must be -1 (auto) or >= 0, got {dt.num_workers}")
    if dt.min_duration_s >= dt.max_duration_s:
        raise ConfigError(f"data.min_duration_s ({dt.min_duration_s}) must be < data.max_duration_s "
                          f"({dt.max_duration_s})")
    if not (dt.data_device == "cpu" or dt.data_device.startswith("cuda")):
        raise ConfigError(f"data.data_device must be 'cpu' or 'cuda:N', got {excerpt(dt.data_device)}")
    if dt.ring_slots < 2:
        raise ConfigError(f"data.ring_slots must be >= 2 (one slot filled while one is trained "
                          f"on; 3 also overlaps the transfer), got {dt.ring_slots}")
    for key, share in (("data.data_device_memory_cap", dt.data_device_memory_cap),
                       ("train.device_memory_cap", t.device_memory_cap)):
        if not 0.0 <= share <= 1.0:
            raise ConfigError(f"{key} is a share of a GPU's memory in (0, 1], or 0 for no cap; "
                              f"got {share}")
    positive("model", m, "d_model", "n_heads", "ff_mult", "text_layers", "decoder_layers",
             "cond_layers", "cond_latents", "prenet_dim", "postnet_channels", "postnet_layers",
             "postnet_kernel", "frames_per_step", "max_decoder_frames")
    if m.d_model % m.n_heads:
        raise ConfigError(f"model.d_model ({m.d_model}) must be divisible by model.n_heads ({m.n_heads})")
    for k in ("dropout", "prenet_dropout", "frame_dropout"):
        if not 0.0 <= getattr(m, k) < 1.0:
            raise ConfigError(f"model.{k} must be in [0, 1), got {getattr(m, k)}")
    if not 0.0 < m.stop_threshold < 1.0:
        raise ConfigError(f"model.stop_threshold must be in (0, 1), got {m.stop_threshold}")
    positive("train", t, "max_steps", "lr", "grad_accum_steps", "log_every", "val_every",
             "ckpt_every", "guided_attn_sigma", "stop_pos_weight", "max_nonfinite_in_row",
             "eval_utterances")
    positive("train", t, "warmup_steps", "weight_decay", "grad_clip", "synth_every",
             "synth_sentences", "eval_every", "mel_l2_weight", "guided_attn_weight",
             "min_lr_ratio", "self_feed_after", "peak_tflops", allow_zero=True)
    if t.keep_last < 1:  # (a base-size checkpoint is ~1.7 GB: keeping "all" is never a default)
        raise ConfigError(f"train.keep_last is how many of the newest checkpoints stay, >= 1 "
                          f"(best.pt is kept besides), got {t.keep_last}")
    for key, seed in (("train.seed", t.seed), ("data.split_seed", dt.split_seed),
                      ("data.shuffle_seed", dt.shuffle_seed)):
        if not 0 <= seed <= MAX_SEED:
            raise ConfigError(f"{key} must be in [0, {MAX_SEED}], got {excerpt(str(seed))}")
    lo, hi = GUIDED_SIGMA_RANGE
    if not lo <= t.guided_attn_sigma <= hi:
        raise ConfigError(f"train.guided_attn_sigma must be in [{lo}, {hi}] (the range the guided "
                          f"loss supports; 0.2 is the usual value), got {t.guided_attn_sigma}")
    if set(t.freeze) >= set(typing.get_args(FreezePart)):
        raise ConfigError(f"train.freeze names every part of the model {t.freeze}: nothing "
                          f"would train; leave at least one out")
    if not 0.0 <= t.self_feed <= 1.0:
        raise ConfigError(f"train.self_feed is a probability in [0, 1], got {t.self_feed}")
    if not 0.0 <= t.ema_decay < 1.0:
        raise ConfigError(f"train.ema_decay must be in [0, 1) (0 = no weight average; 0.999 "
                          f"averages over about the last 1000 steps), got {t.ema_decay}")
    if not 0 <= t.beta1 < 1 or not 0 <= t.beta2 < 1:
        raise ConfigError(f"train.beta1/beta2 must be in [0, 1), got {t.beta1}, {t.beta2}")
    v = cfg.vocoder
    positive("vocoder", v, "dim", "ff_mult", "layers", "kernel", "disc_channels",
             "segment_frames", "batch_size", "lr")
    positive("vocoder", v, "mel_weight", "stft_weight", "fm_weight", "adv_weight", "disc_start",
             "projections", allow_zero=True)
    if v.kernel % 2 == 0:
        raise ConfigError(f"vocoder.kernel must be odd (a centred window of frames), got {v.kernel}")
    if not v.periods or any(p < 2 for p in v.periods):
        raise ConfigError(f"vocoder.periods must be a non-empty list of periods >= 2, got {v.periods}")
    if not 0 <= v.beta1 < 1 or not 0 <= v.beta2 < 1:
        raise ConfigError(f"vocoder.beta1/beta2 must be in [0, 1), got {v.beta1}, {v.beta2}")
    for key, lr in (("train.lr", t.lr), ("vocoder.lr", v.lr)):
        if lr > MAX_LR:  # a typo (3e4 for 3e-4) would diverge at the first step
            raise ConfigError(f"{key}={lr:g} is above {MAX_LR:g}: an Adam step moves each weight "
                              f"by about the learning rate, so training would diverge at once; "
                              f"usual values are 1e-4 to 1e-3")


def _finite(cfg: Config) -> None:
    """NaN or infinity in any number (``train.lr=nan`` type-checks as a float, then makes
    AdamW raise mid-run) is refused before anything runs; each range check below assumes
    finite numbers (a NaN passes every comparison it is not equal to)."""
    for section in dataclasses.fields(cfg):
        for f in dataclasses.fields(getattr(cfg, section.name)):
            value = getattr(getattr(cfg, section.name), f.name)
            values = value if isinstance(value, list) else [value]
            for v in values:
                if isinstance(v, float) and not math.isfinite(v):
                    raise ConfigError(f"{section.name}.{f.name} must be a finite number, got {v}")


def resolve_device(name: str, key: str) -> Any:
    """The ``torch.device`` a device setting names (``key``, e.g. ``train.device``): ``auto``
    is the current CUDA GPU when one is visible, else the CPU. A CUDA device on a machine
    without CUDA, or one that does not exist, is a ConfigError naming the key and the fix.
    A CUDA device always comes back with its index (``cuda`` -> ``cuda:N``, N the current
    GPU): ``torch.cuda.set_device`` and per-device state reject an index-less device."""
    import torch  # deferred: config is read by `myxtts --help`, which starts without torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    use_cpu = f"--set {key}=cpu" if "." in key else f"{key} cpu"  # a config key or a CLI flag
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError) as e:
        raise ConfigError(f"{key}={excerpt(name)} is not a device; use auto, cpu, cuda or cuda:N") from e
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{key}={excerpt(name)} but no CUDA GPU is visible here; use {use_cpu} "
                              f"(auto picks a GPU when there is one)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"{key}={excerpt(name)} but only {torch.cuda.device_count()} CUDA GPU(s) "
                              f"are visible (cuda:0..cuda:{torch.cuda.device_count() - 1})")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device
