"""Length-bucketed batch sampler: few tensor shapes, little padding, exact resume.

Why buckets: a batch pads to its longest utterance, and every new shape costs a recompile,
autotune and allocator churn. Each bucket pads to ONE mel edge, ONE text cap and ONE batch
size, so an epoch uses at most ``num_buckets`` shapes; the sampler batches by a
``data.feed.buckets.BucketPlan`` made before it (an exact DP minimising frames per epoch,
padding and fill repeats included; the batch sizes the trainer may have measured). Every
batch is handed out as ``(epoch, indices)``: the epoch travels with it to loader workers,
which ``set_epoch`` in the training process never reaches. Fill repeats: a bucket's last
batch is filled with other utterances of the bucket drawn from the (seed, epoch) generator,
never cut short (a new shape) or dropped (unseen data); a few utterances (< one batch per
bucket) are seen twice. The plan of epoch ``e`` depends only on ``(seed, e)``. Only lengths
are read: planning the buckets of a million utterances takes ~0.2 s, an epoch's batches
~0.1 s.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator

import numpy as np
from torch.utils.data import Sampler

from myxtts.data.feed.buckets import BucketPlan, bucket_index, check_lengths

log = logging.getLogger(__name__)

_STATE_KEYS = frozenset({"version", "epoch", "position", "num_batches", "seed", "world_size",
                         "num_buckets", "plan", "fingerprint"})


def _check_keys(keys: set[str], expected: frozenset[str]) -> None:
    """Resume states are exact: every key consumed, nothing unknown (lhotse's contract)."""
    if keys != expected:
        unknown, missing = sorted(keys - expected), sorted(expected - keys)
        raise ValueError(f"sampler state has unknown keys {unknown} and misses keys {missing}; "
                         f"it was not written by this BucketBatchSampler version")


def capped_subset(n: int, cap: int, seed: int) -> np.ndarray | None:
    """A fixed subset of ``cap`` of ``n`` utterances (sorted indices) drawn with ``seed``:
    the same for every rank, world size and resume, since it depends on nothing else. None
    when ``cap`` is 0 (no cap) or ``n <= cap`` (all of them)."""
    if cap <= 0 or n <= cap:
        return None
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed % 2**63, 0xCA9])))
    return np.sort(rng.choice(n, size=cap, replace=False))


