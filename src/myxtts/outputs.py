"""The outputs a user names for a command, checked before any work starts.

``-`` means standard output where the command says so; a folder is no file; an output is
never one of the command's own inputs (also through a symbolic or hard link) nor an
existing file of another kind; a folder the command made is not left behind empty when it
fails. Each refusal is one :class:`OutputError` line naming the flag, the path and the fix.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from myxtts.system import LOCK_FILE, FolderError, path_kind, writable_folder

STDOUT = "-"  # the output name that means standard output, where a command allows it


class OutputError(FolderError):
    """An output path the user named cannot be used as given (``-`` where standard output
    makes no sense, a folder for a file, one of the command's own inputs, a file of another
    kind); the message names the flag, the path and the fix."""


@dataclass(frozen=True)
class FileKind:
    """What a command writes, for :func:`output_file`: an existing file is replaced only
    when ``test(path)`` says it is one (a file of another kind is the user's, never
    overwritten by something else). ``name`` in words: ``"a WAV file"``."""

    name: str
    test: Callable[[Path], bool]


def same_file(a: str | Path, b: str | Path) -> bool:
    """``a`` and ``b`` are one file or folder: the same (device, inode) -- a symbolic or hard
    link to it counts -- or, for paths that do not exist, the same resolved path."""
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def is_inside(path: str | Path, folder: str | Path) -> bool:
    """``path`` (resolved through links, existing or not) is ``folder`` or lies under it."""
    p, f = Path(path).expanduser().resolve(), Path(folder).expanduser().resolve()
    return p == f or f in p.parents or same_file(p, f)


Inputs = Iterable[tuple[str, str | Path | None]]  # (what it is, in words; its path)


def _refuse_stdout(value: str, flag: str, what: str) -> None:
    if value == STDOUT:
        raise OutputError(f"{flag} -: {what}, not standard output; give a name")
    if not value.strip():
        raise OutputError(f"{flag} is empty; give a name")


def output_file(value: str | Path, flag: str, kind: FileKind, inputs: Inputs = (),
                stdout: bool = False) -> Path | None:
    """The file a command will write for ``flag``, checked before any work: ``-`` is
    standard output where ``stdout`` allows it (then None), else refused; a folder, a
    device or FIFO, one of ``inputs`` (also through a symbolic or hard link) and an existing
    file that is not ``kind`` are refused (:class:`OutputError` naming what is there); the
    folder must take new files (:class:`FolderError`)."""
    if str(value) == STDOUT and stdout:
        return None
    _refuse_stdout(str(value), flag, f"this command writes {kind.name}")
    path = Path(value)
    there = path_kind(path)
    if there == "a folder":
        raise OutputError(f"{flag} {path} is a folder; give the name of {kind.name} to write")
    if there not in ("nothing", "a file", "a broken symbolic link"):
        hint = " (use - for standard output)" if stdout else ""
        raise OutputError(f"cannot write {flag} {path}: it is {there}, not a file; give the "
                          f"name of {kind.name} to write{hint}")
    for what, source in inputs:
        if source is not None and path_kind(source) == "a file" and same_file(path, source):
            raise OutputError(f"{flag} {path} is {what} ({source}), which this command reads; "
                              f"writing it would replace its own input: choose another name")
    if there == "a file" and path.stat().st_size and not kind.test(path):
        raise OutputError(f"{flag} {path} exists and is not {kind.name}; it is left alone: "
                          f"choose another name (or move that file away first)")
    writable_folder(path.parent, flag)
    return path


def output_folder(value: str | Path, flag: str, inputs: Inputs = (), create: bool = True) -> Path:
    """The folder a command will write for ``flag``, checked before any work: ``-`` and a
    file are refused, so is a folder that is one of ``inputs`` or lies inside one (a run or
    store written into the data it reads); made if need be and checked to take files
    (unless not ``create``: for commands that make it themselves and remove it again
    when they fail)."""
    _refuse_stdout(str(value), flag, "this command writes a folder")
    path = Path(value)
    there = path_kind(path)
    if there not in ("nothing", "a folder"):
        raise OutputError(f"cannot write {flag} {path}: it is {there}, not a folder; give a "
                          f"folder to write")
    for what, source in inputs:
        if source is not None and path_kind(source) != "nothing" and is_inside(path, source):
            where = "is" if same_file(path, source) else "lies inside"
            raise OutputError(f"{flag} {path} {where} {what} ({source}), which this command "
                              f"reads; writing there would mix its output into its input: "
                              f"choose a folder outside it")
    return writable_folder(path, flag) if create else path


@contextmanager
def no_empty_folder_left(folder: str | Path) -> Iterator[None]:
    """A command that fails (or is stopped) before it wrote anything into ``folder`` leaves
    no folder of its own behind: created by the block and holding nothing but its lock
    file, it is removed again. A folder that existed before is never touched."""
    folder = Path(folder)
    existed = os.path.lexists(folder)
    try:
        yield
    except BaseException:
        if not existed and folder.is_dir() and \
                {p.name for p in folder.iterdir()} <= {LOCK_FILE}:
            (folder / LOCK_FILE).unlink(missing_ok=True)
            with suppress(OSError):
                folder.rmdir()
        raise


MAX_NAME_CHARS = 200  # an utterance id, or a file name made of one (most file systems: 255 bytes)


def name_problem(name: str) -> str | None:
    """Why ``name`` (an utterance id) cannot stand as a name inside a folder, or None: a
    path separator, ``..``, a NUL or another control character, nothing but dots or
    blanks, or more than ``MAX_NAME_CHARS`` characters. Output file names are built from
    ids, so an id that is a path could write anywhere."""
    if not name.strip(" ."):
        return f"id {name!r} is empty or only dots"
    if "/" in name or "\\" in name:
        return f"id {name!r} holds a path separator"
    if ".." in name:
        return f"id {name!r} holds '..'"
    bad = sorted({c for c in name if ord(c) < 32 or ord(c) == 127})
    if bad:
        return f"id {name!r} holds control characters ({', '.join(repr(c) for c in bad)})"
    if len(name) > MAX_NAME_CHARS:
        return f"id of {len(name)} characters (at most {MAX_NAME_CHARS})"
    return None


def safe_name(name: str) -> str:
    """``name`` made into one file name that cannot leave its folder: path separators,
    control characters and runs of dots become ``_``, a leading dot too, and it is cut to
    ``MAX_NAME_CHARS`` characters. A name that passes :func:`name_problem` (and does not
    start with a dot) comes back unchanged."""
    out = "".join("_" if c in "/\\" or ord(c) < 32 or ord(c) == 127 else c for c in name)
    while ".." in out:
        out = out.replace("..", "_")
    out = ("_" + out[1:] if out.startswith(".") else out)[:MAX_NAME_CHARS]
    return out if out.strip() else "_"


_SEPARATOR_OR_CONTROL = re.compile(r"[/\\\x00-\x1f\x7f]")


def first_bad_name(names: list[str]) -> int | None:
    """The index of the first of ``names`` :func:`name_problem` refuses, or None. Scans of
    the names joined by spaces (a space ends any ".."), so a store's hundreds of thousands
    of ids are checked in tens of milliseconds; one by one only where one is bad."""
    if not names:
        return None
    joined = " ".join(names)
    if (_SEPARATOR_OR_CONTROL.search(joined) is None and ".." not in joined
            and max(map(len, names)) <= MAX_NAME_CHARS and all(n.strip(" .") for n in names)):
        return None
    return next(i for i, n in enumerate(names) if name_problem(n) is not None)
