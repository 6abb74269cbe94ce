"""dtw_l1: the free-running accuracy measure of the trainer's samples and the learnability tests."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from myxtts.observe.quality import dtw_l1


def brute_force(a, b, scale):
    cost = (np.abs(a[:, None] - b[None]) / scale).mean(-1)

    @functools.cache
    def best(i, j):  # min weighted cost of a path from (0, 0) to (i, j), 0-based cells
        if i == 0 and j == 0:
            return 2 * cost[0, 0]  # entering the first cell is a diagonal step
        options = []
        if i and j:
            options.append(best(i - 1, j - 1) + 2 * cost[i, j])
        if i:
            options.append(best(i - 1, j) + cost[i, j])
        if j:
            options.append(best(i, j - 1) + cost[i, j])
        return min(options)

    return best(len(a) - 1, len(b) - 1) / (len(a) + len(b))


@pytest.mark.parametrize("n,m", [(1, 1), (1, 5), (7, 3), (9, 9), (12, 20)])
def test_matches_brute_force(n, m):
    rng = np.random.default_rng(n * 100 + m)
    a, b, scale = rng.normal(size=(n, 4)), rng.normal(size=(m, 4)), rng.uniform(0.5, 2, 4)
    assert dtw_l1(a, b, scale) == pytest.approx(brute_force(a, b, scale), rel=1e-12)


def test_time_warps_cost_nothing_and_offsets_cost_their_size():
    rng = np.random.default_rng(0)
    x = 10 * rng.normal(size=(30, 8))  # frames far apart: the diagonal is the best path
    assert dtw_l1(x, x) == 0.0
    assert dtw_l1(x, np.repeat(x, 3, axis=0)) == pytest.approx(0.0)  # slower speech, same content
    assert dtw_l1(x, x + 0.5) == pytest.approx(0.5)
    assert dtw_l1(x, x + 1.0, scale=np.full(8, 2.0)) == pytest.approx(0.5)
    assert dtw_l1(x, x[::-1]) > 3  # reversed content is not a warp


def test_bad_shapes_are_clear_errors():
    with pytest.raises(ValueError, match="same bands"):
        dtw_l1(np.zeros((3, 4)), np.zeros((3, 5)))
    with pytest.raises(ValueError, match="non-empty"):
        dtw_l1(np.zeros((0, 4)), np.zeros((3, 4)))


def test_cost_blocks_do_not_change_the_result(monkeypatch):
    """The pairwise costs are built in row blocks (bounded memory on long samples); any block
    size gives the same distance."""
    import myxtts.observe.quality as metrics

    rng = np.random.default_rng(3)
    a, b, scale = rng.normal(size=(13, 4)), rng.normal(size=(9, 4)), rng.uniform(0.5, 2, 4)
    whole = dtw_l1(a, b, scale)
    monkeypatch.setattr(metrics, "_COST_BLOCK_ELEMENTS", 4 * 9 * 2)  # 2 rows per block
    assert dtw_l1(a, b, scale) == pytest.approx(whole, rel=1e-12)
    assert whole == pytest.approx(brute_force(a, b, scale), rel=1e-12)
