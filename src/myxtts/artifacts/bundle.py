"""A portable model: one file with what a trained model needs to speak, and nothing else.

:func:`export` writes a run's weights (the averaged EMA weights where its checkpoint keeps
them), its config, vocabulary (the language table with it), mel statistics and, optionally,
a trained vocoder's generator as ONE safetensors file: tensors ``model.NAME``,
``vocoder.NAME``, ``mel_mean`` and ``mel_std``; config, vocabulary, the vocoder's config and
the run's last evaluation in training (given by the caller: ``myxtts export`` reads the
run's ``evaluation.json`` with ``myxtts.evaluate.record``) as JSON strings in the file's
metadata. No optimizer, scheduler or random state, so it is a fraction of a training
checkpoint; no pickle, so reading one runs no code.

Integrity: the metadata key ``myxtts.sha256`` holds a SHA-256 over every byte of the file,
computed with its own 64 digits written as zeros. A copy that lost or changed a byte is
refused in one line naming the file. A checksum proves the file is what was written, not
that myxtts wrote it, so every field read back is checked as well (``artifacts.readback``:
JSON nesting bounded, config, vocabulary, every weight's shape and kind against the
config's model, mel statistics, finite numbers), and so is the checkpoint being exported.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load, save

from myxtts.artifacts import checkpoint as ck
from myxtts.artifacts import vocoder as vck
from myxtts.artifacts.averaged import averaged_state
from myxtts.artifacts.errors import ArtifactError
from myxtts.artifacts.readback import (
    BUNDLE_FORMAT_KEY,
    MAX_HEADER_BYTES,
    check_model,
    check_vocoder,
    file_kind,
    json_field,
)
from myxtts.artifacts.runs import resolve_checkpoint
from myxtts.config import config_from_dict
from myxtts.config.bounds import TooLarge, excerpt, loads_json
from myxtts.outputs import FileKind
from myxtts.system import atomic_write

FORMAT = 1  # the bundle format this version writes and the newest it reads
FORMAT_KEY, CHECKSUM_KEY = BUNDLE_FORMAT_KEY, "myxtts.sha256"
# which model a bundle holds; a bundle without the field is one of `myxtts train`
FAMILY_KEY, FAMILY_MYXTTS = "myxtts.family", "myxtts"
CONFIG, VOCAB, VOCODER_CONFIG, EVALUATION = "config", "vocab", "vocoder_config", "evaluation"
MODEL_PREFIX, VOCODER_PREFIX = "model.", "vocoder."
_ZERO = b"0" * 64
_MARK = b'"' + CHECKSUM_KEY.encode() + b'":"'
_ZIP = b"PK\x03\x04"  # how every torch.save file starts


# what `myxtts export -o FILE` may replace: a bundle (anything else there is the user's)
BUNDLE_FILE = FileKind("a model bundle", lambda path: file_kind(path) == "bundle")


@dataclass
class Trained:
    """What a trained TTS model needs to speak, as a bundle holds it and as
    ``artifacts.trained.load_trained`` reads it from any source. ``source``: the file read;
    ``weights``: the model's state dict (the averaged weights where they were chosen)."""

    source: Path
    config: dict[str, Any]
    vocab: dict[str, Any]
    weights: dict[str, torch.Tensor]
    mel_mean: torch.Tensor
    mel_std: torch.Tensor
    vocoder_config: dict[str, Any] | None = None
    vocoder: dict[str, torch.Tensor] | None = None
    evaluation: dict[str, Any] | None = None  # the run's last evaluation, as a bundle carries it


@dataclass
class Exported:
    """What :func:`export` wrote, and from what."""

    path: Path
    size: int
    checkpoint: Path
    checkpoint_size: int
    averaged: bool  # EMA weights went in
    vocoder: Path | None
    evaluation: dict[str, Any] | None = None  # the run's last evaluation, carried along


def is_bundle(path: str | Path) -> bool:
    """A file that is no ``torch.save`` checkpoint (a zip) and, if named ``.pt``, starts
    as a bundle does: read it as a bundle, whose reader names what is wrong if it is none."""
    p = Path(path)
    if not p.is_file():
        return False
    with p.open("rb") as f:
        head = f.read(9)
    return not head.startswith(_ZIP) and (p.suffix != ".pt" or head[8:9] == b"{")


def model_weights(state: dict[str, Any], raw: bool = False) -> tuple[dict[str, torch.Tensor], bool]:
    """A checkpoint's model state dict with its moving average of the weights in place of
    the trained ones (unless ``raw``; ``artifacts.averaged``), and whether it was."""
    ema = None if raw else state.get(ck.EMA)
    return averaged_state(state[ck.MODEL], ema), bool(ema)


