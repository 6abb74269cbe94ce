"""The store's optional audio (``prepare --audio``): the rules every side shares.

Why a module of its own: the waveform rides along the whole pipeline -- a worker
quantises it into the chunk, resume must tell an audio chunk from a mel-only one, the
writer packs it, the reader maps it, verify checks it. Each of those sides needs the
same few definitions (the int16 quantisation, what a consistent audio index looks like,
and, from ``audio.frames``, how many mel frames a clip of n samples has), so the rule that
ties ``store.audio(i)`` to ``store.mel(i)`` is written down once.

This module reads nothing of the store by itself and imports only ``store.format`` and
``audio.frames``, so the chunk code (worker side), the reader and verify can all use it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from myxtts.audio.frames import frames_for_samples
from myxtts.data.store.format import AUDIO_DTYPE, AUDIO_SCALE


def stores_audio(manifest: dict[str, Any]) -> bool:
    """Whether the manifest's store holds audio (stores from before the key hold none)."""
    return bool(manifest.get("store_audio", False))


def quantize(wav: np.ndarray) -> np.ndarray:
    """float waveform (nominally in [-1, 1]) -> int16, rounding to nearest and saturating.
    Saturation, not wrap-around: a loudness-normalised clip may exceed 1.0 by a hair."""
    scaled = np.round(np.asarray(wav, np.float32) * np.float32(AUDIO_SCALE))
    return np.clip(scaled, -32768, 32767).astype(AUDIO_DTYPE)


def audio_index(lengths: np.ndarray) -> np.ndarray:
    """``audio_index.npy`` for clips of ``lengths`` samples in store order: int64 [N, 2] of
    (offset, length), offsets contiguous from 0."""
    lengths = np.asarray(lengths, np.int64)
    out = np.zeros((len(lengths), 2), np.int64)
    out[:, 1] = lengths
    if len(lengths):
        out[1:, 0] = np.cumsum(lengths)[:-1]
    return out


def chunk_audio_ok(arrays: dict[str, np.ndarray], n_frames: np.ndarray, n_fft: int,
                   hop_length: int) -> bool:
    """A chunk's ``audio``/``n_samples`` arrays fit its mels: every kept clip (n_frames > 0)
    has samples, rejected ones none, the lengths give the mel lengths, and the samples add
    up. False also when they are absent (a chunk from a run without audio)."""
    if "audio" not in arrays or "n_samples" not in arrays:
        return False
    audio, n_samples = arrays["audio"], arrays["n_samples"].astype(np.int64)
    kept = n_frames > 0
    return bool(audio.dtype == AUDIO_DTYPE and audio.ndim == 1
                and n_samples.shape == n_frames.shape
                and audio.shape[0] == int(n_samples.sum())
                and ((n_samples > 0) == kept).all()
                and (frames_for_samples(n_samples[kept], int(n_fft), int(hop_length))
                     == n_frames[kept]).all())


def format_size(n_bytes: int) -> str:
    """``1.2 GB`` (decimal units, as disks are sold and ``df -H`` prints)."""
    size, unit = float(n_bytes), "B"
    for bigger in ("kB", "MB", "GB", "TB"):
        if size < 1000:
            break
        size, unit = size / 1000, bigger
    return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
