"""The checkpoint format: everything needed to continue exactly, written atomically, loaded
safely.

A checkpoint is a plain dict of tensors and primitives saved with ``torch.save`` and
read back with ``torch.load(weights_only=True)``: no arbitrary pickle, so a checkpoint
from the internet cannot run code. Its keys are the constants below; a sha256 of its
contents travels inside the file (:func:`save`, checked by :func:`load`).

How far a run got is ONE record, :class:`TrainingProgress` (step, best validation loss,
data position); the engines' ``state_dict`` supplies the rest: weights, optimizer, schedule,
scaler, weight average, the random streams (:func:`rng_state`) and the non-finite counts.
The files of a run folder (``ckpt_STEP.pt``, ``best.pt``, ``latest.txt``) are
``artifacts.runs``'.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import logging
import math
import pickle
import random
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from myxtts.artifacts.errors import ArtifactError
from myxtts.artifacts.readback import ZIP_MAGIC, bundle_instead, file_kind
from myxtts.config.bounds import excerpt
from myxtts.system import atomic_write

log = logging.getLogger(__name__)

# Checkpoint vocabulary, in one place.
MODEL = "model"
OPTIMIZER = "optimizer"
SCHEDULER = "scheduler"
SCALER = "scaler"
RNG = "rng"  # rank 0's streams (the only ones of a single-process run)
RNG_RANKS = "rng_ranks"  # under DDP: every rank's streams, in rank order
PROGRESS = "progress"  # TrainingProgress.state_dict()
CONFIG = "config"
VOCAB = "vocab"
MEL_MEAN = "mel_mean"
MEL_STD = "mel_std"
EMA = "ema"  # the weights' moving average (train.ema_decay > 0): ema.WeightAverage.state_dict()
# the TTS engine's non-finite steps, {"steps": in total, "in_row": in a row now}: the count
# that stops a diverging run (train.max_nonfinite_in_row) continues across a restart
NONFINITE = "nonfinite"
FORMAT = "format_version"
# 1: progress spread over step / best_val_loss / counters / sampler keys;
# 2: the non-finite counts inside the progress record
FORMAT_VERSION = 3

DIGEST_ENTRY = ".myxtts_sha256"  # zip entry: sha256 of every other entry (name and bytes)
# Declared contents beyond this many times the file's size (plus a little) are refused
# unread: torch.save stores tensors uncompressed, so a checkpoint's zip entries add up to
# about its size; more means compressed entries (a "zip bomb").
_SIZE_FACTOR, _SIZE_SLACK = 2, 1 << 20


@dataclass
class TrainingProgress:
    """How far a run got: what resume needs besides weights, optimizer and RNG states.

    ``epoch`` / ``batches_consumed``: the data position -- this rank has trained on the
    first ``batches_consumed`` batches of ``epoch``; ``data_plan`` is what that position
    depends on (the sampler's ``plan_state``: seed, ranks, batch plan, lengths), checked
    when the sampler resumes.
    """

    step: int = 0
    best_val_loss: float = math.inf
    epoch: int = 0
    batches_consumed: int = 0
    data_plan: dict[str, Any] = field(default_factory=dict)

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> TrainingProgress:
        """Every key consumed, none unknown: a record from another version is refused, not
        half-read."""
        if not isinstance(state, dict):
            raise ArtifactError(f"training progress in the checkpoint is a {type(state).__name__}, "
                                f"not a record; the checkpoint was not written by myxtts")
        left = dict(state)
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name not in left:
                raise ArtifactError(f"training progress in the checkpoint misses {f.name!r}; it "
                                    f"was written by another myxtts version")
            values[f.name] = left.pop(f.name)
        if left:
            raise ArtifactError(f"training progress in the checkpoint has unknown keys "
                                f"{sorted(left)}; it was written by another myxtts version")
        return cls(**values)


def rng_state(device: torch.device | None = None) -> dict[str, Any]:
    """The random streams a resumed run continues: the CPU's, Python's and, when training on
    a GPU, that GPU's alone -- not every visible GPU's, which a machine with fewer GPUs could
    not restore (and which made a CPU run on a GPU machine initialise CUDA)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1])}
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def compose(progress: TrainingProgress, parts: dict[str, Any], extra: dict[str, Any],
            rng_ranks: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A checkpoint dict: ``parts`` (an engine's ``state_dict``: weights, optimizers, random
    streams, ...), ``progress`` and ``extra`` (what readers need: config, vocabulary, mel
    statistics, a kind). ``rng_ranks``: under DDP, every rank's streams (gathered by the
    caller), so each rank resumes its own."""
    state = {**parts, PROGRESS: progress.state_dict(), **extra}
    if rng_ranks is not None and len(rng_ranks) > 1:
        state[RNG_RANKS] = rng_ranks
    return state


def restore_rng(state: dict[str, Any], device: torch.device | None = None, rank: int = 0,
                world_size: int = 1) -> None:
    """Put back the random streams a checkpoint holds (:data:`RNG`, and :data:`RNG_RANKS`
    from :func:`compose`). Under DDP each rank takes its own;
    from a checkpoint without them (written before they were saved) the other ranks keep the
    streams they were seeded with, which at least differ from rank 0's."""
    per_rank = state.get(RNG_RANKS)
    if isinstance(per_rank, list) and len(per_rank) == world_size:
        set_rng_state(per_rank[rank], device)
    elif rank == 0:
        set_rng_state(state[RNG], device)