def tts_checkpoint(file: Path, named: str | Path) -> dict[str, Any]:
    """The state of the TTS checkpoint ``file``, every model field checked against its config
    (``artifacts.readback``); a vocoder's is refused, naming ``named`` as the user gave it."""
    state = ck.load(file)
    if state.get(vck.KIND) == vck.VOCODER:
        raise ArtifactError(f"{named} is a vocoder run; give a TTS run here and the vocoder as "
                            f"--vocoder")
    check_model(str(file), state.get(ck.CONFIG), state.get(ck.VOCAB), state.get(ck.MODEL),
                state.get(ck.MEL_MEAN), state.get(ck.MEL_STD), state.get(ck.EMA))
    return state


def export(run: str | Path, out: str | Path, vocoder: str | Path | None = None,
           raw_weights: bool = False, evaluation: dict[str, Any] | None = None) -> Exported:
    """Write the bundle of ``run`` (a run folder or a checkpoint file) to ``out``;
    ``evaluation``: the run's last evaluation in training, carried in the metadata."""
    out = Path(out)
    if out.is_dir():
        raise ArtifactError(f"-o {out} is a folder; give a file name (e.g. model.safetensors)")
    file = resolve_checkpoint(run)
    state = tts_checkpoint(file, file)
    model, averaged = model_weights(state, raw_weights)
    tensors = {MODEL_PREFIX + k: v for k, v in model.items()}
    tensors.update(mel_mean=state[ck.MEL_MEAN], mel_std=state[ck.MEL_STD])
    meta = {FORMAT_KEY: str(FORMAT), CONFIG: json.dumps(state[ck.CONFIG]),
            VOCAB: json.dumps(state[ck.VOCAB], ensure_ascii=False)}
    voc_file = None
    if vocoder is not None:
        voc_file, voc = vck.load_vocoder_state(vocoder)
        voc_cfg = check_vocoder(str(voc_file), voc.get(ck.CONFIG), voc.get(vck.GENERATOR))
        vck.check_mel_definition(voc_cfg.audio, config_from_dict(state[ck.CONFIG]).audio,
                                 str(voc_file))
        tensors.update({VOCODER_PREFIX + k: v for k, v in voc[vck.GENERATOR].items()})
        meta[VOCODER_CONFIG] = json.dumps(voc[ck.CONFIG])
    if evaluation is not None:
        meta[EVALUATION] = json.dumps(evaluation)
    blob = _seal(_serialize(tensors, meta))
    atomic_write(out, blob)
    return Exported(out, len(blob), file, file.stat().st_size, averaged, voc_file, evaluation)


