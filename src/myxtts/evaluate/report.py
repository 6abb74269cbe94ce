"""What ``myxtts evaluate`` shows and writes: the table per language, the JSON summary and
the per-utterance CSV (``evaluate.harness`` measures)."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

from myxtts.config.bounds import count
from myxtts.evaluate.harness import Evaluation
from myxtts.evaluate.record import json_safe
from myxtts.metrics.scorer import METRICS, summarize
from myxtts.metrics.table import cell, table
from myxtts.system import atomic_write

JSON_FILE, CSV_FILE = "evaluation.json", "utterances.csv"
_TRAINING_KEYS = [("mcd_db", "MCD {} dB", "{:.2f}"), ("f0_rmse_cents", "F0 {} cents", "{:.0f}"),
                  ("voicing_error", "V/UV {}", "{:.3f}"),
                  ("duration_ratio", "duration ratio {}", "{:.2f}"),
                  ("similarity", "SIM {}", "{:.3f}")]


def blocks(ev: Evaluation) -> dict[str, dict[str, dict[str, float | None]]]:
    """``{language or "all": {row: summary}}`` over the rows measured; "all" only when there
    are several languages."""
    languages = sorted({c.language for c in ev.cases})
    groups = {lang: [k for k, c in enumerate(ev.cases) if c.language == lang] for lang in languages}
    if len(languages) > 1:
        groups["all"] = list(range(len(ev.cases)))
    return {name: {row: summarize([ev.scores[row][k] for k in idx]) for row in ev.rows}
            for name, idx in groups.items()}


def training_line(record: dict[str, Any] | None) -> str | None:
    """One line of the run's last evaluation in training, or None without one."""
    if not record:
        return None
    m = record.get("metrics", {})
    parts = [label.format(cell(m.get(key), fmt)) for key, label, fmt in _TRAINING_KEYS
             if m.get(key) is not None]
    return (f"last evaluation in training (step {record.get('step', '?')}, "
            f"{record.get('utterances', '?')} utterances, model vs its vocoded truth): "
            + (", ".join(parts) or "no metrics"))


def text_report(ev: Evaluation) -> str:
    head = (f"{ev.model} on {ev.data} ({ev.split} split): {count(len(ev.cases), 'utterance')}, "
            f"vocoder {ev.vocoder}, ASR {ev.asr}, {ev.device}")
    lines = [head, "", table(blocks(ev))]
    if ev.notes:
        lines += [""] + [f"note: {n}" for n in ev.notes]
    training = training_line(ev.training)
    if training:
        lines += ["", training]
    return "\n".join(lines)


def to_json(ev: Evaluation) -> dict[str, Any]:
    return json_safe({"model": ev.model, "data": ev.data, "split": ev.split,
                    "vocoder": ev.vocoder, "asr": ev.asr, "device": ev.device,
                    "utterances": len(ev.cases), "summary": blocks(ev), "notes": ev.notes,
                    "training_evaluation": ev.training})


def csv_text(ev: Evaluation) -> str:
    """One line per utterance and row measured: ids, the text, every metric and the
    transcript."""
    buf = io.StringIO()
    keys = list(METRICS) + ["seconds", "transcript"]
    writer = csv.writer(buf)
    writer.writerow(["id", "language", "speaker", "reference_id", "row", "text", *keys])
    for k, case in enumerate(ev.cases):
        for row in ev.rows:
            flat = ev.scores[row][k].flat()
            writer.writerow([case.id, case.language, case.speaker, case.reference_id, row,
                             case.text, *(_csv_value(flat.get(key)) for key in keys)])
    return buf.getvalue()


AUDIO_DIR = "audio"  # the clips --keep-audio keeps, in the output folder


def staging(out: Path) -> Path:
    """Where an evaluation into ``out`` writes until it is done: a hidden folder in ``out``
    (same file system, so moving it in is a rename)."""
    return out / f".evaluation-{os.getpid()}.partial"


def write(ev: Evaluation, out: Path) -> list[Path]:
    """``evaluation.json`` and ``utterances.csv`` (and the clips ``staging(out)/audio`` holds,
    if any) into ``out``, as one set: everything is written into the staging folder first
    and moved in at the end, so an evaluation stopped half-way leaves the previous one's
    files as they were, never new clips beside an old table. Returns what it wrote."""
    stage = staging(out)
    stage.mkdir(parents=True, exist_ok=True)
    atomic_write(stage / JSON_FILE, json.dumps(to_json(ev), indent=1, ensure_ascii=False) + "\n")
    atomic_write(stage / CSV_FILE, csv_text(ev))
    written = [out / JSON_FILE, out / CSV_FILE]
    if (stage / AUDIO_DIR).is_dir():
        old = out / f".{AUDIO_DIR}-{os.getpid()}.old"
        if (out / AUDIO_DIR).is_dir():
            os.replace(out / AUDIO_DIR, old)
        os.replace(stage / AUDIO_DIR, out / AUDIO_DIR)
        shutil.rmtree(old, ignore_errors=True)
        written.append(out / AUDIO_DIR)
    for name in (JSON_FILE, CSV_FILE):
        os.replace(stage / name, out / name)
    shutil.rmtree(stage, ignore_errors=True)
    return written


def _csv_value(value: Any) -> Any:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return round(value, 5) if isinstance(value, float) else value

