"""Small helpers shared across concerns: atomic writes and CPU-count aware defaults.

Why atomic writes everywhere: a run killed at any instant (SIGKILL, OOM killer,
power loss) must leave either the old file or the new one, never half of one.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _atomic_write(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file + fsync + rename in the same folder."""
    _atomic_write(Path(path), data)


def atomic_write_text(path: str | Path, text: str) -> None:
    _atomic_write(Path(path), text.encode("utf-8"))


def available_cpus() -> int:
    """CPUs this process may run on (respects taskset/cgroup affinity, unlike os.cpu_count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - macOS/Windows
        return max(1, os.cpu_count() or 1)
