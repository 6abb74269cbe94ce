"""A run's last evaluation in training: ``RUN/evaluation.json``.

The evaluation in training (``evaluate.training``, every ``train.eval_every`` steps)
rewrites it, atomically, after each evaluation: ``{"step": N, "utterances": K, "vocoder":
..., "metrics": {name: value}}``. ``myxtts export`` reads it and carries it into the bundle,
and ``myxtts evaluate`` prints it beside its own numbers. It is a report, not state: a
damaged file is ignored with a warning, never an error. Also here: ``json_safe``, the strict
JSON every evaluation file is written as.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from myxtts.artifacts.runs import run_folder
from myxtts.system import atomic_write

log = logging.getLogger(__name__)

EVALUATION_FILE = "evaluation.json"


def write_evaluation(run_dir: str | Path, record: dict[str, Any]) -> Path:
    """Write ``record`` as the run's last evaluation (NaN and None values as JSON null)."""
    path = Path(run_dir) / EVALUATION_FILE
    atomic_write(path, json.dumps(json_safe(record), indent=1) + "\n")
    return path


def read_evaluation(run: str | Path) -> dict[str, Any] | None:
    """The last evaluation of the run ``run`` (a run folder or one of its checkpoints), or
    None when it has none or the file is unreadable (warned)."""
    folder = run_folder(run)
    path = folder / EVALUATION_FILE if folder is not None else None
    if path is None or not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        log.warning("%s cannot be read (%s); the run's last evaluation is left out", path, e)
        return None
    if not isinstance(record, dict) or not isinstance(record.get("metrics"), dict):
        log.warning("%s is not an evaluation record; left out", path)
        return None
    return record


def json_safe(value: Any) -> Any:
    """``value`` with every NaN or infinity (nested in dicts and lists) as None: strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value
