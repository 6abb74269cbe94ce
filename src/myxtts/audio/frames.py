"""How many log-mel frames a clip of ``n`` samples gives, and which samples a run of frames
needs: the one pair of formulas every side uses.

The mel module computes the frames, the store checks a clip's audio against its mel length,
the on-the-fly loader and budgets count frames before any audio is read; all of them call
``n_frames_for`` (or ``frames_for_samples`` where only the STFT sizes are at hand, as in a
store's manifest). Centred frames: the clip is reflect-padded by ``n_fft // 2`` on each
side, so for an even ``n_fft`` the count is ``1 + n_samples // hop_length``.

The inverse, frames -> samples, serves the on-the-fly loader: :func:`crop_window` cuts a
reference crop whose STFT frames equal the full clip's, :func:`samples_for_frames` sizes a
clip (or a crop) of a given number of frames.

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


def window_margin(cfg: AudioConfig) -> int:
    """Frames next to a cut whose STFT window reaches across it (``n_fft // 2`` samples on
    each side of a frame's centre)."""
    return -(-(cfg.n_fft // 2) // cfg.hop_length)


def samples_for_frames(n_frames: int, cfg: AudioConfig, margin: int = 0) -> int:
    """The fewest samples that give ``n_frames`` frames (``margin`` more on each side, for
    a crop cut out of a longer clip: :func:`crop_window`'s worst case)."""
    if margin == 0:
        return (n_frames - 1) * cfg.hop_length
    return (n_frames - 1 + 2 * margin) * cfg.hop_length + 1


def crop_window(n_samples: int, start_frame: int, n_frames: int,
                cfg: AudioConfig) -> tuple[int, int, int]:
    """Samples ``[a, b)`` whose centered STFT contains the full clip's frames
    ``[start_frame, start_frame + n_frames)`` exactly, from crop frame ``first`` on."""
    half = cfg.n_fft // 2
    margin = window_margin(cfg)  # frames whose window may reach the cut
    a = max(0, (start_frame - margin) * cfg.hop_length)
    last = start_frame + n_frames - 1
    b = min(n_samples, last * cfg.hop_length + half + 1)  # +1: the reflection needs half+1 samples
    return a, b, start_frame - a // cfg.hop_length
