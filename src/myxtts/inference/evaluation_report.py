"""What ``myxtts evaluate`` shows and writes: the table per language, the JSON summary and
the per-utterance CSV (``inference.evaluation`` measures)."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from myxtts.artifacts.evaluation import json_safe
from myxtts.evaluate.report import cell, table
from myxtts.evaluate.scorer import METRICS, summarize
from myxtts.inference.evaluation import ROWS, Evaluation
from myxtts.system import atomic_write

JSON_FILE, CSV_FILE = "evaluation.json", "utterances.csv"
_TRAINING_KEYS = [("mcd_db", "MCD {} dB", "{:.2f}"), ("f0_rmse_cents", "F0 {} cents", "{:.0f}"),
                  ("voicing_error", "V/UV {}", "{:.3f}"),
                  ("duration_ratio", "duration ratio {}", "{:.2f}"),
                  ("similarity", "SIM {}", "{:.3f}")]


def blocks(ev: Evaluation) -> dict[str, dict[str, dict[str, float | None]]]:
    """``{language or "all": {row: summary}}``; "all" only when there are several languages."""
    languages = sorted({c.language for c in ev.cases})
    groups = {lang: [k for k, c in enumerate(ev.cases) if c.language == lang] for lang in languages}
    if len(languages) > 1:
        groups["all"] = list(range(len(ev.cases)))
    return {name: {row: summarize([ev.scores[row][k] for k in idx]) for row in ROWS}
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
    head = (f"{ev.model} on {ev.data} ({ev.split} split): {len(ev.cases)} utterances, "
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
    """One line per utterance and row: ids, the text, every metric and the transcript."""
    buf = io.StringIO()
    keys = list(METRICS) + ["seconds", "transcript"]
    writer = csv.writer(buf)
    writer.writerow(["id", "language", "speaker", "reference_id", "row", "text", *keys])
    for k, case in enumerate(ev.cases):
        for row in ROWS:
            flat = ev.scores[row][k].flat()
            writer.writerow([case.id, case.language, case.speaker, case.reference_id, row,
                             case.text, *(_csv_value(flat.get(key)) for key in keys)])
    return buf.getvalue()


def write(ev: Evaluation, out: Path) -> list[Path]:
    """``evaluation.json`` and ``utterances.csv`` in ``out`` (atomically)."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / JSON_FILE, json.dumps(to_json(ev), indent=1, ensure_ascii=False) + "\n")
    atomic_write(out / CSV_FILE, csv_text(ev))
    return [out / JSON_FILE, out / CSV_FILE]


def _csv_value(value: Any) -> Any:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return round(value, 5) if isinstance(value, float) else value

