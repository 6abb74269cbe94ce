"""The XTTS-v2 folder's torch files read without running any code, and their tensors checked.

Every file is read with ``torch.load(weights_only=True)``: tensors and plain values only, so
a file from the internet cannot run code; memory-mapped, so a 1.8 GB ``model.pth`` costs no
copy until a tensor is used. Released ``model.pth`` files of the first XTTS-v2 releases also
hold coqui's config as a pickled ``XttsConfig`` object (under ``"config"``, with its
``XttsArgs``, ``XttsAudioConfig`` and ``BaseDatasetConfig`` inside). Those classes are
allowed here as stand-ins registered under the pickled module and class names: the
unpickler creates a bare stand-in and hands it the object's fields as data, coqui's code is
never imported or run, and the config inside is ignored (``config.json`` is the source).
Any other class is refused by name. torch 2.4's restricted unpickler allowlists classes as
callables only (it builds no allowlisted class from ``NEWOBJ``/``BUILD``, as pickled
objects are made; 2.5 added that): there such a file is refused in one line asking for
torch 2.5 or later, never read with ``weights_only=False``.

Each failure is one :class:`ArtifactError` line naming the file and what it should be.
"""

from __future__ import annotations

import pickle
import re
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from myxtts.artifacts.errors import ArtifactError
from myxtts.artifacts.readback import ZIP_MAGIC, file_kind
from myxtts.config.bounds import excerpt

_AGAIN = "download it again"
# Declared contents beyond this many times the file's size (plus a little) are refused
# unread: torch.save stores tensors uncompressed, so more means compressed entries.
_SIZE_FACTOR, _SIZE_SLACK = 2, 1 << 20

# Where coqui's config classes were pickled from: TTS.tts.models.xtts in the released files,
# TTS.tts.configs.xtts_config where coqui-tts keeps them now.
_PICKLED_CONFIG_CLASSES = (
    ("TTS.tts.configs.xtts_config", "XttsConfig"), ("TTS.tts.configs.xtts_config", "XttsArgs"),
    ("TTS.tts.configs.xtts_config", "XttsAudioConfig"), ("TTS.tts.models.xtts", "XttsConfig"),
    ("TTS.tts.models.xtts", "XttsArgs"), ("TTS.tts.models.xtts", "XttsAudioConfig"),
    ("TTS.config.shared_configs", "BaseDatasetConfig"),
)


class PickledCoquiConfig:
    """What a pickled coqui config object becomes when read: its fields as a plain dict
    (``fields``), nothing of its class. torch's restricted unpickler creates it with
    ``cls.__new__`` and hands it the pickled state through ``__setstate__``."""

    fields: Any = None

    def __setstate__(self, state: Any) -> None:
        self.fields = state


def _stand_in(module: str, name: str) -> type:
    """A :class:`PickledCoquiConfig` subclass that torch finds under ``module.name``: the
    allowlist matches a class by its ``__module__`` and ``__qualname__`` (``__name__`` in
    torch 2.4), whatever module defines it."""
    return type(name, (PickledCoquiConfig,), {"__module__": module, "__qualname__": name})


_STAND_INS = [_stand_in(module, name) for module, name in _PICKLED_CONFIG_CLASSES]


@contextmanager
def _stand_ins_allowed() -> Iterator[None]:
    """The stand-ins on torch's allowlist while a file is read (torch 2.5+ has a context
    manager; 2.4 only the global list, put back as it was afterwards)."""
    manager = getattr(torch.serialization, "safe_globals", None)
    if manager is not None:
        with manager(_STAND_INS):
            yield
        return
    before = torch.serialization.get_safe_globals()
    torch.serialization.add_safe_globals(_STAND_INS)
    try:
        yield
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(before)


# torch 2.5+ builds allowlisted classes in its own restricted unpickler (module doc)
WEIGHTS_ONLY_BUILDS_OBJECTS = hasattr(torch.serialization, "safe_globals")


def _load(path: Path) -> Any:
    try:
        with _stand_ins_allowed():
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError:
        if WEIGHTS_ONLY_BUILDS_OBJECTS:
            raise
        raise ArtifactError(f"{path} holds Coqui's config as a pickled object, which torch "
                            f"{torch.__version__} cannot read without running code; upgrade "
                            f"to torch 2.5 or later (pip install -U torch)") from None


