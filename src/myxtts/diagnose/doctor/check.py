"""A doctor check's record (:class:`Check`), the loader plan the data checks hand the loader
checks (:class:`DataPlan`), and how a list of them is shown and judged.

Statuses: ``ok``; ``warn`` (training works, but slower or without a feature); ``fail``
(training cannot start, or the data is unusable); ``skip`` (does not apply here, e.g.
GPU checks without a GPU). Exit code 1 iff a ``fail``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Status = Literal["ok", "warn", "fail", "skip"]
SYMBOLS = {"ok": "✔", "warn": "⚠", "fail": "✗", "skip": "-"}
ASCII_SYMBOLS = {"ok": "[ok]", "warn": "[!!]", "fail": "[XX]", "skip": "[--]"}


@dataclass(frozen=True)
class Check:
    """One finding. ``fix`` (the command, flag or config key) is set for warn and fail."""

    name: str
    status: Status
    found: str
    fix: str = ""


@dataclass(frozen=True)
class DataPlan:
    """How training would load the data: on the fly (a raw dataset) or from a store, and for
    a healthy store its batch plan (``table``: a ``data.feed.buckets.BucketPlan``) for exact
    sizes."""

    on_the_fly: bool = False
    table: Any = None
    n_mels: int = 0
    batch_cost: tuple[float, int] | None = None  # a store batch's (build seconds, bytes)
    shm: tuple[int, int, str] | None = None  # known shared memory per worker (shm_per_worker)


MAX_PROBLEMS_SHOWN = 3


def integrity(name: str, path: Any, fix: str) -> Check | None:
    """A ``fail`` naming the first problems ``verify_store`` finds in the store at ``path``
    (``fix``: how to make it again), or None when it verifies."""
    from myxtts.data.store import StoreError, verify_store  # deferred: numpy, as the checks

    try:
        problems = verify_store(path)
    except StoreError as e:
        problems = [str(e)]
    if not problems:
        return None
    shown = "; ".join(problems[:MAX_PROBLEMS_SHOWN])
    more = len(problems) - MAX_PROBLEMS_SHOWN
    shown += f" (and {more} more)" if more > 0 else ""
    return Check(name, "fail", f"{len(problems)} problem(s): {shown}", fix)


def exit_code(checks: list[Check]) -> int:
    """1 when anything blocks training (a ``fail``), else 0."""
    return 1 if any(c.status == "fail" for c in checks) else 0


def format_checks(checks: list[Check], ascii_only: bool = False) -> str:
    """One line per check, then the summary line."""
    symbols, dash = (ASCII_SYMBOLS, "-") if ascii_only else (SYMBOLS, "—")
    lines = []
    for c in checks:
        line = f"{symbols[c.status]} {c.name}: "
        line += f"skipped ({c.found})" if c.status == "skip" else c.found
        if c.status in ("warn", "fail"):
            line += f" {dash} {c.fix}"
        lines.append(line)
    n = {s: sum(c.status == s for c in checks) for s in SYMBOLS}
    summary = (f"{len(checks) - n['skip']} checks: {n['ok']} ok, {n['warn']} warning"
               f"{'' if n['warn'] == 1 else 's'}, {n['fail']} blocking")
    if n["skip"]:
        summary += f" ({n['skip']} skipped)"
    return "\n".join(lines + [summary])
