"""Every field of a file read back, checked before use: a checksum proves that a file is what
was written, not that this program wrote it (anyone can edit a bundle and seal it again).

What is checked, for a bundle, a checkpoint read for synthesis, export or fine-tuning, and a
vocoder's weights: the config parses as this version's config; the vocabulary parses; every
weight the config's model has is there, with its shape and kind of number (a float weight a
float tensor), and nothing else is; the mel statistics are there with shape ``[n_mels]``;
every number is finite (non-finite weights speak silence or noise). The model to compare
against is built on the meta device: shapes without memory or time. Each failure is one
:class:`ArtifactError` line naming the file and the field.

Also here: what a file is, from its first bytes (:func:`file_kind`), so a reader that gets a
bundle where it expects a checkpoint says so instead of failing inside torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from myxtts.artifacts.averaged import WEIGHTS
from myxtts.artifacts.errors import ArtifactError
from myxtts.config import Config, ConfigError, config_from_dict
from myxtts.config.bounds import TooLarge, excerpt, loads_json
from myxtts.model.vocoder.generator import VocosGenerator
from myxtts.model.xtts import build_model
from myxtts.text import Tokenizer, TokenizerError

BUNDLE_FORMAT_KEY = "myxtts.bundle"  # the metadata key that marks a bundle
ZIP_MAGIC = b"PK\x03\x04"  # how every torch.save file starts
MAX_HEADER_BYTES = 100 << 20  # a safetensors header declaring more is no bundle
TOKEN_ROWS = "text_encoder.token_emb.weight"


def file_kind(path: str | Path) -> str:
    """``"checkpoint"`` (a torch.save zip), ``"bundle"`` (a safetensors file marked as a
    myxtts bundle), ``"empty"`` or ``"other"``, from the file's first bytes."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            if not head:
                return "empty"
            if head.startswith(ZIP_MAGIC):
                return "checkpoint"
            n = int.from_bytes(head, "little") if len(head) == 8 else 0
            if not 2 <= n <= MAX_HEADER_BYTES:
                return "other"
            header = fh.read(n)
    except OSError:
        return "other"
    return "bundle" if header[:1] == b"{" and f'"{BUNDLE_FORMAT_KEY}"'.encode() in header \
        else "other"


def bundle_instead(path: str | Path) -> ArtifactError:
    """The error for a bundle given where a training checkpoint is needed (naming a step
    checkpoint beside it, where there is one: a bundle renamed into a run folder)."""
    steps = sorted(Path(path).parent.glob("ckpt_*.pt"))
    beside = f" (e.g. {steps[-1]})" if steps and file_kind(steps[-1]) == "checkpoint" else ""
    return ArtifactError(f"{path} is a model bundle (written by `myxtts export`), not a training "
                         f"checkpoint: it holds the weights to speak with but no training "
                         f"state. Synthesize from it (`myxtts synthesize -c {path}`); to train "
                         f"or export, pass the run folder or checkpoint it was exported "
                         f"from{beside}")


def json_field(where: str, field: str, text: Any) -> Any:
    """The JSON text stored as ``field`` of ``where``, parsed with its nesting bounded."""
    if not isinstance(text, str | bytes):
        raise ArtifactError(f"{where}: field {field!r} is a {type(text).__name__}, not JSON text")
    try:
        return loads_json(text)
    except TooLarge as e:
        raise ArtifactError(f"{where}: field {field!r} is JSON {e}; not written by myxtts") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise ArtifactError(f"{where}: field {field!r} is not JSON ({excerpt(str(e), quote=False)}); not "
                            f"written by myxtts") from None


def config_field(where: str, config: Any, field: str = "config") -> Config:
    """The config stored in ``where``, checked as this version's config."""
    if not isinstance(config, dict):
        raise ArtifactError(f"{where}: field {field!r} is a {type(config).__name__}, not a "
                            f"config mapping")
    try:
        return config_from_dict(config)
    except ConfigError as e:
        raise ArtifactError(f"{where}: field {field!r}: {e}") from None
    except (TypeError, ValueError, KeyError, RecursionError) as e:
        raise ArtifactError(f"{where}: field {field!r} is not a config ({type(e).__name__})"
                            ) from None


def vocab_field(where: str, vocab: Any) -> Tokenizer:
    """The vocabulary stored in ``where``, checked."""
    try:
        return Tokenizer.from_dict(vocab)
    except (TokenizerError, TypeError, ValueError, KeyError) as e:
        raise ArtifactError(f"{where}: field 'vocab' is not a vocabulary ({excerpt(str(e), quote=False)})"
                            ) from None


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(n) for n in t.shape) + "]"


