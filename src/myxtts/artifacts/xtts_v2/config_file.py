"""XTTS-v2's ``config.json`` and ``vocab.json``: read into :class:`XttsV2Config`, written back.

The released ``config.json`` is coqui's whole training config (paths, optimizer, loggers,
...); myxtts takes the keys the model and its decoding need, each checked for its type,
and keeps the file's other keys untouched, so that a folder written back out (``myxtts
export --format xtts``) still reads in coqui-tts. The text-token ids are not in the config
as coqui reads it: they come from ``vocab.json`` (``[START]``, ``[STOP]``, the highest id +
1), as coqui derives them.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

from myxtts.artifacts.errors import ArtifactError
from myxtts.config.bounds import TooLarge, excerpt, loads_json
from myxtts.model.xtts_v2.config import XttsV2Args, XttsV2Config, XttsV2Sampling, XttsV2Voice

V1_AUDIO_TOKENS = 8194  # XTTS v1's DVAE codes + start + stop (v2: 1026)
_V1 = ("myxtts speaks XTTS-v2: download the XTTS-v2 folder (coqui/XTTS-v2 on Hugging Face: "
       "config.json, model.pth, vocab.json, ...)")


def is_v1(where: str, kind: str, why: str) -> ArtifactError:
    """The error for a file of XTTS v1 (``kind``: config, checkpoint), which myxtts does not
    speak."""
    return ArtifactError(f"{where} is an XTTS v1 {kind} ({why}); {_V1}")


def read_json(path: Path) -> Any:
    """``path`` parsed as JSON with its nesting bounded; ArtifactError naming it otherwise."""
    try:
        return loads_json(path.read_bytes())
    except OSError as e:
        raise ArtifactError(f"{path} cannot be read ({e.strerror or e})") from None
    except TooLarge as e:
        raise ArtifactError(f"{path} is JSON {e}; it is not XTTS-v2's {path.name}") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise ArtifactError(f"{path} is not JSON ({excerpt(str(e), quote=False)}); it should be "
                            f"XTTS-v2's {path.name} as downloaded") from None


def text_tokens(path: Path, text: str) -> tuple[int, int, int]:
    """``(number of text tokens, [START] id, [STOP] id)`` of the vocabulary ``text`` (the file
    ``path``), read by ``tokenizers`` as the text layer will read it."""
    try:
        from tokenizers import Tokenizer  # optional: needed by the XTTS-v2 family only
    except ImportError:
        raise ArtifactError(f"{path} needs the tokenizers package to be read; install "
                            f"XTTS-v2's extra: pip install \"myxtts[xtts]\"") from None
    try:
        tok = Tokenizer.from_str(text)
    except Exception as e:  # tokenizers raises its own Exception type for every problem
        raise ArtifactError(f"{path} is not a tokenizers vocabulary ({excerpt(str(e), quote=False)}); "
                            f"it should be XTTS-v2's vocab.json as downloaded") from None
    ids = tok.get_vocab()
    start, stop = tok.token_to_id("[START]"), tok.token_to_id("[STOP]")
    if not ids or start is None or stop is None:
        missing = "[START]" if start is None else "[STOP]"
        raise ArtifactError(f"{path} has no {missing} token; it is not XTTS's vocabulary (its "
                            f"vocab.json has [STOP], [UNK], [SPACE], the languages, [START])")
    return max(ids.values()) + 1, start, stop


def _typed(where: str, key: str, value: Any, kind: str) -> Any:
    """``value`` of ``key`` checked to be of ``kind`` (a field annotation)."""
    ok = {"int": isinstance(value, int) and not isinstance(value, bool),
          "bool": isinstance(value, bool),
          "float": isinstance(value, int | float) and not isinstance(value, bool),
          "tuple[str, ...]": isinstance(value, list) and bool(value)
          and all(isinstance(v, str) for v in value)}[kind]
    if not ok:
        words = {"int": "a whole number", "bool": "true or false", "float": "a number",
                 "tuple[str, ...]": "a non-empty list of language codes"}[kind]
        raise ArtifactError(f"{where}: {key} is {excerpt(value)}, it should be {words}")
    return tuple(value) if kind.startswith("tuple") else float(value) if kind == "float" else value


def _section(where: str, source: dict[str, Any], prefix: str, cls: type) -> Any:
    values = {}
    for f in dataclasses.fields(cls):
        if f.name not in source:
            raise ArtifactError(f"{where} has no {prefix}{f.name}; it should be XTTS-v2's "
                                f"config.json as downloaded (with every key coqui-tts wrote)")
        values[f.name] = _typed(where, prefix + f.name, source[f.name], str(f.type))
    return cls(**values)


def parse_config(where: str, raw: Any, tokens: tuple[int, int, int]) -> XttsV2Config:
    """``config.json``'s contents as :class:`XttsV2Config`; ``tokens`` from :func:`text_tokens`.
    A JSON that is not XTTS's config, a key missing or of the wrong type, an XTTS v1
    config and sizes no model can have are ArtifactErrors naming the key."""
    if not isinstance(raw, dict) or raw.get("model") != "xtts":
        found = f'its "model" is {excerpt(raw.get("model"))}' if isinstance(raw, dict) \
            else f"it holds a {type(raw).__name__}"
        raise ArtifactError(f"{where} is not XTTS's config ({found}, not \"xtts\"); it should be "
                            f"XTTS-v2's config.json as downloaded")
    args_raw = raw.get("model_args")
    if not isinstance(args_raw, dict):
        raise ArtifactError(f"{where} has no model_args section; it should be XTTS-v2's "
                            f"config.json as downloaded")
    if args_raw.get("gpt_use_perceiver_resampler") is False:
        raise is_v1(where, "config", "model_args.gpt_use_perceiver_resampler is false")
    if args_raw.get("gpt_num_audio_tokens") == V1_AUDIO_TOKENS:
        raise is_v1(where, "config", f"model_args.gpt_num_audio_tokens is {V1_AUDIO_TOKENS}")
    args = _section(where, args_raw, "model_args.", XttsV2Args)
    _check_sizes(where, args)
    sampling = _section(where, raw, "", XttsV2Sampling)
    voice = _section(where, raw, "", XttsV2Voice)
    if "languages" not in raw:
        raise ArtifactError(f"{where} has no languages; it should be XTTS-v2's config.json as "
                            f"downloaded")
    languages = _typed(where, "languages", raw["languages"], "tuple[str, ...]")
    number, start, stop = tokens
    return XttsV2Config(args=args, sampling=sampling, voice=voice, languages=languages,
                        number_text_tokens=number, start_text_token=start, stop_text_token=stop)


def _check_sizes(where: str, a: XttsV2Args) -> None:
    positive = ("gpt_layers", "gpt_n_model_channels", "gpt_n_heads", "gpt_max_audio_tokens",
                "gpt_max_text_tokens", "gpt_num_audio_tokens", "gpt_code_stride_len",
                "input_sample_rate", "output_sample_rate", "output_hop_length",
                "decoder_input_dim", "d_vector_dim")
    for name in positive:
        if getattr(a, name) <= 0:
            raise ArtifactError(f"{where}: model_args.{name} is {getattr(a, name)}, it should be > 0")
    if a.gpt_n_model_channels % a.gpt_n_heads:
        raise ArtifactError(f"{where}: model_args.gpt_n_model_channels ({a.gpt_n_model_channels}) "
                            f"is not a multiple of model_args.gpt_n_heads ({a.gpt_n_heads})")
    for name in ("gpt_start_audio_token", "gpt_stop_audio_token"):
        if not 0 <= getattr(a, name) < a.gpt_num_audio_tokens:
            raise ArtifactError(f"{where}: model_args.{name} is {getattr(a, name)}, outside the "
                                f"{a.gpt_num_audio_tokens} audio tokens")


def config_json(config: XttsV2Config, source: dict[str, Any] | None = None) -> dict[str, Any]:
    """``config`` as coqui's ``config.json``: ``source`` (the folder's own JSON) with the keys
    :func:`parse_config` reads set to ``config``'s values and the text-token counts updated;
    without ``source``, those keys alone (coqui fills in its defaults for the rest)."""
    out = copy.deepcopy(source) if source is not None else {}
    out["model"] = "xtts"
    args = dict(out.get("model_args") or {})
    args.update(dataclasses.asdict(config.args))
    args.update(gpt_number_text_tokens=config.number_text_tokens,
                gpt_start_text_token=config.start_text_token,
                gpt_stop_text_token=config.stop_text_token)
    out["model_args"] = args
    out.update(dataclasses.asdict(config.sampling))
    out.update(dataclasses.asdict(config.voice))
    out["languages"] = list(config.languages)
    return out
