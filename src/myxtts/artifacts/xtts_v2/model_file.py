"""XTTS-v2's ``model.pth`` as our modules' state dict, and back.

A ``model.pth`` comes in several forms that all hold the same model: the release
(``{"model": state}``, in the first releases with a pickled coqui config beside it), a
coqui GPT trainer's checkpoint (every key under ``xtts.``, plus the trainer's frozen DVAE
``dvae.*`` and its mel extractors ``torch_mel_spectrogram_*``), files saved after
``init_gpt_for_inference`` (``gpt.gpt_inference.*`` and ``gpt.gpt.wte.weight``: second names
of the GPT's own weights), and weight norm under either of torch's namings. Reading
normalises them all to one dict (the state-dict contract of ``myxtts.model.xtts_v2``):
prefix stripped, trainer entries dropped, aliases checked equal to what they alias and
dropped, weight norm folded, the speaker encoder's feature buffers checked against what our
mel computes and dropped. Then every name and shape is checked against the config
(``layout``), so a file of another size says which key differs and what it should be.

Writing does the reverse for the released layout: weight norm unfolded into coqui-tts
0.28's names and the feature buffers re-created; no aliases (coqui makes them on loading).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from myxtts.artifacts.checkpoint import FORMAT as CHECKPOINT_FORMAT
from myxtts.artifacts.errors import ArtifactError
from myxtts.artifacts.xtts_v2 import layout as lay
from myxtts.artifacts.xtts_v2.config_file import V1_AUDIO_TOKENS, is_v1
from myxtts.artifacts.xtts_v2.torch_files import check_entries, check_mel_stats, load_pth
from myxtts.artifacts.xtts_v2.weight_norm import fold_state, unfold_state
from myxtts.model.xtts_v2.config import XttsV2Config

TRAINER_PREFIX = "xtts."
# top-level modules of coqui's GPT trainer besides the model (coqui drops them the same way)
TRAINER_ONLY = ("dvae", "torch_mel_spectrogram_style_encoder", "torch_mel_spectrogram_dvae")
INFERENCE_PREFIX = "gpt.gpt_inference."
# init_gpt_for_inference's second names -> the weights they name
_ALIASES = (("gpt.gpt_inference.transformer.", "gpt.gpt."),
            ("gpt.gpt_inference.pos_embedding.", "gpt.mel_pos_embedding."),
            ("gpt.gpt_inference.embeddings.", "gpt.mel_embedding."),
            ("gpt.gpt_inference.final_norm.", "gpt.final_norm."),
            ("gpt.gpt_inference.lm_head.0.", "gpt.final_norm."),
            ("gpt.gpt_inference.lm_head.1.", "gpt.mel_head."))
_WTE = "gpt.gpt.wte.weight"  # the GPT's token embedding: the audio-code embedding itself
_SHOULD = "XTTS-v2's model.pth"
_LAYER = re.compile(r"gpt\.gpt\.h\.(\d+)\.")


def _aliased(key: str) -> str | None:
    """The weight an inference alias names, None for a key that is no alias."""
    if key == _WTE:
        return "gpt.mel_embedding.weight"
    for alias, target in _ALIASES:
        if key.startswith(alias):
            rest = key[len(alias):]
            return "gpt.mel_embedding.weight" if target + rest == _WTE else target + rest
    return None


def read_model(path: Path, config: XttsV2Config) -> dict[str, torch.Tensor]:
    """``model.pth`` as our state dict, checked against ``config`` (module doc)."""
    where = str(path)
    raw = load_pth(path, _SHOULD)
    if isinstance(raw, dict) and CHECKPOINT_FORMAT in raw:
        raise ArtifactError(f"{where} is a myxtts training checkpoint, not {_SHOULD}; pass the "
                            f"XTTS-v2 folder as downloaded")
    if not isinstance(raw, dict) or not isinstance(raw.get("model"), dict):
        found = f"entries {excerpt_keys(raw)}" if isinstance(raw, dict) else f"a {type(raw).__name__}"
        raise ArtifactError(f"{where} holds {found}, no \"model\" state dict; it is not {_SHOULD}")
    state = normalise(where, raw["model"])
    check_model(where, state, config)
    return state


def excerpt_keys(d: dict[Any, Any]) -> str:
    keys = [str(k) for k in list(d)[:4]]
    return "[" + ", ".join(keys) + (", ..." if len(d) > 4 else "") + "]"


def normalise(where: str, state: dict[Any, Any]) -> dict[str, torch.Tensor]:
    """Any form of ``model.pth``'s state dict (module doc) in our naming; names are not yet
    checked against a config (:func:`check_model`). Meta tensors pass with their values
    unchecked (shape-only checks)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if not isinstance(key, str):
            raise ArtifactError(f"{where}: the state dict has a key {key!r}, not a name")
        name = key[len(TRAINER_PREFIX):] if key.startswith(TRAINER_PREFIX) else key
        if name.split(".")[0] in TRAINER_ONLY:
            continue
        if name in out:
            raise ArtifactError(f"{where} holds {name} twice (as {key} and without the "
                                f"trainer's prefix); the file is damaged or edited")
        out[name] = value
    for key in [k for k in out if _aliased(k) is not None]:
        target = _aliased(key)
        if target not in out:
            raise ArtifactError(f"{where} holds {key} but not {target}, the weight it is a "
                                f"second name of; the file is damaged or edited")
        a, b = out.pop(key), out[target]
        if not _same(a, b):
            raise ArtifactError(f"{where}: {key} differs from {target}, which it is a second "
                                f"name of (coqui's inference copy); the file is damaged or edited")
    _check_speaker_features(where, out)
    return fold_state(out, where)