def set_rng_state(state: dict[str, Any], device: torch.device | None = None) -> None:
    """Put back :func:`rng_state`'s streams; the saved GPU stream goes to ``device`` (a run
    may resume on another GPU). A saved list (one stream per visible GPU) gives its first,
    the training GPU's (``cuda:0`` unless ``CUDA_VISIBLE_DEVICES`` chose another)."""
    torch.set_rng_state(state["torch"])
    random.setstate((3, tuple(state["python"]), None))
    cuda = state.get("cuda")
    if cuda is None or device is None or device.type != "cuda":
        return
    if isinstance(cuda, (list, tuple)):
        if not cuda:
            return
        cuda = cuda[0]
    torch.cuda.set_rng_state(cuda, device)


def save(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically, with the sha256 of its contents inside."""
    buf = io.BytesIO()
    torch.save({FORMAT: FORMAT_VERSION, **state}, buf)
    with zipfile.ZipFile(buf, "a") as z:
        prefix = z.infolist()[0].filename.split("/")[0]
        entry = zipfile.ZipInfo(f"{prefix}/{DIGEST_ENTRY}", date_time=(1980, 1, 1, 0, 0, 0))
        z.writestr(entry, _contents_digest(z))
    atomic_write(path, buf.getvalue())


def _contents_digest(z: zipfile.ZipFile) -> str:
    """sha256 over every entry but the digest itself, by name, in name order (zipfile also
    checks each entry's CRC-32 as it reads it)."""
    h = hashlib.sha256()
    for info in sorted(z.infolist(), key=lambda i: i.filename):
        if info.filename.endswith("/" + DIGEST_ENTRY):
            continue
        h.update(info.filename.encode() + b"\0" + str(info.file_size).encode() + b"\0")
        h.update(z.read(info))
    return h.hexdigest()


def _check_contents(path: Path, blob: bytes) -> None:
    """ArtifactError naming ``path`` when its zip entries declare far more bytes than the file
    holds, or its contents do not match the digest saved with them (a checkpoint written
    without one passes)."""
    try:
        z = zipfile.ZipFile(io.BytesIO(blob))
    except zipfile.BadZipFile:
        return  # not a zip: torch.load says what it is
    with z:
        declared = sum(i.file_size for i in z.infolist())
        if declared > _SIZE_FACTOR * len(blob) + _SIZE_SLACK:
            raise ArtifactError(f"checkpoint {path} declares {declared / 2**20:.0f} MiB of "
                                f"contents in a file of {len(blob) / 2**20:.1f} MiB; refused "
                                f"unread (not written by myxtts)")
        saved = [i for i in z.infolist() if i.filename.endswith("/" + DIGEST_ENTRY)]
        if not saved:
            return
        try:
            ok = z.read(saved[0]).decode("ascii", "replace") == _contents_digest(z)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError):
            ok = False
        if not ok:
            raise ArtifactError(f"checkpoint {path} is damaged (its contents do not match their "
                                f"checksum); delete it to resume from an older one")


def load(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"checkpoint {path} does not exist")
    if path.stat().st_size == 0:
        raise ArtifactError(f"checkpoint {path} is empty (0 bytes: a write that never finished); "
                            f"delete it to resume from an older one")
    try:
        blob = path.read_bytes()
    except OSError as e:
        raise ArtifactError(f"checkpoint {path} cannot be read ({e.strerror or e})") from e
    if not blob.startswith(ZIP_MAGIC):  # torch.save writes a zip: this is something else
        if file_kind(path) == "bundle":
            raise bundle_instead(path)
        raise ArtifactError(f"checkpoint {path} cannot be read: it is no file torch.save wrote "
                            f"(it starts with {excerpt(blob[:8])}); pass a checkpoint of "
                            f"`myxtts train` or its run folder")
    _check_contents(path, blob)
    try:
        state = torch.load(io.BytesIO(blob), map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:  # weights_only refused a pickled object
        raise ArtifactError(f"checkpoint {path} holds Python objects besides tensors and plain "
                            f"values, so it was not written by myxtts; refused unread (loading "
                            f"it could run code)") from e
    except Exception as e:  # corrupt, truncated, or not a checkpoint
        why = (str(e).strip().splitlines() or [""])[0].rstrip(".")
        raise ArtifactError(f"checkpoint {path} cannot be read ({type(e).__name__}"
                            f"{': ' + excerpt(why, 200, quote=False) if why else ''}); "
                            f"delete it to resume from an older one") from e
    if isinstance(state, dict) and state.get(FORMAT) == 1:
        state = _upgrade_v1(state)
    if isinstance(state, dict) and state.get(FORMAT) == 2:
        state = _upgrade_v2(state)
    if not isinstance(state, dict) or state.get(FORMAT) != FORMAT_VERSION:
        raise ArtifactError(f"{path} is not a myxtts checkpoint of format {FORMAT_VERSION}")
    return state


def _upgrade_v1(state: dict[str, Any]) -> dict[str, Any]:
    """A format-1 checkpoint (no progress record) in the format-2 layout: its step, best
    loss, counters and full sampler state become the progress record."""
    sampler = dict(state.pop("sampler"))
    counters = state.pop("counters")
    progress = {"step": int(state.pop("step")), "best_val_loss": float(state.pop("best_val_loss")),
                "epoch": int(sampler.pop("epoch")), "batches_consumed": int(sampler.pop("position")),
                "nonfinite_steps": int(counters.get("nonfinite_steps", 0)), "nonfinite_in_row": 0,
                "data_plan": sampler}
    return {**state, FORMAT: 2, PROGRESS: progress}


def _upgrade_v2(state: dict[str, Any]) -> dict[str, Any]:
    """A format-2 checkpoint in the current layout: the non-finite counts move from the
    progress record to their own entry (:data:`NONFINITE`; a vocoder's were always 0)."""
    progress = state.get(PROGRESS)
    if not isinstance(progress, dict):  # TrainingProgress.from_state_dict names what is wrong
        return {**state, FORMAT: FORMAT_VERSION}
    progress = dict(progress)
    counts = {"steps": int(progress.pop("nonfinite_steps", 0)),
              "in_row": int(progress.pop("nonfinite_in_row", 0))}
    return {**state, FORMAT: FORMAT_VERSION, PROGRESS: progress, NONFINITE: counts}


