"""Bucket edges: where to cut the length axis, and the shape each bucket pads to.

Boundaries are chosen by an exact dynamic programme over the (rounded) lengths that
minimises the mel frames the GPU processes per epoch -- padding *and* fill repeats
(weighted by ``fill_cost``) -- using at most ``num_buckets`` buckets. It uses fewer
when another bucket would cost more in fill repeats than it saves in padding, which
happens on tiny datasets (100 clips fill only a handful of 20-utterance batches).
``ShapeTable`` then maps any batch to its bucket's padded shape; it is what the
collator (in loader workers) needs of the sampler.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from myxtts.data.batch import round_up

_MAX_CANDIDATES = 512  # DP is O(K * U^2) over candidate boundaries; cap U to keep it ~ms
_TABLE_LIMIT = 1 << 20  # lengths below this are looked up in a table over every length


def sorted_distinct(lengths: np.ndarray) -> np.ndarray:
    """``np.unique(lengths)`` of non-negative integer lengths: one ``bincount`` (~40x faster
    at a million utterances) unless a length is too large for a table."""
    if len(lengths) == 0 or lengths.min() < 0 or lengths.max() >= _TABLE_LIMIT:
        return np.unique(lengths)
    return np.flatnonzero(np.bincount(lengths))


def bucket_index(edges: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``np.searchsorted(edges, lengths, side="left")`` for integer lengths: a table over
    every length, then one gather (~30x faster than a binary search per utterance at a
    million), unless a length is too large for a table."""
    if len(lengths) == 0 or lengths.min() < 0 or lengths.max() >= _TABLE_LIMIT:
        return np.searchsorted(edges, lengths, side="left")
    return np.searchsorted(edges, np.arange(int(lengths.max()) + 1), side="left")[lengths]


@dataclass(frozen=True)
class ShapeTable:
    """Maps a batch to its bucket's padded shape; small and picklable for loader workers.

    ``boundaries`` are ascending mel-frame upper edges; ``text_caps[i]`` and
    ``batch_sizes[i]`` belong to ``boundaries[i]``. A batch belongs to the first bucket
    whose boundary is >= its longest mel, which is exactly the bucket the sampler drew it
    from (every member of bucket i is longer than ``boundaries[i-1]``).
    """

    boundaries: tuple[int, ...]
    text_caps: tuple[int, ...]
    batch_sizes: tuple[int, ...]

    def bucket_for(self, max_mel_frames: int) -> int:
        i = bisect.bisect_left(self.boundaries, int(max_mel_frames))
        if i == len(self.boundaries):
            raise ValueError(
                f"a batch has a {int(max_mel_frames)}-frame mel but the longest bucket is "
                f"{self.boundaries[-1]} frames; the sampler was built from other lengths than the "
                f"dataset serves (stale store?) -- rebuild the sampler from the store's lengths")
        return i

    def shape_for(self, max_mel_frames: int) -> tuple[int, int]:
        """``(padded_T, padded_L)`` of the bucket a batch with this longest mel belongs to."""
        i = self.bucket_for(max_mel_frames)
        return self.boundaries[i], self.text_caps[i]


def choose_boundaries(mel_lengths: np.ndarray, num_buckets: int, batch_frames: int,
                      max_batch_size: int, pad_multiple: int, fill_cost: float = 1.0) -> np.ndarray:
    """Bucket upper edges (ascending, multiples of ``pad_multiple``) of the cheapest plan.

    A bucket of ``n`` utterances (lengths summing to ``S``, mean ``m``) with edge ``T`` and
    batch size ``B`` runs ``slots = ceil(n / B) * B`` utterances, ``f = slots - n`` of them
    fill repeats. Its cost is the padding ``slots * T - S - f * m`` (fill repeats counted
    as real frames, as in :meth:`BucketBatchSampler.padding_efficiency`) plus
    ``fill_cost * f * m`` for the repeats. ``fill_cost=1`` (default) therefore minimises
    the GPU frames of an epoch that shows every utterance once; ``fill_cost=0`` chases
    padding efficiency alone, which on a tiny dataset means many near-empty buckets
    padded out with repeats (3x the epoch's compute on 100 clips). Buckets are contiguous
    ranges of the sorted candidate edges (the distinct rounded lengths), so
    ``dp[k][j] = min_i dp[k-1][i] + cost(i..j-1)`` is exact; vectorised over ``i`` it is
    a handful of U x U numpy ops per k. Fewer than ``num_buckets`` buckets are used
    when more would not lower the cost.
    """
    lengths = mel_lengths.astype(np.int64)
    rounded = round_up(lengths, pad_multiple)
    values = sorted_distinct(rounded)
    if len(values) > _MAX_CANDIDATES:
        # Coarsen: keep evenly spaced candidates (always the max); each length maps to the
        # next kept candidate. Still a valid plan, marginally less tight.
        keep = np.unique(np.linspace(0, len(values) - 1, _MAX_CANDIDATES).round().astype(np.int64))
        values = values[keep]
    slot = bucket_index(values, rounded)
    counts = np.bincount(slot, minlength=len(values)).astype(np.float64)
    sums = np.bincount(slot, weights=lengths, minlength=len(values))
    n_cand = len(values)
    edge = values.astype(np.float64)
    batch = np.floor_divide(batch_frames, values)
    if max_batch_size > 0:
        batch = np.minimum(batch, max_batch_size)
    batch = np.maximum(batch, 1).astype(np.float64)

    cum_n = np.concatenate([[0.0], np.cumsum(counts)])
    cum_s = np.concatenate([[0.0], np.cumsum(sums)])
    upper = np.triu(np.ones((n_cand, n_cand), dtype=bool))  # a bucket spans i <= j
    n_in = np.where(upper, cum_n[None, 1:] - cum_n[:-1, None], 1.0)  # [U, U] utts in i..j
    s_in = cum_s[None, 1:] - cum_s[:-1, None]  # [U, U] their summed frames
    slots = np.ceil(n_in / batch[None, :]) * batch[None, :]
    fill_frames = (slots - n_in) * (s_in / n_in)
    seg = slots * edge[None, :] - s_in - (1.0 - fill_cost) * fill_frames
    seg[~upper] = np.inf  # seg[i, j]: cost of one bucket spanning candidates i..j (edge values[j])

    k_max = max(1, min(num_buckets, n_cand))
    prev = np.full(n_cand + 1, np.inf)
    prev[0] = 0.0  # dp over "first j candidates covered", j = 0..U
    choices: list[np.ndarray] = []
    best_k, best_cost = 0, np.inf
    for k in range(1, k_max + 1):
        total = prev[:-1, None] + seg  # [i, j]: first i covered, new bucket i..j
        arg = np.argmin(total, axis=0)
        cur = np.full(n_cand + 1, np.inf)
        cur[1:] = total[arg, np.arange(n_cand)]
        choices.append(arg)
        if cur[n_cand] < best_cost - 1e-6:  # prefer fewer buckets (shapes) on ties
            best_k, best_cost = k, cur[n_cand]
        prev = cur
    ends: list[int] = []
    j = n_cand - 1
    for k in range(best_k, 0, -1):
        ends.append(j)
        j = int(choices[k - 1][j]) - 1
    return values[np.array(ends[::-1], dtype=np.int64)].astype(np.int64)
