"""How every command ends when it is stopped: Ctrl-C, SIGTERM and SIGHUP (its terminal
closed) are one quiet line, at any moment, and leave no half-written file behind; a reader
that stops reading the output (``| head``) ends the command quietly (:func:`quiet_stdout`).

Why a handler of our own rather than Python's default: an interrupt raised in the middle of
an import (torch takes ~0.2-2 s to import, most commands import it lazily) leaves that
module half-initialised, and anything that imports it again -- an ``except`` clause, a
cleanup, an ``atexit`` hook -- fails with torch's "duplicate registrations" traceback. So
a signal that arrives while any import is under way ends the process at once
(``os._exit``) after removing the temp file of every atomic write in progress; at any other
moment it raises ``KeyboardInterrupt`` (SIGTERM, SIGHUP: :class:`Terminated`, a subclass), which
unwinds normally: ``finally`` blocks run, ``system.atomic_open`` drops its temp file and
notes that the target was not written, and ``main`` prints one line. A training run
replaces these handlers with its own (``train.run.StopFlag``: save, then stop) while it
trains.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from myxtts.system import remove_unfinished

# An error line longer than this is cut in its middle: its head names the file and the
# problem, its tail the fix; a value quoted in full (a runaway config) never floods a terminal.
MAX_MESSAGE_CHARS = 1200

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}  # 128 + the signal number
if hasattr(signal, "SIGHUP"):  # not on Windows
    EXIT_CODES[signal.SIGHUP] = 129
STOPPED = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}


def stopped_by(signum: int) -> str:
    """How the line names the stop: "interrupted" (Ctrl-C), "terminated" (SIGTERM), "hung up"."""
    return STOPPED.get(signum, "hung up")


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a job scheduler) or SIGHUP (the terminal closed, an ssh connection
    dropped): unwinds like Ctrl-C, reported by ``stopped_by(signum)``."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__()
        self.signum = signum


def one_line(message: str) -> str:
    """``message`` on one line, at most ``MAX_MESSAGE_CHARS`` long (cut in the middle)."""
    text = " ".join(message.splitlines())
    if len(text) <= MAX_MESSAGE_CHARS:
        return text
    head, tail = MAX_MESSAGE_CHARS * 2 // 3, MAX_MESSAGE_CHARS // 3
    return f"{text[:head]} [... {len(text) - head - tail} characters left out ...] {text[-tail:]}"


def importing() -> bool:
    """A module is being imported right now (its ``__spec__._initializing`` is set while its
    code runs, nested imports included)."""
    try:
        modules = list(sys.modules.values())
    except RuntimeError:  # another thread imported meanwhile: treat as an import under way
        return True
    return any(getattr(getattr(m, "__spec__", None), "_initializing", False) for m in modules)


def leave_now(command: str, signum: int) -> None:
    """End the process at once, quietly: temp files of unfinished writes removed, one line."""
    stopped = stopped_by(signum)
    notes = "".join(f"; {p} not written" for p in remove_unfinished())
    try:
        os.write(2, f"{command}: {stopped}{notes}\n".encode(errors="replace"))
    finally:
        os._exit(EXIT_CODES.get(signum, 130))


@contextmanager
def handled_signals(command: Callable[[], str], restore: bool = True) -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP handled as the module doc says while the block runs (``command()``
    names the command in the line); the previous handlers come back after it unless not
    ``restore`` (the real process: an interrupt during the interpreter's teardown then ends
    it quietly too). A signal its parent left ignored (``nohup``, a background job) stays
    ignored. SIGXFSZ (a file past ``ulimit -f``) is ignored, so the write fails with EFBIG
    and is reported like a full disk instead of killing the process."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set in the main thread
        return

    def handle(signum: int, frame: Any) -> None:
        if importing():
            leave_now(command(), signum)
        raise KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)

    def leave(signum: int, frame: Any) -> None:
        leave_now(command(), signum)

    old = {s: signal.getsignal(s) for s in EXIT_CODES}
    if hasattr(signal, "SIGXFSZ"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    for s, h in old.items():
        if h is not signal.SIG_IGN:
            signal.signal(s, handle)
    try:
        yield
    finally:
        for s, h in old.items():
            if h is not signal.SIG_IGN:
                signal.signal(s, h if restore else leave)


def quiet_stdout() -> None:
    """After the reader of standard output went away (``| head -1``: a BrokenPipeError):
    point stdout at /dev/null, so nothing more written there -- nor the interpreter's
    flush at exit -- fails again. What the reader took, it has: the command ends quietly,
    exit code 0, whichever command it was."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
