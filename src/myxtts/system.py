"""What myxtts needs from the machine: files written atomically, the CPUs it may use.

Why atomic writes everywhere: a run killed at any instant (SIGKILL, OOM killer, power
loss) must leave either the old file or the new one, never half of one. One helper does
it for every file myxtts writes -- checkpoints, configs, store files, prepare's chunks --
and ``fsync`` says how much safety the file needs (see :func:`atomic_open`).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


@contextmanager
def atomic_open(path: str | Path, fsync: bool = True) -> Iterator[BinaryIO]:
    """Write ``path`` through a temp file in the same folder, renamed over ``path`` at the
    end: readers see the old file or the complete new one, never a partial one.

    ``fsync=True`` also flushes the bytes to the disk before the rename, so the new file
    survives an OS crash or power loss (without it, a crash can leave the renamed file
    empty). ``fsync=False`` suits caches that are checked before reuse (prepare's chunks):
    the rename alone is atomic against a killed process, because the page cache outlives it.
    On any error the temp file is removed and ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write(path: str | Path, data: bytes | str, fsync: bool = True) -> None:
    """Write ``data`` (str as UTF-8) to ``path`` atomically (see :func:`atomic_open`)."""
    with atomic_open(path, fsync) as fh:
        fh.write(data.encode("utf-8") if isinstance(data, str) else data)


def available_cpus() -> int:
    """CPUs this process may run on (respects taskset/cgroup affinity, unlike os.cpu_count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - macOS/Windows
        return max(1, os.cpu_count() or 1)
