"""Non-finite features: checked where they are written, recorded once, trusted after.

A NaN or infinite mel frame trains a model of NaNs with no other notice, so no run may
start on one. Finding one means reading every mel: ~50 GB for 1,000 hours, minutes per
start from network storage, on every rank of every resume. So the check runs where the
bytes are made: prepare's writer looks at every block of mels as it writes and hashes it,
and records the result in the manifest (``FINITE_CHECK``) under the store's checksum
(``format.store_checksum``: the sha256 of its file table, so the record belongs to exactly
these files). ``myxtts train`` then reads one manifest key (:func:`ensure_finite`).

A store without the record (written before it existed), with a malformed one, or with one
made for other files (a file rewritten and re-hashed) is read once, a block at a time, and
a clean result is recorded atomically, so the next start trusts it; where the store cannot
be written, every start reads it, and says so. What the record cannot see: bytes changed
on disk behind the manifest's back; finding those is what ``prepare --verify`` is for (it
hashes and reads everything, always).
"""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from myxtts.data.store.format import (
    FINITE_CHECK,
    MANIFEST,
    MEL_DTYPE,
    MEL_FILE,
    SPLITS,
    StoreError,
    read_manifest,
    store_checksum,
)
from myxtts.data.store.reader import FeatureStore
from myxtts.system import atomic_write

log = logging.getLogger(__name__)

BLOCK_BYTES = 8 << 20  # one read into one reused buffer: the memory a full pass needs
# float16 is NaN or infinite exactly when its 5 exponent bits are all ones. Four values per
# uint64: adding 1 to a lane's exponent field carries into the lane's top bit only then.
_EXPONENTS = np.uint64(0x7C00_7C00_7C00_7C00)
_CARRY = np.uint64(0x0400_0400_0400_0400)
_TOP = np.uint64(0x8000_8000_8000_8000)


def has_nonfinite(mel: np.ndarray) -> bool:
    """Whether the float16 array ``mel`` holds a NaN or an infinity. Three integer passes
    over a uint64 view: ~7x faster than ``np.isfinite`` on float16, which is what makes
    checking every block prepare writes cost little beside hashing it."""
    if mel.dtype != MEL_DTYPE:
        raise TypeError(f"expected {MEL_DTYPE} features, got {mel.dtype}")
    flat = np.ascontiguousarray(mel).reshape(-1).view(np.uint16)
    head = len(flat) // 4 * 4
    lanes = np.bitwise_and(flat[:head].view(np.uint64), _EXPONENTS)
    lanes += _CARRY
    lanes &= _TOP
    return bool(lanes.any()) or bool(((flat[head:] & 0x7C00) == 0x7C00).any())


def nonfinite_rows(mel: np.ndarray) -> np.ndarray:
    """Indices of the frames (rows) of ``mel`` [frames, n_mels] holding NaN or infinity."""
    return np.flatnonzero(~np.isfinite(mel).all(axis=1))


def read_rows(path: Path, dtype: np.dtype, width: int, n_rows: int,
              block_bytes: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """``(first row, rows [k, width])`` for the first ``n_rows`` rows of the raw file
    ``path``, read in blocks into ONE reused buffer (valid until the next block). Why not a
    memmap: every page a memmap touches stays mapped into the process, so a full pass over
    a 50 GB store would show 50 GB of resident memory; here it stays at one block
    (``block_bytes``, default ``BLOCK_BYTES``)."""
    dtype = np.dtype(dtype)
    rows_per_block = max(1, (block_bytes or BLOCK_BYTES) // (width * dtype.itemsize))
    buf = np.empty((min(rows_per_block, max(n_rows, 1)), width), dtype)
    with open(path, "rb", buffering=0) as fh:
        for start in range(0, n_rows, rows_per_block):
            rows = buf[:min(rows_per_block, n_rows - start)]
            view, got = memoryview(rows.reshape(-1).view(np.uint8)), 0
            while got < view.nbytes:
                n = fh.readinto(view[got:])
                if not n:
                    raise StoreError(f"{path}: ends after {start * width * dtype.itemsize + got} "
                                     f"bytes, the index needs {n_rows * width * dtype.itemsize}; "
                                     f"rebuild the store with `myxtts prepare ... --force`")
                got += n
            yield start, rows


def scan_split(store: FeatureStore) -> tuple[int, int | None]:
    """(frames holding NaN or infinity, the first utterance with one or None) of one split:
    a full pass over its mels in bounded memory (:func:`read_rows`)."""
    bad, first_frame = 0, None
    for start, block in read_rows(store.path / store.split / MEL_FILE, MEL_DTYPE, store.n_mels,
                                  store.total_frames):
        if has_nonfinite(block):
            rows = nonfinite_rows(block)
            bad += len(rows)
            if first_frame is None:
                first_frame = start + int(rows[0])
    if first_frame is None:
        return 0, None
    return bad, int(np.searchsorted(store.mel_offsets, first_frame, side="right") - 1)


def finite_record(manifest: dict[str, Any], checked_by: str) -> dict[str, Any]:
    """The manifest entry saying every mel of the files ``manifest`` lists is finite."""
    return {"store_checksum": store_checksum(manifest), "nonfinite_frames": 0,
            "checked_by": checked_by}


def is_recorded(manifest: dict[str, Any]) -> bool:
    """Whether ``manifest`` records a clean check of exactly the files it lists (a missing,
    malformed or stale record is not trusted)."""
    rec = manifest.get(FINITE_CHECK)
    return (isinstance(rec, dict) and type(rec.get("nonfinite_frames")) is int
            and rec["nonfinite_frames"] == 0
            and rec.get("store_checksum") == store_checksum(manifest))


def record_finite(path: Path, manifest: dict[str, Any], checked_by: str) -> None:
    """Add the clean check of ``manifest``'s files to ``path``'s manifest.json, atomically
    and keeping its mode; nothing when the manifest changed meanwhile (another prepare).
    Raises OSError when the store cannot be written."""
    current = read_manifest(path)
    if store_checksum(current) != store_checksum(manifest):
        return
    current[FINITE_CHECK] = finite_record(current, checked_by)
    target = Path(path) / MANIFEST
    mode = stat.S_IMODE(target.stat().st_mode)
    atomic_write(target, json.dumps(current, indent=1, ensure_ascii=False) + "\n")
    os.chmod(target, mode)


def ensure_finite(path: str | Path, manifest: dict[str, Any], *, record_as: str | None = None
                  ) -> str | None:
    """None when every mel of the store at ``path`` is finite, else the problem in one line
    naming the split and the first utterance. O(1) on a store whose ``manifest`` records
    the check (:func:`is_recorded`); otherwise one bounded-memory pass over both splits,
    and with ``record_as`` (who checked: ``"train"``) a clean result is recorded
    (:func:`record_finite`), so the next call is O(1) again (a store that cannot be written
    is read again every time, with a warning). Under DDP one rank per node records."""
    path = Path(path)
    if is_recorded(manifest):
        return None
    log.info("%s: checking every mel for NaN once (its manifest records no check of these "
             "files); later starts trust the recorded result", path)
    for split in SPLITS:
        store = FeatureStore(path, split, manifest)
        bad, first = scan_split(store)
        if bad:
            return (f"{bad} mel frames of the {split} split hold NaN or infinity (first in "
                    f"utterance {first}, {store.ids[first]})")
    if record_as is not None:
        try:
            record_finite(path, manifest, record_as)
        except OSError as e:
            log.warning("%s: cannot record the check in %s (%s); every start will read the "
                        "whole store again until it can", path, MANIFEST, e)
    return None
