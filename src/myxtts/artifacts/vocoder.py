"""Vocoder checkpoints: what a vocoder run saves, and loading one for synthesis.

A vocoder checkpoint is a TTS-style checkpoint dict (``artifacts.checkpoint``: written
atomically, read with ``weights_only=True``) marked ``kind: "vocoder"``, carrying the run's
config and the hash of its mel definition. Why the hash: a vocoder turns ONE mel definition
into audio; fed mels of another sample rate, hop or filterbank it produces confident
garbage, so loading it next to a TTS model of another definition is refused, naming the
keys that differ.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.artifacts.errors import ArtifactError
from myxtts.artifacts.readback import check_vocoder
from myxtts.artifacts.runs import resolve_checkpoint
from myxtts.config import AudioConfig
from myxtts.model.vocoder.generator import VocosGenerator

KIND = "kind"
VOCODER = "vocoder"
MEL_HASH = "mel_hash"
GENERATOR, DISCRIMINATORS, OPTIMIZERS = "model", "discriminators", "optimizers"

# The keys of AudioConfig that define the log-mel itself (trimming and loudness change the
# data, not what a mel frame means).
MEL_KEYS = ("sample_rate", "n_fft", "hop_length", "win_length", "n_mels", "fmin", "fmax",
            "log_floor")


def mel_definition(audio: AudioConfig | dict[str, Any]) -> dict[str, Any]:
    values = audio if isinstance(audio, dict) else dataclasses.asdict(audio)
    return {k: values[k] for k in MEL_KEYS}


def mel_hash(audio: AudioConfig | dict[str, Any]) -> str:
    blob = json.dumps(mel_definition(audio), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def check_mel_definition(saved_audio: AudioConfig | dict[str, Any], audio: AudioConfig,
                         where: str) -> None:
    """ArtifactError naming every differing mel key unless ``saved_audio`` defines the same mel."""
    if mel_hash(saved_audio) == mel_hash(audio):
        return
    mine, theirs = mel_definition(audio), mel_definition(saved_audio)
    diffs = [f"audio.{k}: vocoder {theirs[k]!r}, model {mine[k]!r}" for k in MEL_KEYS
             if theirs[k] != mine[k]]
    raise ArtifactError(f"vocoder {where} was trained on another mel definition "
                        f"({'; '.join(diffs)}); train a vocoder on features of this model's "
                        f"config (`myxtts train-vocoder` with the same audio section) or "
                        f"synthesize without --vocoder")


def load_vocoder_state(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """The checkpoint file and dict of a vocoder run (folder or .pt); ArtifactError if it is a
    TTS checkpoint or unreadable."""
    file = resolve_checkpoint(path)
    state = ck.load(file)
    if state.get(KIND) != VOCODER:
        raise ArtifactError(f"{file} is a TTS checkpoint, not a vocoder; pass a run folder of "
                            f"`myxtts train-vocoder` (or leave --vocoder out for Griffin-Lim)")
    return file, state


def load_vocoder(path: str | Path, audio: AudioConfig, device: torch.device) -> VocosGenerator:
    """The trained generator of a vocoder run, in eval mode on ``device``, checked to speak
    ``audio``'s mel definition."""
    file, state = load_vocoder_state(path)
    return build_vocoder(state[ck.CONFIG], state[GENERATOR], audio, str(file)).to(device)


def build_vocoder(config: dict[str, Any], weights: dict[str, torch.Tensor], audio: AudioConfig,
                  where: str) -> VocosGenerator:
    """A generator in eval mode from a vocoder run's config dict and generator weights,
    checked to speak ``audio``'s mel definition (``where`` names the source in errors)."""
    cfg = check_vocoder(where, config, weights)  # every field, before use
    check_mel_definition(cfg.audio, audio, where)
    gen = VocosGenerator(cfg.audio, cfg.vocoder)
    gen.load_state_dict(weights)
    return gen.eval()
