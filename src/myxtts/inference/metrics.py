"""Objective comparison of synthesized log-mels with the ground truth.

Used by the trainer's free-running validation samples (logged next to their length ratio)
and by the learnability tests, so "the free-running output says the right thing" is one
definition everywhere.
"""

from __future__ import annotations

import numpy as np


def dtw_l1(a: np.ndarray, b: np.ndarray, scale: np.ndarray | None = None) -> float:
    """Mean L1 distance per frame and band between log-mels ``a`` [N, d] and ``b`` [M, d]
    along their best monotonic alignment (dynamic time warping).

    ``scale`` [d] divides each band's distance (pass the mel std: every band then weighs the
    same, as in the training loss). Symmetric step weights (a diagonal step counts twice, a
    horizontal or vertical one once) make every path weigh N + M, so the result is a mean
    in the same units as a frame-by-frame L1.

    Why DTW: a free-running utterance that says the right sounds slightly early or late is
    punished twice by a frame-by-frame L1 (a constant mean frame can beat it); DTW compares
    content, and length is judged on its own (the stop-length ratio).
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or not len(a) or not len(b):
        raise ValueError(f"dtw_l1 needs two non-empty [frames, bands] arrays with the same "
                         f"bands, got {a.shape} and {b.shape}")
    diff = np.abs(a[:, None, :] - b[None, :, :])  # [N, M, d]
    if scale is not None:
        diff = diff / np.asarray(scale, dtype=np.float64)
    cost = diff.mean(-1)  # [N, M]
    n, m = cost.shape
    acc = np.full((n + 1, m + 1), np.inf)
    acc[0, 0] = 0.0
    for d in range(2, n + m + 1):  # cells with i + j = d (1-based) depend only on d-1, d-2
        i = np.arange(max(1, d - m), min(n, d - 1) + 1)
        j = d - i
        c = cost[i - 1, j - 1]
        acc[i, j] = np.minimum(acc[i - 1, j - 1] + 2.0 * c,
                               np.minimum(acc[i - 1, j], acc[i, j - 1]) + c)
    return float(acc[n, m] / (n + m))