def _same(a: Any, b: Any) -> bool:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return a.is_meta or b.is_meta or bool(torch.equal(a, b))


def _check_speaker_features(where: str, state: dict[str, Any]) -> None:
    """The speaker encoder's feature buffers, where present, are the pre-emphasis, window
    and filterbank our mel computes (anything else would feed the speaker encoder other
    features than it was trained on); they are removed from ``state``."""
    hears = "myxtts computes the speaker encoder's features itself, to these values"
    for key, want in lay.speaker_features().items():
        if key not in state:
            continue
        t = state.pop(key)
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(want.shape):
            found = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ArtifactError(f"{where}: {key} has shape {found}, XTTS-v2's speaker encoder "
                                f"has {list(want.shape)}; {hears}")
        if t.is_meta:
            continue
        diff = float((t.float() - want).abs().max()) if t.numel() else 0.0
        if not diff <= 1e-6:
            raise ArtifactError(f"{where}: {key} differs from XTTS-v2's speaker-encoder feature "
                                f"buffer by up to {diff:.3g}; {hears}")


def _v1_check(where: str, state: dict[str, torch.Tensor], config: XttsV2Config) -> None:
    if "gpt.prompt_embedding.weight" in state:
        raise is_v1(where, "checkpoint", "it holds gpt.prompt_embedding")
    if not any(k.startswith("gpt.conditioning_perceiver.") for k in state):
        raise is_v1(where, "checkpoint", "it holds no gpt.conditioning_perceiver")
    mel = state.get("gpt.mel_embedding.weight")
    rows = mel.shape[0] if isinstance(mel, torch.Tensor) and mel.ndim else None
    if rows == V1_AUDIO_TOKENS != config.args.gpt_num_audio_tokens:
        raise is_v1(where, "checkpoint", f"{rows} audio tokens, XTTS-v2 has "
                                         f"{config.args.gpt_num_audio_tokens}")


def check_model(where: str, state: dict[str, torch.Tensor], config: XttsV2Config,
                needs: str = "config.json's model") -> None:
    """``state`` (our naming) is the model ``config`` describes: every name, shape and kind
    of number, finite, the mel statistics > 0; an XTTS v1 checkpoint is named as such.
    ``needs`` names the model in the messages."""
    _v1_check(where, state, config)
    layers = {int(m.group(1)) for k in state if (m := _LAYER.match(k))}
    if layers and len(layers) != config.args.gpt_layers:
        raise ArtifactError(f"{where} holds {len(layers)} GPT layers, config.json's "
                            f"model_args.gpt_layers says {config.args.gpt_layers}; the two "
                            f"files are of different models")
    a = config.args
    hints = {k: f"vocab.json has {config.number_text_tokens} tokens" for k in
             ("gpt.text_embedding.weight", "gpt.text_head.weight", "gpt.text_head.bias")}
    hints.update({k: f"model_args.gpt_num_audio_tokens is {a.gpt_num_audio_tokens}" for k in
                  ("gpt.mel_embedding.weight", "gpt.mel_head.weight", "gpt.mel_head.bias")})
    hints["gpt.mel_pos_embedding.emb.weight"] = (f"model_args.gpt_max_audio_tokens + 3 = "
                                                 f"{a.gpt_max_audio_tokens + 3} positions")
    hints["gpt.text_pos_embedding.emb.weight"] = (f"model_args.gpt_max_text_tokens + 2 = "
                                                  f"{a.gpt_max_text_tokens + 2} positions")
    for k in ("gpt.gpt.ln_f.weight", "gpt.final_norm.weight", "gpt.conditioning_perceiver.latents"):
        hints[k] = f"model_args.gpt_n_model_channels is {a.gpt_n_model_channels}"
    check_entries(where, state, lay.xtts_layout(config), lay.integer_entry, hints=hints,
                  needs=needs)
    check_mel_stats(where, state["mel_stats"])


def released_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict in the released ``model.pth``'s names: weight norm unfolded as
    coqui-tts 0.28 names it, the speaker encoder's feature buffers in before its attention
    pooling (where the reference keeps them)."""
    normed = {k for k in state if lay.is_weight_normed(k)}
    out: dict[str, torch.Tensor] = {}
    features = lay.speaker_features()
    for key, value in unfold_state(state, normed).items():
        if key.startswith("hifigan_decoder.speaker_encoder.attention.") and features:
            out.update(features)
            features = {}
        out[key] = value
    out.update(features)
    return out
