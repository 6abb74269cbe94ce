"""Host buffers of a batch: the arrays it is built in, reused once nobody holds them, and
the copy of store rows into them.

Why preallocate-and-fill: ``torch.tensor`` per item + ``pad_sequence`` copies every item
twice; here a batch's arrays come from a pool (:class:`BufferPool`: a fresh multi-MB batch per
step costs page faults or a calloc memset on top of the copies) and each utterance's frames are
one copy out of the store's memory map (:func:`fill_rows`; float16 bytes stay float16 for a
GPU, a CPU batch casts them in the same pass). :func:`unreferenced` decides when a buffer (or
a loader worker's shared slot) may be written again.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from myxtts.data.batch import numpy_dtype

Specs = dict[str, tuple[tuple[int, ...], torch.dtype]]  # field -> (shape, dtype) of a batch

_SERIAL_ELEMENTS = 32767  # torch runs element-wise ops on fewer elements than 32768 inline


def _cast_into(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[:] = src`` across dtypes (float16 store frames into a float32 batch), one pass
    with no temporary: torch's vectorised cast (numpy's float16 cast measures ~2x slower), in
    pieces below torch's parallel grain (waking OpenMP for a 50k copy costs more than it)."""
    d = torch.from_numpy(dst)
    s = torch.from_numpy(src)  # a read-only memmap view: only ever read (warning silenced)
    rows = max(1, _SERIAL_ELEMENTS // max(1, dst.shape[-1]))
    for a in range(0, dst.shape[0], rows):
        d[a:a + rows].copy_(s[a:a + rows])


POOL_PER_SHAPE = 4  # batch buffers kept per shape: one held by the loop, one being filled, prefetch


class BufferPool:
    """Batch arrays reused once nobody holds them: a fresh multi-MB batch per step costs
    page faults or a calloc memset on top of the copies. An entry is reused only when its
    arrays are referenced by the pool alone (every tensor handed out keeps its array alive
    through ``torch.from_numpy``, views included), so a batch the consumer keeps is never
    overwritten; with all of a shape's entries held, a new one is allocated. Not pickled
    (each worker process builds its own)."""

    def __init__(self, per_shape: int = POOL_PER_SHAPE) -> None:
        self.per_shape = int(per_shape)
        self._entries: dict[Any, list[dict[str, np.ndarray]]] = {}

    def take(self, key: Any, make: Any) -> dict[str, np.ndarray]:
        """A free entry for ``key``, else ``make()`` (kept while fewer than ``per_shape``)."""
        entries = self._entries.setdefault(key, [])
        for entry in entries:
            if unreferenced(entry.values()):
                return entry
        entry = make()
        if len(entries) < self.per_shape:
            entries.append(entry)
        return entry


def _ref_counts(arrays: Iterable[np.ndarray]) -> list[int]:
    return [sys.getrefcount(a) for a in arrays]


# What ``_ref_counts`` reads for an array its container alone holds. Measured here, by the
# same code, rather than written down: how many references the interpreter itself keeps
# while counting (a loop variable, the call's argument) differs between Python versions.
_ALONE = max(_ref_counts([np.empty(0)]))


def unreferenced(arrays: Iterable[np.ndarray]) -> bool:
    """Whether the container ``arrays`` iterates holds the only reference to each array:
    no tensor (``torch.from_numpy`` keeps its array alive, views included) or other name
    does. What decides that a pooled buffer or a loader slot may be written again."""
    return max(_ref_counts(arrays), default=0) <= _ALONE


def empty(specs: Specs) -> dict[str, np.ndarray]:
    """Uninitialised arrays of these fields (for a builder that writes every element)."""
    return {name: np.empty(shape, numpy_dtype(dtype)) for name, (shape, dtype) in specs.items()}


def fill_rows(dst: np.ndarray, src: np.ndarray, starts: list[int], lengths: list[int]) -> None:
    """``dst[i, :n_i] = src[start_i:start_i + n_i]`` and ``dst[i, n_i:] = 0`` for every row
    (every element of ``dst`` written), casting float16 into float32 where the dtypes differ.
    One torch copy per row where torch runs on one thread; below its parallel grain where it
    would wake its thread pool (``_cast_into``). Read-only ``src``: the caller silences
    torch's warning about it."""
    cast = dst.dtype != src.dtype
    if cast:
        flat, serial = torch.from_numpy(dst.reshape(len(dst), -1)), torch.get_num_threads() == 1
        whole = torch.from_numpy(src.reshape(-1))
    width = src.shape[1]
    for i, (start, n) in enumerate(zip(starts, lengths)):
        if not cast:  # float16 bytes into float16 (a GPU's batch): a numpy copy
            dst[i, :n] = src[start:start + n]
        elif serial:
            flat[i, :n * width].copy_(whole[start * width:(start + n) * width])
        else:
            _cast_into(dst[i, :n], src[start:start + n])
        dst[i, n:] = 0
