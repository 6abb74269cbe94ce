"""Metric sinks: a JSONL file (always), TensorBoard (when installed), nothing on rank > 0.

Why a small protocol with a no-op stand-in: the training loop calls ``logger.scalars``
unconditionally; whether anything is written (rank, missing tensorboard) is decided
here once, not by ``if`` ladders in the loop.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Protocol

import numpy as np

log = logging.getLogger(__name__)


class MetricLogger(Protocol):
    """Where training's metrics go: what ``build_logger`` returns and the loops hold."""

    def scalars(self, step: int, values: dict[str, float], prefix: str = "") -> None: ...
    def image(self, tag: str, image: np.ndarray, step: int) -> None: ...
    def audio(self, tag: str, wav: np.ndarray, sample_rate: int, step: int) -> None: ...
    def close(self) -> None: ...


class NullLogger:
    def scalars(self, step: int, values: dict[str, float], prefix: str = "") -> None:
        pass

    def image(self, tag: str, image: np.ndarray, step: int) -> None:
        pass

    def audio(self, tag: str, wav: np.ndarray, sample_rate: int, step: int) -> None:
        pass

    def close(self) -> None:
        pass


class JSONLLogger(NullLogger):
    """One JSON object per logged interval: greppable, plottable, and what tests read."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def scalars(self, step: int, values: dict[str, float], prefix: str = "") -> None:
        row: dict[str, Any] = {"step": step, "time": round(time.time(), 3)}
        row.update({f"{prefix}{k}": float(v) for k, v in values.items()})
        self._fh.write(json.dumps(row) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


class TensorBoardLogger(NullLogger):
    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter  # optional: the tensorboard package

        self._w = SummaryWriter(str(log_dir))

    def scalars(self, step: int, values: dict[str, float], prefix: str = "") -> None:
        for k, v in values.items():
            self._w.add_scalar(f"{prefix}{k}", float(v), step)

    def image(self, tag: str, image: np.ndarray, step: int) -> None:
        """``image``: [H, W] float in any range (a mel or an attention map), shown low-to-high."""
        img = np.asarray(image, dtype=np.float32)
        lo, hi = float(img.min()), float(img.max())
        img = (img - lo) / (hi - lo + 1e-8)
        self._w.add_image(tag, img[::-1].copy()[None], step)

    def audio(self, tag: str, wav: np.ndarray, sample_rate: int, step: int) -> None:
        self._w.add_audio(tag, np.asarray(wav, dtype=np.float32)[None], step, sample_rate)

    def close(self) -> None:
        self._w.close()


class FanOut(NullLogger):
    def __init__(self, sinks: list[MetricLogger]):
        self.sinks = sinks

    def scalars(self, step: int, values: dict[str, float], prefix: str = "") -> None:
        for s in self.sinks:
            s.scalars(step, values, prefix)

    def image(self, tag: str, image: np.ndarray, step: int) -> None:
        for s in self.sinks:
            s.image(tag, image, step)

    def audio(self, tag: str, wav: np.ndarray, sample_rate: int, step: int) -> None:
        for s in self.sinks:
            s.audio(tag, wav, sample_rate, step)

    def close(self) -> None:
        for s in self.sinks:
            s.close()


def build_logger(output_dir: Path, rank: int, tensorboard: bool) -> MetricLogger:
    if rank != 0:
        return NullLogger()
    sinks: list[MetricLogger] = [JSONLLogger(output_dir / "metrics.jsonl")]
    if tensorboard:
        try:
            sinks.append(TensorBoardLogger(output_dir / "tensorboard"))
        except ImportError:
            log.warning("tensorboard is not installed: logging to metrics.jsonl only "
                        "(pip install tensorboard, or --set train.tensorboard=false to silence)")
    return FanOut(sinks)
