"""Dynamic time warping: dtw_l1 (the trainer's samples, the learnability tests) and the
aligned path the speech metrics compare frames on."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from myxtts.metrics.dtw import dtw_l1


def brute_force(a, b, scale):
    return brute_force_cost((np.abs(a[:, None] - b[None]) / scale).mean(-1))


def brute_force_cost(cost):
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

    n, m = cost.shape
    return best(n - 1, m - 1) / (n + m)


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
    import myxtts.metrics.dtw as metrics

    rng = np.random.default_rng(3)
    a, b, scale = rng.normal(size=(13, 4)), rng.normal(size=(9, 4)), rng.uniform(0.5, 2, 4)
    whole = dtw_l1(a, b, scale)
    monkeypatch.setattr(metrics, "_COST_BLOCK_ELEMENTS", 4 * 9 * 2)  # 2 rows per block
    assert dtw_l1(a, b, scale) == pytest.approx(whole, rel=1e-12)
    assert whole == pytest.approx(brute_force(a, b, scale), rel=1e-12)


@pytest.mark.parametrize("n,m", [(1, 1), (1, 5), (7, 3), (12, 20)])
def test_the_path_is_monotonic_complete_and_weighs_the_mean(n, m):
    """The backtracked path runs from the first frame pair to the last in unit steps, and
    its step-weighted cost (a diagonal step twice) over N + M is the mean it returns."""
    from myxtts.metrics.dtw import pairwise, path

    rng = np.random.default_rng(n * 10 + m)
    a, b = rng.normal(size=(n, 3)), rng.normal(size=(m, 3))
    cost = pairwise(a, b, "l2")
    mean, pairs = path(cost)
    assert tuple(pairs[0]) == (0, 0) and tuple(pairs[-1]) == (n - 1, m - 1)
    steps = np.diff(pairs, axis=0)
    assert ((steps == [1, 1]).all(1) | (steps == [1, 0]).all(1) | (steps == [0, 1]).all(1)).all()
    weights = np.r_[2.0, np.where(steps.sum(1) == 2, 2.0, 1.0)]
    assert (weights * cost[pairs[:, 0], pairs[:, 1]]).sum() / (n + m) == pytest.approx(mean)
    assert mean == pytest.approx(brute_force_cost(cost), rel=1e-12)


def test_pairwise_euclidean_is_the_distance_between_frames():
    from myxtts.metrics.dtw import pairwise

    a, b = np.array([[0.0, 0.0], [3.0, 4.0]]), np.array([[0.0, 0.0]])
    assert pairwise(a, b, "l2")[:, 0].tolist() == [0.0, 5.0]
    assert pairwise(a, b, "l1")[:, 0].tolist() == [0.0, 3.5]
