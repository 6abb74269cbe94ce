"""Bucket edges: the dynamic programme finds the cheapest plan; the plan maps batches."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from myxtts.data.feed.buckets import BucketPlan, choose_boundaries


def _epoch_cost(boundaries, mel, batch_frames, max_batch_size, fill_cost):
    """Reference cost (padding + fill_cost * expected fill frames) of a boundary set."""
    total = 0.0
    lo = 0
    for edge in boundaries:
        members = mel[(mel > lo) & (mel <= edge)]
        lo = edge
        if len(members) == 0:
            continue
        size = max(1, min(max_batch_size or 10**9, batch_frames // edge))
        slots = -(-len(members) // size) * size
        fill = (slots - len(members)) * members.mean()
        total += slots * edge - members.sum() - fill + fill_cost * fill
    return total


@pytest.mark.parametrize("fill_cost", [0.0, 1.0])
def test_boundary_dp_is_optimal_against_brute_force(fill_cost):
    rng = np.random.default_rng(7)
    mel = rng.integers(90, 400, 60).astype(np.int64)
    values = np.unique(-(-mel // 16) * 16)
    k_max, bf, mbs = 4, 1600, 6
    best = min(
        _epoch_cost(list(sub) + [values[-1]], mel, bf, mbs, fill_cost)
        for k in range(k_max)
        for sub in itertools.combinations(values[:-1], k)
    )
    dp = choose_boundaries(mel, k_max, bf, mbs, 16, fill_cost)
    assert len(dp) <= k_max and dp[-1] == values[-1]
    assert _epoch_cost(list(dp), mel, bf, mbs, fill_cost) == pytest.approx(best)


def test_the_plan_maps_a_batch_to_its_bucket_and_refuses_longer_ones():
    table = BucketPlan(boundaries=(16, 40), text_caps=(8, 24), batch_sizes=(4, 2), num_buckets=2)
    assert table.shape_for(1) == (16, 8) and table.shape_for(16) == (16, 8)
    assert table.shape_for(17) == (40, 24) and table.bucket_for(40) == 1
    with pytest.raises(ValueError, match="41-frame mel but the longest bucket is 40"):
        table.shape_for(41)


def test_table_lookups_equal_searchsorted_and_unique():
    from myxtts.data.feed import buckets

    rng = np.random.default_rng(5)
    edges = np.array([64, 128, 256, 512])
    for lengths in (rng.integers(1, 700, 5000), np.array([1, 64, 65, 512, 513]),
                    np.array([3, 2**21, 64])):  # the last: too long for a table, plain path
        assert np.array_equal(buckets.bucket_index(edges, lengths),
                              np.searchsorted(edges, lengths, side="left"))
        assert np.array_equal(buckets.sorted_distinct(lengths), np.unique(lengths))
