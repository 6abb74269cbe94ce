"""The checkpoints of a run folder: ``ckpt_STEP.pt`` (the last ``keep_last`` kept), ``best.pt``
(lowest validation loss), ``latest.txt`` / ``best.txt`` naming them; finding the newest that
loads (auto-resume), the checkpoint a run folder stands for and the run folder a
checkpoint belongs to."""

from __future__ import annotations

import errno
import logging
import re
from pathlib import Path
from typing import Any

from myxtts.artifacts.checkpoint import load, save
from myxtts.artifacts.errors import ArtifactError
from myxtts.artifacts.readback import file_kind
from myxtts.system import atomic_write

log = logging.getLogger(__name__)

_CKPT_RE = re.compile(r"ckpt_(\d+)\.pt$")


class CheckpointManager:
    """``ckpt_STEP.pt`` files in ``directory``: save, keep the newest ``keep_last`` and the
    best by validation loss (``best.pt``), find the newest."""

    def __init__(self, directory: Path, keep_last: int):
        self.dir = Path(directory)
        self.keep_last = keep_last
        self._wrote = False  # a save has made the folder: from then on its parent must stay

    def step_paths(self) -> list[Path]:
        found = [(int(m.group(1)), p) for p in self.dir.glob("ckpt_*.pt")
                 if (m := _CKPT_RE.search(p.name))]
        return [p for _, p in sorted(found)]

    def latest(self) -> Path | None:
        """Newest step checkpoint: the one ``latest.txt`` names, else the highest step."""
        pointer = self.dir / "latest.txt"
        if pointer.is_file():
            p = self.pointed(pointer)
            if p.is_file():
                return p
        paths = self.step_paths()
        return paths[-1] if paths else None

    def pointed(self, pointer: Path) -> Path:
        """The checkpoint a pointer file (``latest.txt``, ``best.txt``) names: a file name in
        this folder; anything else (an absolute path, ``..``) is refused naming the pointer."""
        words = pointer.read_text(encoding="utf-8", errors="replace").split()
        name = words[0] if words else ""
        if not name or Path(name).name != name or name in (".", ".."):
            raise ArtifactError(f"{pointer} names {name!r}, not a checkpoint file in {self.dir}; "
                                f"fix or delete the pointer")
        return self.dir / name

    def resumable(self) -> Path | None:
        """The newest step checkpoint that loads (auto-resume): a damaged newest one (a
        truncated copy, a 0-byte file from a full disk) is skipped with a warning naming it,
        and the run continues from the one before; None when there is none."""
        newest = self.latest()
        candidates = [newest] if newest is not None else []
        candidates += [p for p in reversed(self.step_paths()) if p != newest]
        for path in candidates:
            try:
                load(path)
            except ArtifactError as e:
                damaged = "" if file_kind(path) == "bundle" else "a damaged checkpoint: "
                log.warning("skipping %s%s", damaged, e)
                continue
            return path
        return None

    def path_of(self, step: int) -> Path:
        """Where the checkpoint of ``step`` is written."""
        return self.dir / f"ckpt_{step:08d}.pt"

    def save(self, state: dict[str, Any], step: int, val_loss: float | None = None,
             is_best: bool = False) -> Path:
        if self._wrote and not self.dir.parent.is_dir():  # not made again, half empty
            raise ArtifactError(f"the run folder {self.dir.parent} was removed while the run "
                                f"was writing it: the checkpoint of step {step} is not written "
                                f"and the run stops; restore the folder to resume it, or start "
                                f"a new run")
        self.dir.mkdir(parents=True, exist_ok=True)
        self._wrote = True
        path = self.path_of(step)
        previous = self.latest()
        writing = path  # the file a failure names: the one that was being written
        try:
            save(path, state)
            writing = self.dir / "latest.txt"
            atomic_write(writing, path.name)
            if is_best:
                writing = self.dir / "best.pt"
                save(writing, state)
                writing = self.dir / "best.txt"
                atomic_write(writing, f"{path.name} val_loss={val_loss}\n")
        except OSError as e:
            why = "the disk is full" if e.errno == errno.ENOSPC else (e.strerror or str(e))
            if writing == path:
                kept = (f"the previous checkpoint {previous} survives" if previous is not None
                        else "no earlier checkpoint exists")
                raise ArtifactError(f"cannot write checkpoint {path} at step {step} ({why}); "
                                    f"{kept}") from e
            latest = self.latest()
            raise ArtifactError(f"cannot write {writing} at step {step} ({why}); the checkpoint "
                                f"{path} was written, and {latest} is the one a resume takes"
                                ) from e
        for old in self.step_paths()[: -self.keep_last] if self.keep_last > 0 else []:
            if old != path:
                old.unlink(missing_ok=True)
        return path


def resolve_checkpoint(path: str | Path) -> Path:
    """A ``.pt`` file, or a run folder (its ``best.pt``, else the newest step checkpoint)."""
    p = Path(path)
    if p.is_file():
        return p
    if p.is_dir():
        for folder in (p / "checkpoints", p):
            if (folder / "best.pt").is_file():
                return folder / "best.pt"
            latest = CheckpointManager(folder, 1).latest()
            if latest is not None:
                return latest
    raise ArtifactError(f"no checkpoint at {p}: pass a .pt file or a run folder containing "
                        f"checkpoints/ (train one with `myxtts train`, `myxtts train-vocoder` or "
                        f"`myxtts demo`)")


def run_folder(path: str | Path) -> Path | None:
    """The run folder a run path or checkpoint file belongs to (None: neither)."""
    p = Path(path)
    if p.is_dir():
        return p
    if p.is_file() and p.parent.name == "checkpoints":
        return p.parent.parent
    return None
