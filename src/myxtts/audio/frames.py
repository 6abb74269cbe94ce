"""How many log-mel frames a clip of ``n`` samples gives: the one formula every side uses.

The mel module computes the frames, the store checks a clip's audio against its mel length,
the on-the-fly loader and budgets count frames before any audio is read; all of them call
``n_frames_for`` (or ``frames_for_samples`` where only the STFT sizes are at hand, as in a
store's manifest). Centred frames: the clip is reflect-padded by ``n_fft // 2`` on each
side, so for an even ``n_fft`` the count is ``1 + n_samples // hop_length``.

Plain integer arithmetic: the same code serves an ``int``, a numpy array and a torch tensor
(the result has the argument's type), and torch-free callers (the store, prepare's resume)
stay torch-free.
"""

from __future__ import annotations

from typing import Any

from myxtts.config import AudioConfig


def frames_for_samples(n_samples: Any, n_fft: int, hop_length: int) -> Any:
    """Frames ``MelSpectrogram`` gives clips of ``n_samples`` (an int, an integer array or
    tensor) with these STFT sizes."""
    return 1 + (n_samples + 2 * (n_fft // 2) - n_fft) // hop_length


def n_frames_for(n_samples: Any, cfg: AudioConfig) -> Any:
    """Frames ``MelSpectrogram(cfg)`` gives clips of ``n_samples`` (no audio needed)."""
    return frames_for_samples(n_samples, cfg.n_fft, cfg.hop_length)
