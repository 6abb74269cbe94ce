"""Dynamic time warping: the best monotonic alignment of two feature sequences.

One implementation for every comparison of a free-running utterance with its ground truth:
the trainer's samples and the learnability tests (``dtw_l1`` on normalised log-mels) and the
speech metrics (mel-cepstral distortion, and the frame pairs that F0 is compared on).

Why DTW: an utterance that says the right sounds slightly early or late is punished twice by
a frame-by-frame distance (a constant mean frame can beat it); DTW compares content, and
length is judged on its own (the duration ratio).
"""

from __future__ import annotations

import numpy as np

_COST_BLOCK_ELEMENTS = 1 << 22  # float64 elements of one block of pairwise differences (32 MiB)


def _check(a: np.ndarray, b: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or not len(a) or not len(b):
        raise ValueError(f"{name} needs two non-empty [frames, bands] arrays with the same "
                         f"bands, got {a.shape} and {b.shape}")
    return a, b


def pairwise(a: np.ndarray, b: np.ndarray, kind: str = "l1") -> np.ndarray:
    """[N, M] distances between the frames of ``a`` [N, d] and ``b`` [M, d]: the mean absolute
    difference per band (``l1``) or the Euclidean distance (``l2``). Built in row blocks, so
    the [rows, M, d] difference stays ~32 MiB on long utterances, not [N, M, d]."""
    a, b = _check(a, b, "pairwise")
    n, m = len(a), len(b)
    cost = np.empty((n, m))
    rows = max(1, _COST_BLOCK_ELEMENTS // (m * a.shape[1]))
    for start in range(0, n, rows):
        diff = a[start:start + rows, None, :] - b[None]  # [rows, M, d]
        cost[start:start + rows] = (np.abs(diff).mean(-1) if kind == "l1"
                                    else np.sqrt(np.square(diff).sum(-1)))
    return cost


def accumulate(cost: np.ndarray) -> np.ndarray:
    """[N + 1, M + 1] accumulated costs of the best path to each cell (row and column 0 are
    the start). Symmetric step weights: a diagonal step counts its cell twice, a horizontal
    or vertical one once, so every complete path weighs N + M."""
    n, m = cost.shape
    acc = np.full((n + 1, m + 1), np.inf)
    acc[0, 0] = 0.0
    for d in range(2, n + m + 1):  # cells with i + j = d (1-based) depend only on d-1, d-2
        i = np.arange(max(1, d - m), min(n, d - 1) + 1)
        j = d - i
        c = cost[i - 1, j - 1]
        acc[i, j] = np.minimum(acc[i - 1, j - 1] + 2.0 * c,
                               np.minimum(acc[i - 1, j], acc[i, j - 1]) + c)
    return acc


def path(cost: np.ndarray) -> tuple[float, np.ndarray]:
    """(mean cost per frame along the best path, the path as int [P, 2] of (i, j) frame
    pairs from (0, 0) to (N-1, M-1)). The mean is the accumulated cost over N + M."""
    cost = np.asarray(cost, dtype=np.float64)
    acc = accumulate(cost)
    n, m = cost.shape
    i, j, pairs = n, m, []
    while i > 0 and j > 0:
        pairs.append((i - 1, j - 1))
        c = cost[i - 1, j - 1]
        if acc[i, j] == acc[i - 1, j - 1] + 2.0 * c:  # the step that gave acc[i, j]
            i, j = i - 1, j - 1
        elif acc[i, j] == acc[i - 1, j] + c:
            i -= 1
        else:
            j -= 1
    return float(acc[n, m] / (n + m)), np.asarray(pairs[::-1], dtype=np.int64)


def dtw_l1(a: np.ndarray, b: np.ndarray, scale: np.ndarray | None = None) -> float:
    """Mean L1 distance per frame and band between log-mels ``a`` [N, d] and ``b`` [M, d]
    along their best monotonic alignment.

    ``scale`` [d] divides each band's distance (pass the mel std: every band then weighs the
    same, as in the training loss). The symmetric step weights make the result a mean in the
    same units as a frame-by-frame L1.
    """
    a, b = _check(a, b, "dtw_l1")
    if scale is not None:  # |a - b| / s == |a / s - b / s| for s > 0: scale once, not per pair
        scale = np.asarray(scale, dtype=np.float64)
        a, b = a / scale, b / scale
    acc = accumulate(pairwise(a, b, "l1"))
    return float(acc[-1, -1] / (len(a) + len(b)))