class BucketBatchSampler(Sampler[tuple[int, list[int]]]):
    """Yields ``(epoch, indices)``, one length bucket (= one tensor shape) per batch, as
    ``plan`` (``buckets.plan_buckets``) lays the buckets out.

    Iteration semantics (kept deliberately simple):

    * ``iter(sampler)`` starts a *pass* over epoch ``sampler.epoch`` from
      ``sampler.resume_position`` (0 unless restored by :meth:`load_state_dict`).
    * When a pass hands out the last batch of its epoch, the sampler moves to
      ``epoch + 1``, position 0, so ``for epoch ...: for b in loader`` and an endless
      ``while True: for b in loader`` both walk through consecutive epochs.
    * A pass abandoned before the end changes nothing: the next pass starts the same
      epoch at the same position. To continue where you stopped, use
      ``load_state_dict(state_dict(consumed))``.
    * ``set_epoch(e)`` (DistributedSampler convention) jumps to epoch ``e``, position 0.

    Distributed: the global batch list of an epoch is padded to a multiple of
    ``world_size`` by repeating its first batches, and rank ``r`` takes
    ``batches[r::world_size]``; so every rank runs exactly ``len(sampler)`` steps per
    epoch (no rank waits in an all-reduce for a step another never takes) and the
    union over ranks covers every utterance. All ranks must use the same seed.

    ``shuffle=False`` (validation): batches come in bucket order with the same members
    and fill every epoch.

    ``only``: indices of the utterances to draw from (e.g. :func:`capped_subset`'s); the
    others are never batched and the plan must be made of the drawn ones' lengths alone.
    None: all.

    Resume: ``state_dict(consumed)`` records epoch and position. ``consumed`` is the
    number of batches the consumer actually took from the *current pass* (a DataLoader
    with workers pulls indices ahead of the training loop, so "yielded" over-counts);
    it defaults to the number yielded in this pass.
    """

    def __init__(self, mel_lengths: np.ndarray, text_lengths: np.ndarray, plan: BucketPlan,
                 seed: int = 0, rank: int = 0, world_size: int = 1, shuffle: bool = True,
                 only: np.ndarray | None = None) -> None:
        super().__init__()
        self.mel_lengths, self.text_lengths = check_lengths(mel_lengths, text_lengths)
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}")
        n = len(self.mel_lengths)
        # the utterances drawn from (indices into the lengths): all, or a fixed subset
        self.only = None if only is None else np.unique(np.asarray(only, dtype=np.int64))
        if self.only is not None and (len(self.only) == 0 or self.only[0] < 0
                                      or self.only[-1] >= n):
            raise ValueError(f"only must hold indices in [0, {n}), got {len(self.only)} "
                             f"ranging {self.only[:1]}..{self.only[-1:]}")
        drawn = np.arange(n) if self.only is None else self.only
        plan.bucket_for(int(self.mel_lengths[drawn].max()))  # the plan holds every utterance
        self.plan = plan
        self.num_buckets = plan.num_buckets
        self.seed = int(seed)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.shuffle = bool(shuffle)

        bounds = np.asarray(plan.boundaries, dtype=np.int64)
        self.bucket_of = bucket_index(bounds, self.mel_lengths)  # [N]
        # Stable: members keep index order. On int16 (at most _MAX_CANDIDATES buckets) numpy
        # sorts by radix, ~7x faster than on int64.
        order = drawn[np.argsort(self.bucket_of[drawn].astype(np.int16), kind="stable")]
        counts = np.bincount(self.bucket_of[drawn], minlength=len(bounds))
        self._members: list[np.ndarray] = np.split(order, np.cumsum(counts)[:-1])  # sorted idx
        self.boundaries: list[int] = list(plan.boundaries)
        self.bucket_batch_sizes: list[int] = list(plan.batch_sizes)
        self.text_caps: list[int] = list(plan.text_caps)
        self.bucket_counts: list[int] = [int(c) for c in counts]
        self.bucket_num_batches: list[int] = [
            -(-c // b) for c, b in zip(self.bucket_counts, self.bucket_batch_sizes)]
        self.num_batches_global = sum(self.bucket_num_batches)  # before distributed padding
        self._per_rank = -(-self.num_batches_global // self.world_size)

        digest = hashlib.sha256(self.mel_lengths.tobytes() + b"|" + self.text_lengths.tobytes())
        if self.only is not None:
            digest.update(b"|only|" + self.only.tobytes())
        self.fingerprint = digest.hexdigest()[:16]
        plan_repr = repr((self.boundaries, self.bucket_batch_sizes, self.text_caps, self.shuffle))
        self._plan_hash = hashlib.sha256(plan_repr.encode()).hexdigest()[:16]

        self._epoch = 0
        self._start = 0
        self._pass_epoch: int | None = None  # epoch / start / yielded of the latest pass
        self._pass_start = 0
        self._yielded = 0
        self._pass_id = 0  # a generator from an older pass must not touch the bookkeeping

    # ------------------------------------------------------------------ planning

    def _rng(self, epoch: int) -> np.random.Generator:
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence(
            [self.seed % 2**63, epoch % 2**63, 0x5EED])))

    def global_batches(self, epoch: int) -> list[np.ndarray]:
        """All ranks' batches of ``epoch`` (padded to a multiple of world_size), in order."""
        rng = self._rng(epoch)
        batches: list[np.ndarray] = []
        for members, size in zip(self._members, self.bucket_batch_sizes):
            n = len(members)
            perm = members[rng.permutation(n)] if self.shuffle else members
            rem = n % size
            if rem:
                fill = size - rem
                # Prefer utterances from the bucket's full batches: no repeat inside a batch.
                pool = perm[: n - rem] if n - rem >= fill else members
                if self.shuffle:
                    extra = rng.choice(pool, size=fill, replace=len(pool) < fill)
                else:  # unshuffled (validation): the same fill every epoch
                    extra = np.resize(pool, fill)
                perm = np.concatenate([perm, extra])
            batches.extend(perm.reshape(-1, size))
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        n_global = -(-len(batches) // self.world_size) * self.world_size
        return [batches[i % len(batches)] for i in range(n_global)]  # repeats the first ones

    def batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches of ``epoch`` (what a full pass over that epoch yields)."""
        return [b.tolist() for b in self.global_batches(epoch)[self.rank::self.world_size]]

    # ------------------------------------------------------------------ iteration

    def __len__(self) -> int:
        """Batches per rank per epoch."""
        return self._per_rank

    @property
    def real_batches(self) -> int:
        """This rank's batches per epoch that are not padding: an epoch's batch list is padded
        to a multiple of world_size by repeating its first batches, which land at the end of
        the ranks' lists. Validation weighs those repeats 0, so sharded validation averages
        exactly the batches a single process would."""
        return len(range(self.rank, self.num_batches_global, self.world_size))

    @property
    def epoch(self) -> int:
        """Epoch the next pass iterates."""
        return self._epoch

    @property
    def resume_position(self) -> int:
        """Batch position (in this rank's epoch) where the next pass starts."""
        return self._start

    def set_epoch(self, epoch: int) -> None:
        self._epoch = int(epoch)
        self._start = 0
        self._pass_epoch, self._pass_start, self._yielded = None, 0, 0
        self._pass_id += 1  # detach any running pass

    def __iter__(self) -> Iterator[tuple[int, list[int]]]:
        # Bookkeeping happens here, not in the generator body: the pass "starts" when
        # iter() is called (DataLoader does so when the loop begins), so a state_dict taken
        # before the first batch refers to this pass, not the previous one.
        epoch, start = self._epoch, self._start
        self._pass_id += 1
        self._pass_epoch, self._pass_start, self._yielded = epoch, start, 0
        return self._run(epoch, start, self._pass_id)

    def _run(self, epoch: int, start: int, pass_id: int) -> Iterator[tuple[int, list[int]]]:
        mine = self.global_batches(epoch)[self.rank::self.world_size]
        last = len(mine) - 1
        for pos in range(start, len(mine)):
            if pass_id == self._pass_id:
                self._yielded += 1
                if pos == last:
                    # Advance before handing out the last batch so a consumer that stops
                    # after exactly len(sampler) batches (zip, islice) still moves on.
                    self._epoch, self._start = epoch + 1, 0
            yield epoch, mine[pos].tolist()

    # ------------------------------------------------------------------ resume

    def state_dict(self, consumed: int | None = None) -> dict:
        """Epoch/position to resume at, plus what must match for the position to mean anything.

        ``consumed``: batches taken by the consumer from the current pass (default: the
        number yielded in it). Before any pass, it counts from the resume position.
        """
        if self._pass_epoch is None:
            epoch, base, limit = self._epoch, self._start, 0
        else:
            epoch, base, limit = self._pass_epoch, self._pass_start, self._yielded
        n = limit if consumed is None else consumed
        if not 0 <= n <= limit:
            raise ValueError(f"state_dict(consumed={consumed}): only {limit} batches were handed out "
                             f"in this pass; pass the number of batches the training loop consumed")
        position = base + n
        if position >= len(self):
            epoch, position = epoch + 1, 0
        return {"epoch": int(epoch), "position": int(position), **self.plan_state()}

    def plan_state(self) -> dict:
        """What a saved position depends on (seed, ranks, the batch plan, the lengths): the
        trainer stores this with its own record of epoch and position (``TrainingProgress``)."""
        return {"version": 1, "num_batches": len(self), "seed": self.seed,
                "world_size": self.world_size, "num_buckets": self.num_buckets,
                "plan": self._plan_hash, "fingerprint": self.fingerprint}

    def load_state_dict(self, state: dict) -> None:
        """Make the next pass start at the saved epoch/position (refuses incompatible states)."""
        _check_keys(set(state), _STATE_KEYS)
        plan = {k: v for k, v in state.items() if k not in ("epoch", "position")}
        self.resume(plan, state["epoch"], state["position"])

    def resume(self, plan: dict, epoch: int, position: int) -> int:
        """Start the next pass at ``epoch``/``position``, saved with ``plan`` (``plan_state``).

        Refuses a plan of another seed, world size or set of lengths (the position would
        point elsewhere). A changed batch plan (batch_frames / max_batch_size / num_buckets,
        e.g. lowered after an OOM) keeps the epoch and maps the position proportionally.
        Returns the position the next pass starts at.
        """
        _check_keys(set(plan), _STATE_KEYS - {"epoch", "position"})
        if plan["version"] != 1:
            raise ValueError(f"sampler state version {plan['version']} is not supported (expected 1)")
        if plan["world_size"] != self.world_size:
            raise ValueError(f"sampler state was saved with world_size={plan['world_size']} but this "
                             f"run has world_size={self.world_size}; the per-rank epoch position "
                             f"cannot be mapped -- resume with the same number of processes")
        if plan["seed"] != self.seed:
            raise ValueError(f"sampler state was saved with seed={plan['seed']} but this run uses "
                             f"seed={self.seed}; the batch order would differ -- keep data.shuffle_seed")
        if plan["fingerprint"] != self.fingerprint:
            raise ValueError("sampler state was saved for a different set of utterance lengths (the "
                             "store changed or another split is used); resume from the same store")
        epoch, position = int(epoch), int(position)
        if position == plan["num_batches"]:
            # saved right after the epoch's last batch (before the next pass began): the
            # epoch is done, the next pass is the next epoch's first batch
            epoch, position = epoch + 1, 0
        if plan["plan"] != self._plan_hash or plan["num_buckets"] != self.num_buckets \
                or plan["num_batches"] != len(self):
            new = min(len(self) - 1, round(position * len(self) / max(1, plan["num_batches"])))
            log.warning("batch plan changed since the sampler state was saved; resuming epoch %d at "
                        "batch %d of %d (was %d of %d)", epoch, new, len(self), position,
                        plan["num_batches"])
            position = new
        if not 0 <= position < len(self):
            raise ValueError(f"sampler state position {position} is outside [0, {len(self)})")
        self._epoch, self._start = epoch, position
        self._pass_epoch, self._pass_start, self._yielded = None, 0, 0
        self._pass_id += 1  # detach any running pass
        return position

    # ------------------------------------------------------------------ reporting

    def shapes(self) -> list[tuple[int, int, int]]:
        """Distinct ``(B, L_text, T_mel)`` batch shapes."""
        return sorted(set(zip(self.bucket_batch_sizes, self.text_caps, self.boundaries)))

    def _bucket_frames(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Per bucket: real mel frames and padded mel frames over ``epoch`` (all ranks)."""
        real = np.zeros(len(self.boundaries))
        padded = np.zeros(len(self.boundaries))
        for b in self.global_batches(epoch):
            k = self.bucket_of[b[0]]
            real[k] += self.mel_lengths[b].sum()
            padded[k] += len(b) * self.boundaries[k]
        return real, padded

    def padding_efficiency(self, epoch: int | None = None) -> float:
        """Real / padded mel frames over an epoch (fill repeats count as real frames)."""
        real, padded = self._bucket_frames(self._epoch if epoch is None else epoch)
        return float(real.sum() / padded.sum())

    def summary(self) -> str:
        real, padded = self._bucket_frames(self._epoch)
        lines = [f"{'bucket':>6} {'T_mel':>6} {'L_text':>6} {'batch':>5} {'utts':>6} "
                 f"{'batches':>7} {'fill':>5} {'effic':>6}"]
        for k in range(len(self.boundaries)):
            fill = self.bucket_num_batches[k] * self.bucket_batch_sizes[k] - self.bucket_counts[k]
            lines.append(f"{k:>6} {self.boundaries[k]:>6} {self.text_caps[k]:>6} "
                         f"{self.bucket_batch_sizes[k]:>5} {self.bucket_counts[k]:>6} "
                         f"{self.bucket_num_batches[k]:>7} {fill:>5} "
                         f"{real[k] / max(padded[k], 1):>6.3f}")
        lines.append(f"{len(self.shapes())} shapes, {self.num_batches_global} batches/epoch "
                     f"({len(self)} per rank x {self.world_size}), padding efficiency "
                     f"{real.sum() / padded.sum():.3f}")
        return "\n".join(lines)