def load_pth(path: Path, should: str) -> Any:
    """The contents of the torch file ``path``, read safely (module doc). ``should`` says
    what it should be, for the messages ("XTTS-v2's model.pth")."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
    except OSError as e:
        raise ArtifactError(f"{path} cannot be read ({e.strerror or e})") from None
    if size == 0:
        raise ArtifactError(f"{path} is empty (0 bytes: a download that never finished); {_AGAIN}")
    if not head.startswith(ZIP_MAGIC):
        if file_kind(path) == "bundle":
            raise ArtifactError(f"{path} is a myxtts model bundle (written by `myxtts export`), "
                                f"not {should}; pass the XTTS-v2 folder as downloaded")
        raise ArtifactError(f"{path} is not a file torch.save wrote (it starts with "
                            f"{excerpt(head)}); it should be {should}: {_AGAIN}")
    try:
        with zipfile.ZipFile(path) as z:
            declared = sum(i.file_size for i in z.infolist())
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        raise ArtifactError(f"{path} is truncated or damaged (not a complete zip archive, as "
                            f"torch.save writes); {_AGAIN}") from None
    if declared > _SIZE_FACTOR * size + _SIZE_SLACK:
        raise ArtifactError(f"{path} declares {declared / 2**20:.0f} MiB of contents in a file "
                            f"of {size / 2**20:.1f} MiB; refused unread (it is not {should})")
    try:
        return _load(path)
    except ArtifactError:
        raise
    except pickle.UnpicklingError as e:  # the restricted unpickler refused something
        found = re.search(r"GLOBAL ([\w.]+)", str(e)) or re.search(r"<class '([\w.]+)'>", str(e))
        what = f"a pickled {found.group(1)}" if found else "pickled Python objects"
        raise ArtifactError(f"{path} holds {what}, which myxtts does not load (unpickling it "
                            f"could run code); it should be {should}, which holds tensors "
                            f"and coqui's config only") from None
    except Exception as e:  # a damaged archive or record inside it
        why = (str(e).strip().splitlines() or [""])[0].rstrip(".")
        raise ArtifactError(f"{path} cannot be read ({type(e).__name__}"
                            f"{': ' + excerpt(why, 160, quote=False) if why else ''}); it is "
                            f"damaged: {_AGAIN}") from None


def shape_text(shape: Any) -> str:
    return "[" + ", ".join(str(n) for n in shape) + "]"


def check_entries(where: str, state: Any, layout: dict[str, tuple[int, ...]],
                  integer: Any, optional: str | None = None,
                  hints: dict[str, str] | None = None, needs: str = "the config's model") -> None:
    """``state`` (read from ``where``) holds exactly ``layout``'s entries (those starting with
    ``optional`` may be absent), each a tensor of its shape, of integers where ``integer(name)``
    says so and of floats elsewhere, every float finite (a meta tensor's values are not
    checked). ``hints``: why a key has its shape, added to a shape mismatch."""
    if not isinstance(state, dict):
        raise ArtifactError(f"{where} holds a {type(state).__name__}, not a mapping of weights")
    unknown = [k for k in state if k not in layout]
    if unknown:
        more = f" (and {len(unknown) - 1} other entries {needs} has not)" if len(unknown) > 1 else ""
        raise ArtifactError(f"{where} holds {excerpt(unknown[0], quote=False)}, which is no "
                            f"entry of {needs}{more}")
    missing = [k for k in layout if k not in state
               and not (optional is not None and k.startswith(optional))]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ArtifactError(f"{where} has no {missing[0]}{more}, which {needs} needs")
    for name, t in state.items():
        want = layout[name]
        if not isinstance(t, torch.Tensor):
            raise ArtifactError(f"{where}: {name} is a {type(t).__name__}, not a tensor")
        if integer(name) != (not t.is_floating_point() and t.dtype != torch.bool):
            kind = "whole numbers" if integer(name) else "floating-point numbers"
            raise ArtifactError(f"{where}: {name} holds {t.dtype} values, it should hold {kind}")
        if tuple(t.shape) != want:
            why = f" ({hints[name]})" if hints and name in hints else ""
            raise ArtifactError(f"{where}: {name} has shape {shape_text(t.shape)}, {needs} "
                                f"needs {shape_text(want)}{why}")
        if t.is_floating_point() and not t.is_meta and t.numel() and \
                not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise ArtifactError(f"{where}: {name} holds {bad} non-finite value(s) (NaN or "
                                f"infinity); the file is damaged: {_AGAIN}")


def check_mel_stats(where: str, stats: Any) -> torch.Tensor:
    """The mel statistics (each mel band's typical level, which the GPT's conditioning mel is
    divided by): 80 finite values > 0."""
    check_entries(where, {"mel_stats": stats}, {"mel_stats": (80,)}, lambda _: False,
                  needs="XTTS-v2's mel statistics")
    if not stats.is_meta and not bool((stats > 0).all()):
        raise ArtifactError(f"{where}: mel_stats holds values <= 0 (the conditioning mel is "
                            f"divided by them); the file is damaged: {_AGAIN}")
    return stats
