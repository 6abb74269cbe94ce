"""Objective quality of synthesized log-mels: their distance to the ground truth.

Used by the trainer's free-running validation samples (logged next to their length ratio)
and by the learnability tests, so "the free-running output says the right thing" is one
definition everywhere. It lives in ``observe`` (below ``train`` and ``inference``), so both
can measure with it.
"""

from __future__ import annotations

import numpy as np

_COST_BLOCK_ELEMENTS = 1 << 22  # float64 elements of one block of pairwise differences (32 MiB)


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
    if scale is not None:  # |a - b| / s == |a / s - b / s| for s > 0: scale once, not per pair
        scale = np.asarray(scale, dtype=np.float64)
        a, b = a / scale, b / scale
    n, m = len(a), len(b)
    cost = np.empty((n, m))
    rows = max(1, _COST_BLOCK_ELEMENTS // (m * a.shape[1]))
    for start in range(0, n, rows):  # the [rows, M, d] difference stays ~32 MiB, not [N, M, d]
        cost[start:start + rows] = np.abs(a[start:start + rows, None, :] - b[None]).mean(-1)
    acc = np.full((n + 1, m + 1), np.inf)
    acc[0, 0] = 0.0
    for d in range(2, n + m + 1):  # cells with i + j = d (1-based) depend only on d-1, d-2
        i = np.arange(max(1, d - m), min(n, d - 1) + 1)
        j = d - i
        c = cost[i - 1, j - 1]
        acc[i, j] = np.minimum(acc[i - 1, j - 1] + 2.0 * c,
                               np.minimum(acc[i - 1, j], acc[i, j - 1]) + c)
    return float(acc[n, m] / (n + m))