def check_tensors(where: str, expected: dict[str, torch.Tensor], given: Any, prefix: str,
                  subset: bool = False) -> None:
    """``given`` (a state dict read from ``where``) has every entry of ``expected`` (a meta
    model's state dict) and no other (``subset``: some of them, e.g. a weight average), each
    of its shape and kind of number, every number finite. Fields are named ``prefix + name``."""
    if not isinstance(given, dict):
        raise ArtifactError(f"{where}: field {prefix.rstrip('.')!r} is a {type(given).__name__}, "
                            f"not a mapping of weights")
    missing = [k for k in expected if k not in given] if not subset else []
    extra = [str(k) for k in given if k not in expected]
    if missing or extra:
        parts = ([f"missing {len(missing)} weight(s) the config's model has, e.g. "
                  f"{prefix}{missing[0]}"] if missing else []) + \
                ([f"{len(extra)} weight(s) it has not, e.g. {excerpt(prefix + extra[0])}"]
                 if extra else [])
        raise ArtifactError(f"{where}: {'; '.join(parts)} (a model of another architecture, or "
                            f"an edited file)")
    for name, want in expected.items():
        if name not in given:
            continue
        t, field = given[name], prefix + name
        if not isinstance(t, torch.Tensor):
            raise ArtifactError(f"{where}: field {field!r} is a {type(t).__name__}, not a tensor")
        if want.is_floating_point() != t.is_floating_point() or (
                not want.is_floating_point() and t.dtype != want.dtype):
            raise ArtifactError(f"{where}: field {field!r} holds {t.dtype} numbers, the model "
                                f"needs {want.dtype}")
        if t.shape != want.shape:
            why = ""
            if name == TOKEN_ROWS and t.ndim == 2 and t.shape[1:] == want.shape[1:]:
                why = (f" (the vocabulary has {want.shape[0]} tokens, the embedding "
                       f"{t.shape[0]} rows)")
            raise ArtifactError(f"{where}: field {field!r} has shape {_shape(t)}, the config's "
                                f"model needs {_shape(want)}{why}")
        if t.is_floating_point() and t.numel() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise ArtifactError(f"{where}: field {field!r} holds {bad} non-finite value(s) (NaN "
                                f"or infinity): the weights diverged or were damaged; use an "
                                f"earlier checkpoint")


def check_mel_stats(where: str, mel_mean: Any, mel_std: Any, n_mels: int) -> None:
    """``mel_mean`` and ``mel_std``: float tensors of shape ``[n_mels]``, finite; std > 0."""
    want = torch.empty(n_mels, device="meta")
    for field, t in (("mel_mean", mel_mean), ("mel_std", mel_std)):
        if t is None:
            raise ArtifactError(f"{where}: field {field!r} is missing (the mel statistics of the "
                                f"data the model was trained on)")
        check_tensors(where, {field: want}, {field: t}, "")
    if not bool((mel_std > 0).all()):
        raise ArtifactError(f"{where}: field 'mel_std' holds values <= 0; not written by myxtts")


def check_model(where: str, config: Any, vocab: Any, weights: Any, mel_mean: Any,
                mel_std: Any, ema: Any = None, prefix: str = "model.") -> tuple[Config, Tokenizer]:
    """Every field a TTS model is built from (module doc); the parsed config and vocabulary.
    ``ema``: a checkpoint's weight average entry (``artifacts.averaged``), whose weights (some
    of the model's) are checked the same way."""
    if ema is not None and not (isinstance(ema, dict) and isinstance(ema.get(WEIGHTS), dict)):
        raise ArtifactError(f"{where}: field 'ema' is not a weight average; not written by "
                            f"myxtts")
    cfg, tok = config_field(where, config), vocab_field(where, vocab)
    check_mel_stats(where, mel_mean, mel_std, cfg.audio.n_mels)
    with torch.device("meta"):
        model = build_model(cfg, tok.vocab_size, len(tok.languages), None, None)
    expected = model.state_dict()
    check_tensors(where, expected, weights, prefix)
    if ema is not None:
        check_tensors(where, expected, ema[WEIGHTS], "ema.weights.", subset=True)
    return cfg, tok


def check_vocoder(where: str, config: Any, weights: Any, prefix: str = "") -> Config:
    """The config and generator weights of a vocoder; the parsed config."""
    if isinstance(config, dict) and isinstance(config.get("vocoder"), dict) and \
            "projections" not in config["vocoder"]:  # saved before the key existed
        config = {**config, "vocoder": {**config["vocoder"], "projections": 0}}
    cfg = config_field(where, config, "vocoder_config" if prefix else "config")
    with torch.device("meta"):
        gen = VocosGenerator(cfg.audio, cfg.vocoder)
    check_tensors(where, gen.state_dict(), weights, prefix)
    return cfg
