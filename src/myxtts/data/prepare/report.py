"""What ``prepare`` tells the user: ``report.json`` (every rejected utterance with its reason,
every clip kept after a fix, the reader's skipped rows) and the summary it prints.

Why a clip kept after a fix is listed like a rejection: a scaled-down or one-channel clip
trains, but the user should know their data holds it (a level or wiring fault upstream),
and a log line scrolled past in a parallel prepare is easy to miss.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from myxtts.data.prepare.records import SPLITS, first_per_reason, speaker_label
from myxtts.data.store.format import MANIFEST, REPORT

Rows = list[dict[str, str]]  # {"split", "id", "audio_path", "reason", "detail"}


def count_reasons(rows: Rows) -> dict[str, int]:
    """reason -> count, the most common first."""
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["reason"]] = counts.get(r["reason"], 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def format_counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{reason}: {n}" for reason, n in counts.items()) or "none"


def report_blob(rejections: Rows, dataset_report: Any, fixes: Rows) -> bytes:
    """``report.json``'s bytes."""
    report = {"rejected": rejections, "counts_by_reason": count_reasons(rejections),
              "fixed": fixes, "counts_by_fix": count_reasons(fixes),
              "dataset_problems": [asdict(p) for p in dataset_report.problems],
              "dataset_problem_counts": dataset_report.counts_by_reason()}
    return (json.dumps(report, indent=1, ensure_ascii=False) + "\n").encode()


def _rows(rows: Rows) -> list[str]:
    """The first few of each reason, one line each (``report.json`` has them all)."""
    return [f"    {r['reason']}: {r['audio_path']} [{r['id']}] {r.get('detail', '')}".rstrip()
            for r in first_per_reason(rows)]


def summary_lines(out: Path, split_stats: dict[str, Any], rejected: dict[str, int],
                  dataset_report: Any, speakers: list[str], rejections: Rows, fixes: Rows,
                  max_speakers: int = 20) -> str:
    """The summary ``prepare`` prints: kept/rejected/fixed, skipped rows, splits, speakers."""
    kept = sum(split_stats[s]["utterances"] for s in SPLITS)
    n_rej = sum(rejected.values())
    lines = [f"prepared {out}: kept {kept} of {kept + n_rej} utterances, rejected {n_rej}"
             + (f" ({format_counts(rejected)})" if n_rej else "")]
    lines += _rows(rejections)
    if fixes:
        lines.append(f"  kept after a fix: {len(fixes)} ({format_counts(count_reasons(fixes))})")
        lines += _rows(fixes)
    if len(dataset_report):
        lines.append(f"  dataset rows skipped by the reader: {len(dataset_report)} "
                     f"({format_counts(dataset_report.counts_by_reason())})")
        lines += [f"    {p.format()}" for p in first_per_reason(dataset_report.problems)]
        if dataset_report.language_fix is not None:
            lines.append(f"  {dataset_report.language_fix.line()}")
    for s in SPLITS:
        st = split_stats[s]
        lines.append(f"  {s:<5} {st['utterances']:>7} utterances  {st['hours']:8.3f} h  "
                     f"{st['frames']:>10} frames  {len(st['speakers'])} speakers")
    lines.append("  (hours of the clips kept, after trimming their leading and trailing silence: "
                 "inspect-data counts every clip whole)")
    lines.append(f"  hours per speaker (train + val), {len(speakers)} speakers:")
    totals = {sp: sum(split_stats[s]["speakers"].get(sp, {}).get("hours", 0.0) for s in SPLITS)
              for sp in speakers}
    ranked = sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))
    for sp, h in ranked[:max_speakers]:
        lines.append(f"    {speaker_label(sp):<24} {h:8.3f} h")
    if len(ranked) > max_speakers:
        lines.append(f"    ... and {len(ranked) - max_speakers} more (see {out / MANIFEST})")
    if n_rej or fixes:
        lines.append(f"  rejected and fixed utterances, with reasons: {out / REPORT}")
    return "\n".join(lines)
