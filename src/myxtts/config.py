"""Typed configuration: dataclasses that map 1:1 to YAML sections.

Why dataclasses and not free dicts: every knob has one default and one comment,
a misspelt key fails loudly (naming the closest valid key) instead of being
silently ignored, and the resolved config saved next to a checkpoint is exactly
what the run used.

Sections: ``audio`` (the one feature definition), ``text``, ``data``, ``model``
(architecture, filled from a size preset), ``train``.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import yaml


class ConfigError(ValueError):
    """A config key is unknown, has the wrong type or an impossible value."""


def _f(default: Any, help: str, **kw: Any) -> Any:
    if isinstance(default, list | dict):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


@dataclass
class AudioConfig:
    """The single feature definition, shared by prepare, training, inference and vocoder."""

    sample_rate: int = _f(22050, "Hz; every clip is resampled (soxr) to this rate")
    n_fft: int = _f(1024, "FFT size of the STFT")
    hop_length: int = _f(256, "samples between frames (frame rate = sample_rate / hop_length)")
    win_length: int = _f(1024, "Hann window length in samples (<= n_fft)")
    n_mels: int = _f(80, "mel bands (Slaney scale and norm)")
    fmin: float = _f(0.0, "lowest mel band edge in Hz")
    fmax: float = _f(8000.0, "highest mel band edge in Hz (<= sample_rate / 2)")
    log_floor: float = _f(1e-5, "magnitudes are clamped to this before the log")
    trim_silence: bool = _f(True, "trim leading/trailing silence when loading a clip")
    resample: bool = _f(True, "resample clips at another rate; false makes such a clip an error")
    trim_db: float = _f(40.0, "a frame quieter than peak - trim_db counts as silence")
    normalize_loudness: bool = _f(False, "scale each clip to target_dbfs RMS (peak-limited)")
    target_dbfs: float = _f(-24.0, "target RMS level in dBFS when normalize_loudness is on")

    @property
    def frames_per_second(self) -> float:
        return self.sample_rate / self.hop_length


@dataclass
class TextConfig:
    """Text normalisation and tokenisation settings (part of the store's feature hash)."""

    languages: list[str] = _f(["en"], "language codes the model knows; each gets its own token")
    default_language: str = _f("en", "language of utterances whose dataset names none")
    lowercase: bool = _f(True, "lowercase text after cleaning (halves the Latin vocabulary)")
    expand_numbers: bool = _f(True, "spell out numbers, ordinals and currency (English)")


@dataclass
class DataConfig:
    """Dataset reading, the prepared store, batching and loading."""

    format: Literal["auto", "ljspeech", "speakers", "manifest"] = _f(
        "auto", "dataset layout; auto detects from the files present"
    )
    val_fraction: float = _f(0.05, "share of utterances held out for validation when no val split exists")
    min_val_utterances: int = _f(2, "at least this many validation utterances in a seeded split")
    split_seed: int = _f(1234, "seed of the train/val split (fixed so a re-prepare gives the same split)")
    min_duration_s: float = _f(0.3, "clips shorter than this are rejected by prepare")
    max_duration_s: float = _f(20.0, "clips longer than this are rejected (never truncated)")
    max_text_tokens: int = _f(600, "utterances with more text tokens are rejected")
    refs_per_utterance: int = _f(4, "reference clips of the same speaker recorded per utterance")
    ref_frames: int = _f(256, "frames of the reference mel crop fed to the conditioning encoder")
    batch_frames: int = _f(12000, "frame budget of a batch: batch_size x padded mel length <= this")
    max_batch_size: int = _f(64, "upper bound on utterances per batch (0 = only batch_frames)")
    num_buckets: int = _f(16, "length buckets; each pads to its upper edge, bounding distinct shapes")
    num_workers: int = _f(-1, "loader worker processes; -1 picks from the CPU count")
    prefetch_batches: int = _f(2, "batches copied ahead to the training device on a side stream")
    data_device: str = _f("cpu", "on-the-fly mode only: device that computes mels ('cpu' or 'cuda:N')")
    shuffle_seed: int = _f(0, "seed of the batch order; each epoch reshuffles from (seed, epoch)")


@dataclass
class ModelConfig:
    """Architecture. ``preset`` fills every other field; keys set explicitly override it."""

    preset: Literal["tiny", "small", "base"] = _f("tiny", "size preset: tiny (CPU), small, base (~100M)")
    d_model: int = _f(128, "width of every transformer")
    n_heads: int = _f(2, "attention heads (d_model must divide by it)")
    ff_mult: int = _f(4, "feed-forward width = ff_mult x d_model")
    text_layers: int = _f(2, "text encoder layers")
    decoder_layers: int = _f(3, "autoregressive decoder layers")
    cond_layers: int = _f(2, "conditioning (reference) encoder layers")
    cond_latents: int = _f(16, "conditioning latents produced from the reference (Perceiver queries)")
    prenet_dim: int = _f(128, "prenet width; its dropout stays on at inference (Tacotron trick)")
    prenet_dropout: float = _f(0.5, "prenet dropout, also at inference")
    frame_dropout: float = _f(0.0, "training only: probability that a decoder step's input "
                              "frame group is replaced by the mean frame (forces use of the text)")
    dropout: float = _f(0.1, "dropout inside transformers")
    postnet_channels: int = _f(128, "postnet conv channels")
    postnet_layers: int = _f(5, "postnet conv layers")
    postnet_kernel: int = _f(5, "postnet conv kernel size")
    frames_per_step: int = _f(3, "mel frames predicted per decoder step (reduction factor r)")
    max_decoder_frames: int = _f(1500, "inference stops after this many frames (guard)")
    stop_threshold: float = _f(0.5, "inference stops when the stop probability exceeds this")


MODEL_PRESETS: dict[str, dict[str, Any]] = {
    # ~2.5 M parameters: trains on a laptop CPU (the demo). ModelConfig's defaults ARE this
    # preset (tests/test_config.py checks it), so Config() builds what `--preset tiny` does.
    "tiny": dict(d_model=128, n_heads=2, ff_mult=4, text_layers=2, decoder_layers=3,
                 cond_layers=2, cond_latents=16, prenet_dim=128, postnet_channels=128,
                 postnet_layers=5, frames_per_step=3),  # r=3: measured to align and clone
                                                        # faster than r=2 in short CPU runs
    # ~35 M parameters: one consumer GPU
    "small": dict(d_model=384, n_heads=6, ff_mult=4, text_layers=4, decoder_layers=6,
                  cond_layers=3, cond_latents=32, prenet_dim=256, postnet_channels=512,
                  postnet_layers=5, frames_per_step=2),
    # ~105 M parameters: depth goes to the autoregressive decoder, 64-dim heads
    "base": dict(d_model=640, n_heads=10, ff_mult=4, text_layers=4, decoder_layers=9,
                 cond_layers=2, cond_latents=32, prenet_dim=256, postnet_channels=512,
                 postnet_layers=5, frames_per_step=2),
}


@dataclass
class TrainConfig:
    """Optimisation, precision, checkpointing and logging."""

    output_dir: str = _f("runs/myxtts", "config, vocabulary, checkpoints and logs go here")
    max_steps: int = _f(20000, "optimizer steps to train")
    lr: float = _f(1e-3, "peak learning rate (AdamW)")
    min_lr_ratio: float = _f(0.1, "cosine schedule ends at lr x this")
    warmup_steps: int = _f(500, "linear warmup steps")
    weight_decay: float = _f(0.01, "AdamW weight decay (not on norms, biases, embeddings)")
    beta1: float = _f(0.9, "AdamW beta1")
    beta2: float = _f(0.98, "AdamW beta2")
    grad_clip: float = _f(1.0, "max global gradient norm (0 disables)")
    grad_accum_steps: int = _f(1, "batches whose gradients are summed before one optimizer step")
    precision: Literal["auto", "bf16", "fp16", "fp32"] = _f(
        "auto", "auto = bf16 where the GPU supports it, fp16 + grad scaler on older GPUs, fp32 on CPU"
    )
    compile: Literal["auto", "on", "off"] = _f(
        "auto", "torch.compile the training step: auto = on for CUDA, off on CPU (measured on CPU: "
        "tiny compiled 0.79x eager, 85-140 s warm-up per shape); eager fallback if it fails"
    )
    seed: int = _f(1234, "seed of weights, dropout and data order")
    device: str = _f("auto", "training device: auto, cpu, cuda, cuda:N")
    mel_l2_weight: float = _f(0.0, "weight of an extra masked L2 mel loss (0 = L1 only)")
    guided_attn_weight: float = _f(1.0, "weight of the guided (near-diagonal) attention loss")
    guided_attn_sigma: float = _f(0.2, "width of the diagonal band the guided loss favours "
                                  "(0.1-0.6, where its Fourier form is exact)")
    self_feed: float = _f(0.0, "scheduled sampling: max probability that a decoder step is fed "
                          "the model's own previous prediction instead of the ground truth")
    self_feed_after: int = _f(0, "steps of pure teacher forcing before self_feed ramps up "
                              "(linearly, over as many steps again)")
    stop_pos_weight: float = _f(4.0, "BCE positive weight of the stop target (stop frames are rare)")
    log_every: int = _f(25, "steps between console/TensorBoard logs (the only host syncs)")
    val_every: int = _f(500, "steps between teacher-forced validation passes")
    synth_every: int = _f(1000, "steps between free-running validation syntheses (0 disables)")
    synth_sentences: int = _f(2, "validation utterances synthesised each synth_every")
    ckpt_every: int = _f(500, "steps between checkpoints")
    keep_last: int = _f(3, "checkpoints kept besides the best-by-validation one")
    max_nonfinite_in_row: int = _f(20, "stop the run after this many consecutive non-finite losses")
    tensorboard: bool = _f(True, "write TensorBoard logs when tensorboard is installed")


@dataclass
class Config:
    audio: AudioConfig = field(default_factory=AudioConfig)
    text: TextConfig = field(default_factory=TextConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def feature_hash(self) -> str:
        """Hash of everything that changes prepared features (audio + text sections)."""
        blob = json.dumps({"audio": dataclasses.asdict(self.audio),
                           "text": dataclasses.asdict(self.text)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


# Range of train.guided_attn_sigma in which the guided loss's Fourier series is exact to
# ~1e-4 (see myxtts.model.losses.gaussian_cosine_coefficients).
GUIDED_SIGMA_RANGE = (0.1, 0.6)

SECTIONS: dict[str, type] = {"audio": AudioConfig, "text": TextConfig, "data": DataConfig,
            "model": ModelConfig, "train": TrainConfig}


# ---------------------------------------------------------------- type checking

def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (list,):
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    return getattr(tp, "__name__", str(tp))


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check ``value`` against the annotation ``tp``; allow int->float only."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        if isinstance(value, bool) and {"on", "off"} <= set(choices):
            value = "on" if value else "off"  # YAML 1.1 reads bare on/off as booleans
        if value not in choices:
            close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{key}: {value!r} is not {_type_name(tp)}{hint}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        last: ConfigError | None = None
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(key, value, a)
            except ConfigError as e:
                last = e
        raise last or ConfigError(f"{key}: bad value {value!r}")
    if origin is list:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")
        (inner,) = typing.get_args(tp)
        return [_coerce(f"{key}[{i}]", v, inner) for i, v in enumerate(value)]
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {type(value).__name__} {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # PyYAML reads "3e-4" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}: expected a number, got {type(value).__name__} {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {type(value).__name__} {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported type {tp}")  # pragma: no cover - schema bug


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=False)


def _unknown(key: str, valid: list[str], where: str) -> ConfigError:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    hint = f"; did you mean '{where}{close[0]}'?" if close else f"; valid keys: {', '.join(valid)}"
    return ConfigError(f"unknown config key '{where}{key}'{hint}")


def _build_section(name: str, values: dict[str, Any]) -> Any:
    cls = SECTIONS[name]
    if not isinstance(values, dict):
        raise ConfigError(f"{name}: expected a mapping of keys, got {type(values).__name__}")
    hints = _hints(cls)
    valid = [f.name for f in fields(cls)]
    kwargs: dict[str, Any] = {}
    if name == "model":
        preset = values.get("preset", "tiny")
        preset = _coerce("model.preset", preset, hints["preset"])
        kwargs.update(MODEL_PRESETS[preset])
    for k, v in values.items():
        if k not in valid:
            raise _unknown(k, valid, f"{name}.")
        kwargs[k] = _coerce(f"{name}.{k}", v, hints[k])
    return cls(**kwargs)


def config_from_dict(d: dict[str, Any] | None) -> Config:
    d = d or {}
    if not isinstance(d, dict):
        raise ConfigError(f"a config must be a mapping of sections, got {type(d).__name__}")
    for k in d:
        if k not in SECTIONS:
            raise _unknown(k, list(SECTIONS), "")
    cfg = Config(**{name: _build_section(name, d.get(name) or {}) for name in SECTIONS})
    validate(cfg)
    return cfg


def load_config(path: str | Path | None = None, preset: str | None = None,
                overrides: list[str] | None = None) -> Config:
    """YAML file (optional) -> preset (optional) -> ``section.key=value`` overrides."""
    d: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist (write one with `myxtts config show > {p.name}`)")
        try:
            d = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML: {e}".replace("\n", " ")) from e
        if not isinstance(d, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of sections")
    if preset is not None:
        d.setdefault("model", {})
        # A preset on the command line wins over the file's: drop the file's explicit
        # architecture keys so the preset is not half-applied.
        d["model"] = {"preset": preset}
    for item in overrides or []:
        apply_override(d, item)
    return config_from_dict(d)


def apply_override(d: dict[str, Any], item: str) -> None:
    """Apply ``section.key=value`` (value parsed as YAML) to the raw dict ``d``."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like section.key=value, e.g. train.max_steps=100")
    dotted, raw = item.split("=", 1)
    parts = dotted.strip().split(".")
    if len(parts) != 2:
        raise ConfigError(f"override {item!r}: key must be section.key, e.g. data.batch_frames")
    section, key = parts
    if section not in SECTIONS:
        raise _unknown(section, list(SECTIONS), "")
    valid = [f.name for f in fields(SECTIONS[section])]
    if key not in valid:
        raise _unknown(key, valid, f"{section}.")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    # "--set data.data_device=cuda:0" parses as a YAML mapping; keep the string.
    if isinstance(value, dict) and _hints(SECTIONS[section])[key] is str:
        value = raw
    sec = d.setdefault(section, {})
    if sec is None:
        sec = d[section] = {}
    sec[key] = value


def validate(cfg: Config) -> None:
    """Reject impossible values, naming the key and what would be valid."""
    a, m, dt, t = cfg.audio, cfg.model, cfg.data, cfg.train

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
    if not cfg.text.languages:
        raise ConfigError("text.languages must name at least one language, e.g. [en]")
    if cfg.text.default_language not in cfg.text.languages:
        raise ConfigError(f"text.default_language {cfg.text.default_language!r} is not in "
                          f"text.languages {cfg.text.languages}")
    if not 0.0 <= dt.val_fraction < 1.0:
        raise ConfigError(f"data.val_fraction must be in [0, 1), got {dt.val_fraction}")
    positive("data", dt, "min_duration_s", "max_duration_s", "max_text_tokens", "refs_per_utterance",
             "ref_frames", "batch_frames", "num_buckets")
    positive("data", dt, "max_batch_size", "prefetch_batches", "min_val_utterances", allow_zero=True)
    if dt.num_workers < -1:
        raise ConfigError(f"data.num_workers must be -1 (auto) or >= 0, got {dt.num_workers}")
    if dt.min_duration_s >= dt.max_duration_s:
        raise ConfigError(f"data.min_duration_s ({dt.min_duration_s}) must be < data.max_duration_s "
                          f"({dt.max_duration_s})")
    if not (dt.data_device == "cpu" or dt.data_device.startswith("cuda")):
        raise ConfigError(f"data.data_device must be 'cpu' or 'cuda:N', got {dt.data_device!r}")
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
             "ckpt_every", "guided_attn_sigma", "stop_pos_weight", "max_nonfinite_in_row")
    positive("train", t, "warmup_steps", "weight_decay", "grad_clip", "synth_every",
             "synth_sentences", "keep_last", "mel_l2_weight", "guided_attn_weight",
             "min_lr_ratio", "self_feed_after", allow_zero=True)
    lo, hi = GUIDED_SIGMA_RANGE
    if not lo <= t.guided_attn_sigma <= hi:
        raise ConfigError(f"train.guided_attn_sigma must be in [{lo}, {hi}] (the range the guided "
                          f"loss supports; 0.2 is the usual value), got {t.guided_attn_sigma}")
    if not 0.0 <= t.self_feed <= 1.0:
        raise ConfigError(f"train.self_feed is a probability in [0, 1], got {t.self_feed}")
    if not 0 <= t.beta1 < 1 or not 0 <= t.beta2 < 1:
        raise ConfigError(f"train.beta1/beta2 must be in [0, 1), got {t.beta1}, {t.beta2}")


def resolve_device(name: str, key: str) -> Any:
    """The ``torch.device`` a device setting names (``key``, e.g. ``train.device``): ``auto``
    is the first CUDA GPU when one is visible, else the CPU. A CUDA device on a machine
    without CUDA, or one that does not exist, is a ConfigError naming the key and the fix."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    use_cpu = f"--set {key}=cpu" if "." in key else f"{key} cpu"  # a config key or a CLI flag
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError) as e:
        raise ConfigError(f"{key}={name!r} is not a device; use auto, cpu, cuda or cuda:N") from e
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{key}={name!r} but no CUDA GPU is visible here; use {use_cpu} "
                              f"(auto picks a GPU when there is one)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"{key}={name!r} but only {torch.cuda.device_count()} CUDA GPU(s) "
                              f"are visible (cuda:0..cuda:{torch.cuda.device_count() - 1})")
    return device


# ---------------------------------------------------------------- YAML output

def _scalar(v: Any) -> str:
    return yaml.safe_dump(v, default_flow_style=True, width=10**9).strip().removesuffix("...").strip()


def to_yaml(cfg: Config, header: str | None = None) -> str:
    """A complete, commented YAML document that ``load_config`` reads back to ``cfg``."""
    lines: list[str] = []
    if header:
        lines += [f"# {h}" for h in header.splitlines()] + [""]
    for name, cls in SECTIONS.items():
        section = getattr(cfg, name)
        doc = (cls.__doc__ or "").strip().splitlines()[0]
        lines.append(f"{name}:  # {doc}")
        for f in fields(cls):
            value = _scalar(getattr(section, f.name))
            lines.append(f"  {f.name}: {value}  # {f.metadata.get('help', '')}")
        lines.append("")
    return "\n".join(lines)


def save_config(cfg: Config, path: str | Path) -> None:
    from myxtts.system import atomic_write

    atomic_write(Path(path), to_yaml(cfg))
