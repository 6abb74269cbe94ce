"""What myxtts needs from the machine: files written atomically, one writer per folder, the
CPUs it may use.

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
from typing import Any, BinaryIO

LOCK_FILE = ".lock"


def _umask_at_import() -> int:
    """The umask as the process started (``os.umask`` can only be read by setting it: done
    once here, at import, before any thread of ours could create a file in between)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_IMPORT_UMASK = _umask_at_import()


def current_umask() -> int:
    """The process's umask now, read without changing it (Linux: ``/proc/self/status``);
    elsewhere the one it had when myxtts was imported."""
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return _IMPORT_UMASK


class FolderError(RuntimeError):
    """A folder myxtts must write cannot be used; the message names it and the fix."""


class FolderBusy(FolderError):
    """Another live process holds the folder's lock; the message names it."""


@contextmanager
def atomic_open(path: str | Path, fsync: bool = True) -> Iterator[BinaryIO]:
    """Write ``path`` through a temp file in the same folder, renamed over ``path`` at the
    end: readers see the old file or the complete new one, never a partial one. The file
    gets the mode a plainly created one would (0666 minus the umask): ``mkstemp`` makes its
    temp files 0600, which would leave a shared store, checkpoint or bundle readable by
    its owner alone.

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
        if hasattr(os, "fchmod"):  # not on Windows, whose files have no such modes
            os.fchmod(fd, 0o666 & ~current_umask())
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


ALLOC_CONF_KEYS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")  # torch reads either
EXPANDABLE_SEGMENTS = "expandable_segments:True"
allocator_defaulted = False  # default_allocator_settings() set it in this process


def default_allocator_settings(env: Any = None) -> bool:
    """Unless the user configured torch's CUDA caching allocator (either key of
    ``ALLOC_CONF_KEYS``), ask it for expandable segments: each pool grows and shrinks one
    virtual range instead of collecting fixed segments, so hours of interleaved bucket
    shapes, prefetched batches and validation do not fragment the GPU's memory into blocks
    no later batch fits. Where torch cannot expand segments (another platform, a CUDA graph
    pool in some versions) it keeps its default. Returns whether it set it; must run before
    the first CUDA allocation, which reads it once (the CLI calls it first thing)."""
    global allocator_defaulted
    env = os.environ if env is None else env
    if os.name != "posix" or any(env.get(k) for k in ALLOC_CONF_KEYS):
        return False
    env[ALLOC_CONF_KEYS[0]] = EXPANDABLE_SEGMENTS
    allocator_defaulted = env is os.environ
    return True


def available_cpus() -> int:
    """CPUs this process may run on (respects taskset/cgroup affinity, unlike os.cpu_count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - macOS/Windows
        return max(1, os.cpu_count() or 1)


@contextmanager
def folder_lock(folder: str | Path, command: str) -> Iterator[None]:
    """Hold ``FOLDER/.lock`` while ``command`` writes the folder: a second writer (two
    `myxtts train` into one --output-dir would interleave metrics and overwrite each other's
    checkpoints) gets :class:`FolderBusy` naming the folder and the process that holds it.

    ``flock``: the kernel drops the lock when its process dies, even by SIGKILL, so a stale
    lock file left by a killed run is simply taken over. The file records the holder's pid
    and command for the message. Without ``fcntl`` (Windows) nothing is locked."""
    folder = Path(folder)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    path = folder / LOCK_FILE
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fh: Any = open(path, "a+")  # noqa: SIM115 - stays open while the folder is written
    except OSError as e:  # read-only file system, no permission, a file in the way
        raise FolderError(f"cannot write {folder} ({e.strerror or e}); choose a folder you can "
                          f"write") from None
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            raise FolderBusy(f"{folder} is being written by {holder} right now; wait for it to "
                             f"finish (or stop it), or use another folder") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} (`{command}`)")
        fh.flush()
        yield
    finally:
        fh.close()  # releases the lock; the file stays (removing it could race a new writer)


def writable_folder(folder: str | Path, what: str = "") -> Path:
    """``folder``, created if need be, checked to take new files before any work starts
    (``what`` names the flag for the message, e.g. ``--out``); :class:`FolderError` if not:
    a read-only file system, no permission, or a file where the folder should be."""
    folder = Path(folder)
    hint = f" {what}" if what else ""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FolderError(f"cannot write {folder} ({e.strerror or e}); choose another{hint or ' folder'}"
                          ) from None
    try:  # the one test that also holds for root on a read-only file system: write a file
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise FolderError(f"cannot write {folder} ({e.strerror or e}); choose another"
                          f"{hint or ' folder'}") from None
    return folder


def path_kind(path: str | Path) -> str:
    """What is at ``path``, in words, without opening it (opening a FIFO blocks):
    ``"a file"``, ``"a folder"``, ``"a FIFO (named pipe)"``, ``"a character device"``,
    ``"a symbolic link loop"``, ``"a broken symbolic link"``, ... or ``"nothing"``."""
    import errno
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a symbolic link loop"
        if os.path.lexists(path):
            return "a broken symbolic link" if os.path.islink(path) else f"unreadable ({e.strerror})"
        return "nothing"
    for test, words in ((stat.S_ISREG, "a file"), (stat.S_ISDIR, "a folder"),
                        (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                        (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return words
    return "not a regular file"