def _serialize(tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> bytes:
    # each tensor its own contiguous CPU copy: safetensors refuses tensors sharing storage
    plain = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    return save(plain, metadata={**meta, CHECKSUM_KEY: _ZERO.decode()})


def _seal(blob: bytes) -> bytes:
    """``blob`` with the SHA-256 of itself (its digits read as zeros) in its digits."""
    at = _checksum_at(blob)
    return blob[:at] + _digest(blob, at) + blob[at + 64:]


def _digest(blob: bytes, at: int) -> bytes:
    """SHA-256 hex digits of ``blob`` with the 64 bytes at ``at`` read as zeros (no copy)."""
    view = memoryview(blob)
    h = hashlib.sha256(view[:at])
    h.update(_ZERO)
    h.update(view[at + 64:])
    return h.hexdigest().encode()


def _checksum_at(blob: bytes, name: str = "the bundle") -> int:
    n = int.from_bytes(blob[:8], "little")
    at = blob.find(_MARK, 8, 8 + n)
    if at < 0:
        raise ArtifactError(f"{name} is not a myxtts bundle (a safetensors file without a "
                            f"myxtts checksum, or a damaged bundle); export one with `myxtts "
                            f"export RUN -o FILE`")
    return at + len(_MARK)


def _header(blob: bytes, path: Path) -> tuple[dict[str, Any], int]:
    """The parsed safetensors header and where the tensor bytes start; ArtifactError naming
    the file for anything that is no bundle, a truncated one or one of a newer format."""
    again = "copy it again or export it again with `myxtts export RUN -o FILE`"
    if not blob:
        raise ArtifactError(f"{path} is empty (0 bytes: a copy or write that never finished); "
                            f"{again}")
    n = int.from_bytes(blob[:8], "little") if len(blob) >= 8 else -1
    if n < 2 or blob[8:9] != b"{":
        raise ArtifactError(f"{path} is not a myxtts model bundle, checkpoint or run folder; "
                            f"pass one written by `myxtts export` or `myxtts train`")
    if len(blob) < 8 + n:
        raise ArtifactError(f"{path} is truncated ({len(blob)} bytes, its header alone needs "
                            f"{8 + n}); {again}")
    try:  # a header nests 3 deep ({name: {"shape": [...]}}); bounded before parsing
        header = loads_json(blob[8:8 + n], max_nesting=4)
        meta, end = header.pop("__metadata__", None), max(
            [0, *(int(t["data_offsets"][1]) for t in header.values())])
    except (TooLarge, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        raise ArtifactError(f"{path} is not a myxtts bundle or is damaged (its header cannot be "
                            f"read: {type(e).__name__}); {again}") from None
    if not isinstance(meta, dict) or FORMAT_KEY not in meta:
        raise ArtifactError(f"{path} is a safetensors file but not a myxtts bundle; export one "
                            f"with `myxtts export RUN -o FILE`")
    if not str(meta[FORMAT_KEY]).isdigit() or int(meta[FORMAT_KEY]) > FORMAT:
        version = excerpt(str(meta[FORMAT_KEY]), quote=False)
        raise ArtifactError(f"{path} is a bundle of format {version}, newer than this myxtts "
                            f"reads ({FORMAT}); upgrade myxtts")
    if len(blob) < 8 + n + end:
        raise ArtifactError(f"{path} is truncated ({len(blob)} of {8 + n + end} bytes); {again}")
    return meta, 8 + n


def read_sealed(path: str | Path) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """The metadata and tensors of a bundle file (of any model family), checked byte for
    byte against its checksum; never unpickles."""
    path = Path(path)
    try:
        blob = path.read_bytes()
    except OSError as e:
        raise ArtifactError(f"{path} cannot be read ({e.strerror or e})") from None
    meta, _ = _header(blob, path)
    at = _checksum_at(blob, str(path))
    if blob[at:at + 64] != _digest(blob, at):
        raise ArtifactError(f"{path} has changed since it was exported (its checksum does not "
                            f"match its contents); copy it again or export it again with "
                            f"`myxtts export RUN -o FILE`")
    try:
        tensors = load(blob)
    except Exception as e:  # safetensors' own checks: dtypes, offsets, overlaps
        raise ArtifactError(f"{path}: its tensors cannot be read ({type(e).__name__}: "
                            f"{excerpt(str(e), quote=False)}); not written by myxtts") from None
    return meta, tensors


def bundle_family(path: str | Path) -> str:
    """The model family a bundle holds, read from its header alone (no tensor bytes):
    ``FAMILY_MYXTTS`` for a bundle without the field. Anything unreadable is left to the
    reader (``read_sealed``), which names what is wrong."""
    try:
        with Path(path).open("rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            if not 2 <= n <= MAX_HEADER_BYTES:
                return FAMILY_MYXTTS
            meta = loads_json(fh.read(n), max_nesting=4).get("__metadata__") or {}
    except (OSError, TooLarge, ValueError, AttributeError):
        return FAMILY_MYXTTS
    return str(meta.get(FAMILY_KEY, FAMILY_MYXTTS))


def seal(tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> bytes:
    """The bytes of a bundle: ``tensors`` and ``meta`` (plus the format and the checksum)
    as one safetensors file."""
    return _seal(_serialize(tensors, {FORMAT_KEY: str(FORMAT), **meta}))


def read_bundle(path: str | Path) -> Trained:
    """A bundle file, checked byte for byte against its checksum; never unpickles."""
    path = Path(path)
    meta, tensors = read_sealed(path)
    if meta.get(FAMILY_KEY, FAMILY_MYXTTS) != FAMILY_MYXTTS:
        raise ArtifactError(f"{path} is a bundle of a {excerpt(meta[FAMILY_KEY], quote=False)} "
                            f"model, not of a model trained by `myxtts train`")
    where = str(path)
    split = {p: {k[len(p):]: v for k, v in tensors.items() if k.startswith(p)}
             for p in (MODEL_PREFIX, VOCODER_PREFIX)}
    stray = [k for k in tensors if not k.startswith((MODEL_PREFIX, VOCODER_PREFIX))
             and k not in ("mel_mean", "mel_std")]
    if stray:
        raise ArtifactError(f"{where}: tensor {excerpt(stray[0])} is no field of a bundle "
                            f"(model.*, vocoder.*, mel_mean, mel_std); not written by myxtts")
    config = json_field(where, CONFIG, meta.get(CONFIG))
    vocab = json_field(where, VOCAB, meta.get(VOCAB))
    check_model(where, config, vocab, split[MODEL_PREFIX], tensors.get("mel_mean"),
                tensors.get("mel_std"))
    voc_cfg = meta.get(VOCODER_CONFIG)
    if voc_cfg is None and split[VOCODER_PREFIX]:
        raise ArtifactError(f"{where}: vocoder weights without a field {VOCODER_CONFIG!r}; not "
                            f"written by myxtts")
    if voc_cfg is not None:
        voc_cfg = json_field(where, VOCODER_CONFIG, voc_cfg)
        check_vocoder(where, voc_cfg, split[VOCODER_PREFIX], VOCODER_PREFIX)
    evaluation = meta.get(EVALUATION)
    if evaluation is not None:
        evaluation = json_field(where, EVALUATION, evaluation)
    return Trained(path, config, vocab, split[MODEL_PREFIX], tensors["mel_mean"],
                   tensors["mel_std"], voc_cfg,
                   split[VOCODER_PREFIX] if voc_cfg is not None else None, evaluation)
