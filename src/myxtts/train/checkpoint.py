"""Checkpoints: everything needed to continue exactly, written atomically, loaded safely.

A checkpoint is a plain dict of tensors and primitives saved with ``torch.save`` and
read back with ``torch.load(weights_only=True)``: no arbitrary pickle, so a checkpoint
from the internet cannot run code. Files: ``ckpt_STEP.pt`` (the last ``keep_last``
kept), ``best.pt`` (lowest validation loss) and ``latest.txt`` naming the newest.
"""

from __future__ import annotations

import io
import logging
import random
import re
from pathlib import Path
from typing import Any

import torch

from myxtts.train.errors import TrainError
from myxtts.utils import atomic_write_bytes, atomic_write_text

log = logging.getLogger(__name__)

# Checkpoint vocabulary, in one place.
MODEL = "model"
OPTIMIZER = "optimizer"
SCHEDULER = "scheduler"
SCALER = "scaler"
SAMPLER = "sampler"
RNG = "rng"
STEP = "step"
CONFIG = "config"
VOCAB = "vocab"
MEL_MEAN = "mel_mean"
MEL_STD = "mel_std"
BEST_VAL = "best_val_loss"
COUNTERS = "counters"
FORMAT = "format_version"
FORMAT_VERSION = 1

_CKPT_RE = re.compile(r"ckpt_(\d+)\.pt$")


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1])}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate((3, tuple(state["python"]), None))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(path: Path, state: dict[str, Any]) -> None:
    buf = io.BytesIO()
    torch.save({FORMAT: FORMAT_VERSION, **state}, buf)
    atomic_write_bytes(path, buf.getvalue())


def load(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise TrainError(f"checkpoint {path} does not exist")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # corrupt, truncated, or not a checkpoint
        raise TrainError(f"checkpoint {path} cannot be read ({type(e).__name__}: "
                         f"{str(e).splitlines()[0][:160]}); delete it to resume from an older one") from e
    if not isinstance(state, dict) or state.get(FORMAT) != FORMAT_VERSION:
        raise TrainError(f"{path} is not a myxtts checkpoint of format {FORMAT_VERSION}")
    return state


class CheckpointManager:
    def __init__(self, directory: Path, keep_last: int):
        self.dir = Path(directory)
        self.keep_last = keep_last

    def step_paths(self) -> list[Path]:
        found = [(int(m.group(1)), p) for p in self.dir.glob("ckpt_*.pt")
                 if (m := _CKPT_RE.search(p.name))]
        return [p for _, p in sorted(found)]

    def latest(self) -> Path | None:
        """Newest readable step checkpoint (a torn newest file falls back to the previous)."""
        pointer = self.dir / "latest.txt"
        if pointer.is_file():
            p = self.dir / pointer.read_text().strip()
            if p.is_file():
                return p
        paths = self.step_paths()
        return paths[-1] if paths else None

    def save(self, state: dict[str, Any], step: int, val_loss: float | None = None,
             is_best: bool = False) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"ckpt_{step:08d}.pt"
        save(path, state)
        atomic_write_text(self.dir / "latest.txt", path.name)
        if is_best:
            save(self.dir / "best.pt", state)
            atomic_write_text(self.dir / "best.txt", f"{path.name} val_loss={val_loss}\n")
        for old in self.step_paths()[: -self.keep_last] if self.keep_last > 0 else []:
            if old != path:
                old.unlink(missing_ok=True)
        return path
