"""Memory maps of store files, and the one line a process prints when one shrinks under it.

A page of a map read past the end of a file that was truncated after it was mapped raises
SIGBUS. Python cannot handle that signal (its handler only sets a flag and returns to the
faulting read, which faults again), so a training run with 0 loader workers ended with a
bare "Bus error". Where libc's ``sigaction`` is reachable (Linux on x86-64 and AArch64),
the first map installs a process-wide handler that finds the mapped file the faulting
address belongs to, writes one line naming it and exits with 128 + SIGBUS, as the signal
would. The handler runs once (``SA_RESETHAND``): a fault inside it ends the process with
the default action. Checkpoints already written stand (they are written atomically); the
line says how to resume. Loader worker processes replace it with torch's own handler,
whose death the trainer reports (``train.tts``).
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import signal
import sys
import weakref
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

_SA_SIGINFO = 0x4
_SA_RESETHAND = 0x80000000
_SI_ADDR_OFFSET = 16  # siginfo_t: signo, errno, code, padding, then the address (64-bit Linux)

_maps: dict[int, tuple[int, str]] = {}  # start address -> (end address, file)
_handler: object = None  # the installed ctypes callback, kept alive for the process


def map_file(path: Path, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """``path`` mapped read-only as an array of ``dtype`` and ``shape``, registered so a
    fault past its end names it."""
    array = np.memmap(path, dtype=dtype, mode="r", shape=shape)
    start = int(array.ctypes.data)
    _maps[start] = (start + int(array.nbytes), str(path))
    weakref.finalize(array, _maps.pop, start, None)  # (views keep the map, and it, alive)
    _install()
    return array


def mapped_file(address: int) -> str | None:
    """The registered file whose map holds ``address`` (None: no store file's)."""
    for start, (end, path) in list(_maps.items()):
        if start <= address < end:
            return path
    return None


def bus_error_line(address: int) -> str:
    """What the process says before it exits on SIGBUS at ``address``."""
    path = mapped_file(address)
    what = (f"{path} shrank while this run read it (truncated or replaced)" if path else
            "a memory-mapped file shrank while this process read it")
    return (f"error: {what}; the checkpoints already written stand: check the store with "
            f"`myxtts prepare --verify STORE`, restore or rebuild it, then run the same command "
            f"to resume\n")


def _on_bus_error(signum: int, info: int, context: int) -> None:
    address = ctypes.c_void_p.from_address(info + _SI_ADDR_OFFSET).value or 0
    try:
        os.write(2, bus_error_line(address).encode())
    finally:
        os._exit(128 + signum)


def _install() -> None:
    """The SIGBUS handler, once per process, where the platform allows (else nothing: the
    signal keeps its default action)."""
    global _handler
    if _handler is not None or sys.platform != "linux" or \
            platform.machine() not in ("x86_64", "aarch64"):
        return
    callback_type = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)

    class SigAction(ctypes.Structure):  # glibc's struct sigaction on these two machines
        _fields_ = [("sa_sigaction", callback_type), ("sa_mask", ctypes.c_ulong * 16),
                    ("sa_flags", ctypes.c_int), ("sa_restorer", ctypes.c_void_p)]

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        callback = callback_type(_on_bus_error)
        action = SigAction(sa_sigaction=callback,
                           sa_flags=ctypes.c_int(_SA_SIGINFO | _SA_RESETHAND).value)
        if libc.sigaction(int(signal.SIGBUS), ctypes.byref(action), None) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    except (OSError, AttributeError) as e:  # e.g. a libc without sigaction by that name
        log.debug("no SIGBUS handler for store maps: %s", e)
        _handler = False
        return
    _handler = callback
