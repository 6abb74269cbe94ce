"""Bucket edges and the batch plan: where to cut the length axis, the shape each bucket pads
to and how many utterances each batch holds.

Boundaries are chosen by an exact dynamic programme over the (rounded) lengths that
minimises the mel frames the GPU processes per epoch -- padding *and* fill repeats
(weighted by ``fill_cost``) -- using at most ``num_buckets`` buckets. It uses fewer
when another bucket would cost more in fill repeats than it saves in padding, which
happens on tiny datasets (100 clips fill only a handful of 20-utterance batches).
:func:`plan_buckets` turns the edges into a :class:`BucketPlan`: a frozen value made from
the lengths alone, before any loader exists, so the trainer can size each bucket's batch
(``BucketPlan.with_batch_sizes``) and the loader is built once, for the final plan. The plan
maps any batch to its bucket's padded shape; it is what the batch builders (in loader
workers too) need of the sampler.
"""

from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass

import numpy as np

from myxtts.data.batch import PAD_MULTIPLE, BatchShape, round_up

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


def check_lengths(mel_lengths, text_lengths) -> tuple[np.ndarray, np.ndarray]:
    """The lengths as int64 arrays, after checking they can be planned and batched: equal
    length, non-empty, 1-D integers, mels of at least one frame."""
    mel, text = np.asarray(mel_lengths), np.asarray(text_lengths)
    if mel.ndim != 1 or text.shape != mel.shape or len(mel) == 0:
        raise ValueError(f"mel_lengths and text_lengths must be equal-length non-empty 1-D "
                         f"arrays, got shapes {mel.shape} and {text.shape}")
    if not (np.issubdtype(mel.dtype, np.integer) and np.issubdtype(text.dtype, np.integer)):
        raise ValueError(f"lengths must be integer arrays, got {mel.dtype} and {text.dtype}")
    if mel.min() < 1 or text.min() < 0:
        raise ValueError(f"mel lengths must be >= 1 and text lengths >= 0; got min mel "
                         f"{int(mel.min())}, min text {int(text.min())} (empty utterance in the store?)")
    return mel.astype(np.int64), text.astype(np.int64)


@dataclass(frozen=True)
class BucketPlan:
    """The batch plan: per bucket its mel edge, text cap and batch size. Small, frozen and
    picklable (loader workers pad by it).

    ``boundaries`` are ascending mel-frame upper edges; ``text_caps[i]`` and
    ``batch_sizes[i]`` belong to ``boundaries[i]``. A batch belongs to the first bucket
    whose boundary is >= its longest mel, which is exactly the bucket the sampler drew it
    from (every member of bucket i is longer than ``boundaries[i-1]``). ``num_buckets``:
    the buckets asked for (``data.num_buckets``; the plan may use fewer), which a saved
    data position records.
    """

    boundaries: tuple[int, ...]
    text_caps: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    num_buckets: int

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

    def with_batch_sizes(self, sizes: list[int]) -> BucketPlan:
        """The same buckets with one batch size each (e.g. the largest that fits a GPU, as the
        trainer's auto budget measures them)."""
        if len(sizes) != len(self.boundaries) or min(sizes) < 1:
            raise ValueError(f"batch_sizes must give each of the {len(self.boundaries)} buckets "
                             f"a size >= 1, got {list(sizes)}")
        return dataclasses.replace(self, batch_sizes=tuple(int(s) for s in sizes))

    def batch_shapes(self, ref_frames: int, n_mels: int) -> list[BatchShape]:
        """Each bucket's padded batch shape, in bucket order."""
        return [BatchShape(b, l_text, t_mel, ref_frames, n_mels)
                for b, l_text, t_mel in zip(self.batch_sizes, self.text_caps, self.boundaries)]


def plan_buckets(mel_lengths, text_lengths, batch_frames: int, max_batch_size: int = 0,
                 num_buckets: int = 10, pad_multiple: int = 8, fill_cost: float = 1.0
                 ) -> BucketPlan:
    """The plan of the utterances of these lengths: :func:`choose_boundaries`' edges, each
    bucket's text cap (its longest text, rounded up to ``PAD_MULTIPLE``) and batch size
    (``batch_frames // edge``, at most ``max_batch_size`` when that is set, at least 1).
    A budget that cannot hold the longest utterance is a ValueError naming
    ``data.batch_frames`` and the value to use."""
    mel, text = check_lengths(mel_lengths, text_lengths)
    if pad_multiple < 1 or num_buckets < 1 or max_batch_size < 0 or fill_cost < 0:
        raise ValueError(f"need pad_multiple >= 1, num_buckets >= 1, max_batch_size >= 0, "
                         f"fill_cost >= 0; got {pad_multiple}, {num_buckets}, {max_batch_size}, "
                         f"{fill_cost}")
    longest = int(mel.max())
    needed = int(round_up(longest, pad_multiple))
    if batch_frames < needed:
        raise ValueError(
            f"data.batch_frames={batch_frames} cannot hold the longest utterance ({longest} "
            f"frames, padded to {needed}); raise data.batch_frames to at least {needed} or lower "
            f"data.max_duration_s")
    bounds = choose_boundaries(mel, num_buckets, batch_frames, max_batch_size, pad_multiple,
                               fill_cost)
    caps = np.zeros(len(bounds), np.int64)
    np.maximum.at(caps, bucket_index(bounds, mel), text)  # every bucket holds an utterance
    sizes = batch_frames // bounds
    if max_batch_size:
        sizes = np.minimum(sizes, max_batch_size)
    return BucketPlan(tuple(int(b) for b in bounds),
                      tuple(int(round_up(max(int(c), 1), PAD_MULTIPLE)) for c in caps),
                      tuple(max(1, int(s)) for s in sizes), int(num_buckets))


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
