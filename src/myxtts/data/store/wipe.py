"""Removing a store for ``prepare --force``: only the files prepare wrote, never the user's.

A store folder may hold other files (a run folder, notes) next to or inside its split
folders. What prepare owns: the files its manifest lists (for a store interrupted
before its manifest was written, the file names of the format), the manifest,
vocabulary, report and markers, temp files of interrupted atomic writes, and the work
folder's plan and chunks. Anything else inside the folders prepare writes into is in
the way: the store is not touched and the error names the first such path.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path, PurePosixPath

from myxtts.data.store.format import (
    AUDIO_FILES,
    CODES_FILE,
    MANIFEST,
    PARTIAL_MARKER,
    REPORT,
    SPLIT_FILES,
    SPLITS,
    VOCAB,
    WORK_DIR,
    StoreError,
)

_TOP_FILES = (MANIFEST, VOCAB, REPORT, PARTIAL_MARKER)
_TEMP = re.compile(r"\..+\.tmp")  # system.atomic_open's temp files
_WORK = re.compile(rf"plan\.json|chunks/({'|'.join(SPLITS)})-\d+\.npz")


def _listed_files(out: Path) -> set[str] | None:
    """The relative paths the manifest lists (inside the store only), or None without one."""
    try:
        files = json.loads((out / MANIFEST).read_text(encoding="utf-8")).get("files")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(files, dict):
        return None
    listed = set()
    for rel in files:
        parts = PurePosixPath(str(rel)).parts
        if parts and not PurePosixPath(str(rel)).is_absolute() and ".." not in parts:
            listed.add(PurePosixPath(*parts).as_posix())
    return listed


def _owned(out: Path, rel: str, listed: set[str] | None) -> bool:
    name = rel.rsplit("/", 1)[-1]
    if _TEMP.fullmatch(name):
        return True
    if rel.startswith(WORK_DIR + "/"):
        return _WORK.fullmatch(rel[len(WORK_DIR) + 1:]) is not None
    if listed is not None:
        return rel in listed
    return any(rel == f"{s}/{f}" for s in SPLITS for f in (*SPLIT_FILES, *AUDIO_FILES, CODES_FILE))


def _entries(out: Path) -> list[tuple[str, bool]]:
    """``(relative path, is a folder)`` of everything inside the folders prepare writes
    into, deepest first; symbolic links are entries, never followed."""
    found: list[tuple[str, bool]] = []
    for top in (*SPLITS, WORK_DIR):
        root = out / top
        if not root.is_dir() or root.is_symlink():
            if os.path.lexists(root):
                found.append((top, False))
            continue
        for folder, dirs, files in os.walk(root, topdown=False):
            rel_folder = Path(folder).relative_to(out).as_posix()
            found += [(f"{rel_folder}/{f}", False) for f in sorted(files)]
            found += [(f"{rel_folder}/{d}", False) for d in sorted(dirs)
                      if os.path.islink(os.path.join(folder, d))]
            found.append((rel_folder, True))
    return found


def check_removable(out: Path) -> None:
    """StoreError naming the first path inside the store's folders that prepare did not
    write (so ``--force`` would have to delete it); nothing is removed."""
    listed = _listed_files(out)
    foreign = [rel for rel, is_dir in _entries(out) if not is_dir and not _owned(out, rel, listed)]
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise StoreError(f"{out}: --force would rebuild this store, but {out / foreign[0]}{more} "
                         f"was not written by prepare; move it out of {out} (prepare deletes only "
                         f"the files it wrote) and re-run")


def remove_store(out: Path) -> None:
    """Delete the store's own files (after ``check_removable``) and the folders left empty."""
    check_removable(out)
    listed = _listed_files(out)
    for name in _TOP_FILES:  # the manifest first: a kill from here on leaves a partial store
        (out / name).unlink(missing_ok=True)
    for rel, is_dir in _entries(out):
        path = out / rel
        if is_dir:
            try:
                path.rmdir()
            except OSError:
                pass  # still holds something: kept
        elif _owned(out, rel, listed):
            path.unlink(missing_ok=True)
