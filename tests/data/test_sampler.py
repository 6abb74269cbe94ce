"""BucketBatchSampler: plan quality, determinism, distributed balance, exact resume; every
batch handed out as ``(epoch, indices)``."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import pickle
from collections import Counter

import numpy as np
import pytest

from myxtts.data.feed.buckets import BucketPlan, plan_buckets
from myxtts.data.feed.sampler import BucketBatchSampler


def lj_lengths(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """LJSpeech-like: lognormal mel lengths in [100, 900] frames, ~0.18 tokens per frame."""
    rng = np.random.default_rng(seed)
    x = np.exp(rng.normal(np.log(450), 0.35, 4 * n))
    mel = x[(x >= 100) & (x <= 900)][:n].astype(np.int64)
    text = (mel * 0.18 + rng.integers(2, 20, n)).astype(np.int64)
    return mel, text


MEL, TEXT = lj_lengths(2000)


def planned(mel, text, batch_frames, max_batch_size=0, num_buckets=10, pad_multiple=8,
            fill_cost=1.0, **kw) -> BucketBatchSampler:
    """The sampler of these lengths with the plan ``plan_buckets`` makes of them."""
    plan = plan_buckets(mel, text, batch_frames, max_batch_size, num_buckets, pad_multiple,
                        fill_cost)
    return BucketBatchSampler(mel, text, plan, **kw)


def make(mel=MEL, text=TEXT, **kw) -> BucketBatchSampler:
    args = dict(batch_frames=6000, max_batch_size=24, num_buckets=8, seed=3)
    args.update(kw)
    return planned(mel, text, **args)


def indices(batches) -> list[list[int]]:
    """The index lists of ``(epoch, indices)`` pairs (a pass of the sampler)."""
    return [b for _, b in batches]


# ---------------------------------------------------------------- plan


def test_batches_respect_budget_buckets_and_shapes():
    s = make()
    table = s.plan
    assert len(s.shapes()) <= 8
    assert s.boundaries == sorted(s.boundaries) and all(b % 8 == 0 for b in s.boundaries)
    assert s.boundaries[-1] >= MEL.max()
    seen_shapes = set()
    for epoch, batch in s:
        assert epoch == 0  # every batch carries its epoch
        k = int(s.bucket_of[batch[0]])
        assert all(s.bucket_of[i] == k for i in batch)  # one bucket per batch
        size, cap, edge = s.bucket_batch_sizes[k], s.text_caps[k], s.boundaries[k]
        assert len(batch) == size <= 24
        assert size * edge <= 6000
        assert MEL[batch].max() <= edge and TEXT[batch].max() <= cap and cap % 8 == 0
        assert table.shape_for(int(MEL[batch].max())) == (edge, cap)  # collate finds the bucket
        seen_shapes.add((len(batch), cap, edge))
    assert seen_shapes == set(s.shapes())


def test_the_plan_is_a_frozen_value_the_sampler_batches_by():
    plan = plan_buckets(MEL, TEXT, 6000, 24, 8)
    s = BucketBatchSampler(MEL, TEXT, plan, seed=3)
    assert s.plan is plan and s.boundaries == list(plan.boundaries)
    assert s.bucket_batch_sizes == list(plan.batch_sizes) and s.text_caps == list(plan.text_caps)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.batch_sizes = (1,)  # type: ignore[misc]
    sizes = [k + 1 for k in range(len(plan.boundaries))]
    sized = plan.with_batch_sizes(sizes)  # e.g. what the trainer measured to fit
    assert (sized.boundaries, sized.text_caps) == (plan.boundaries, plan.text_caps)
    assert list(sized.batch_sizes) == sizes and plan.batch_sizes != sized.batch_sizes
    other = BucketBatchSampler(MEL, TEXT, sized, seed=3)
    assert other.bucket_batch_sizes == sizes and other.plan_state()["plan"] != s.plan_state()["plan"]
    assert all(len(b) == sizes[other.bucket_of[b[0]]] for b in other.batches(0))
    with pytest.raises(ValueError, match="batch_sizes must give each of the"):
        plan.with_batch_sizes(sizes[1:])
    with pytest.raises(ValueError, match="longest bucket"):  # a plan of other lengths
        BucketBatchSampler(MEL * 2, TEXT, plan)


def test_unlimited_batch_size_uses_whole_budget():
    s = make(max_batch_size=0)
    assert s.bucket_batch_sizes == [6000 // b for b in s.boundaries]


def test_every_utterance_every_epoch_fill_repeats_only_within_bucket():
    s = make()
    for epoch in range(2):
        batches = s.batches(epoch)
        counts = Counter(itertools.chain.from_iterable(batches))
        assert set(counts) == set(range(len(MEL)))
        fill = sum(n * b for n, b in zip(s.bucket_num_batches, s.bucket_batch_sizes)) - len(MEL)
        assert sum(counts.values()) - len(MEL) == fill
        assert fill < sum(s.bucket_batch_sizes)  # less than one batch per bucket
        assert len(batches) == len(s) == s.num_batches_global


def test_tiny_bucket_repeats_inside_a_batch_but_keeps_shape():
    mel = np.array([100, 101, 102, 800, 801], dtype=np.int64)
    s = planned(mel, mel // 10, batch_frames=4000, max_batch_size=8, num_buckets=2,
                           fill_cost=0.0)
    assert len(s.boundaries) == 2
    for batch in s.batches(0):
        assert len(batch) == s.bucket_batch_sizes[s.bucket_of[batch[0]]]
    assert set(itertools.chain.from_iterable(s.batches(0))) == set(range(5))


def test_padding_efficiency_ljspeech_like_13k():
    mel, text = lj_lengths(13000, seed=1)
    s = planned(mel, text, batch_frames=12000, max_batch_size=64, num_buckets=16)
    assert len(s.shapes()) <= 16
    assert s.padding_efficiency() >= 0.95
    # The figure is what the batches really contain.
    real = sum(int(mel[b].sum()) for b in s.batches(0))
    padded = sum(len(b) * s.boundaries[s.bucket_of[b[0]]] for b in s.batches(0))
    assert s.padding_efficiency(0) == pytest.approx(real / padded)


def test_padding_efficiency_100_utterances_and_why_the_default_uses_fewer_buckets():
    mel, text = lj_lengths(100, seed=2)
    pad_only = planned(mel, text, batch_frames=12000, max_batch_size=64,
                                  num_buckets=16, fill_cost=0.0)
    assert len(pad_only.shapes()) <= 16
    assert pad_only.padding_efficiency() >= 0.95
    # Default (fill_cost=1): fewer, fuller buckets -> far fewer GPU frames per epoch,
    # because 100 clips cannot fill 16 buckets of ~20-utterance batches without repeats.
    default = planned(mel, text, batch_frames=12000, max_batch_size=64, num_buckets=16)

    def gpu_frames(s):
        return sum(n * b * t for n, b, t in
                   zip(s.bucket_num_batches, s.bucket_batch_sizes, s.boundaries))

    assert len(default.boundaries) < len(pad_only.boundaries)
    assert gpu_frames(default) < 0.6 * gpu_frames(pad_only)


def test_batch_frames_too_small_is_one_clear_line():
    mel = np.array([120, 901, 300], dtype=np.int64)
    with pytest.raises(ValueError) as err:
        planned(mel, mel // 5, batch_frames=800)
    msg = str(err.value)
    assert "\n" not in msg
    for part in ("data.batch_frames=800", "901 frames", "at least 904", "data.max_duration_s"):
        assert part in msg
    planned(mel, mel // 5, batch_frames=904)  # exactly enough works


@pytest.mark.parametrize("bad", [dict(mel=np.array([], dtype=np.int64)),
                                 dict(mel=np.array([0, 5])),
                                 dict(mel=np.array([1.5, 2.0]))])
def test_rejects_bad_lengths(bad):
    mel = bad["mel"]
    with pytest.raises(ValueError):
        planned(mel, np.zeros(len(mel), dtype=np.int64), batch_frames=1000)


def test_summary_and_plan_pickle():
    s = make()
    text = s.summary()
    assert len(text.splitlines()) == len(s.boundaries) + 2
    assert f"padding efficiency {s.padding_efficiency():.3f}" in text
    table = pickle.loads(pickle.dumps(s.plan))
    assert isinstance(table, BucketPlan) and table == s.plan
    assert table.shape_for(1) == (s.boundaries[0], s.text_caps[0])
    with pytest.raises(ValueError, match="stale store"):
        table.shape_for(s.boundaries[-1] + 1)


# ---------------------------------------------------------------- determinism


def test_same_seed_and_epoch_same_batches_other_epoch_or_seed_differs():
    a, b = make(), make()
    assert a.batches(0) == b.batches(0)
    assert list(a) == list(b) == [(0, x) for x in a.batches(0)]  # epoch 0 via iteration
    assert list(a) == [(1, x) for x in b.batches(1)]  # both moved on to epoch 1
    assert a.batches(0) != a.batches(1)
    assert sorted(map(tuple, a.batches(0))) != sorted(map(tuple, a.batches(1)))  # reshuffled within buckets
    assert make(seed=4).batches(0) != a.batches(0)


def test_no_shuffle_is_stable_and_ordered_by_bucket():
    s = make(shuffle=False)
    assert s.batches(0) == s.batches(5)
    buckets = [int(s.bucket_of[b[0]]) for b in s.batches(0)]
    assert buckets == sorted(buckets)


def test_epochs_advance_automatically_and_set_epoch():
    s = make()
    assert [list(s) for _ in range(3)] == [[(e, b) for b in s.batches(e)] for e in range(3)]
    assert s.epoch == 3
    s.set_epoch(1)
    assert list(s) == [(1, b) for b in s.batches(1)]
    # A consumer that takes exactly len(s) batches (no StopIteration) still moves on.
    s.set_epoch(0)
    taken = list(itertools.islice(iter(s), len(s)))
    assert indices(taken) == s.batches(0) and s.epoch == 1


def test_abandoned_pass_restarts_same_epoch():
    s = make()
    it = iter(s)
    first = [next(it) for _ in range(3)]
    assert indices(s) == s.batches(0) and indices(first) == s.batches(0)[:3]


# ---------------------------------------------------------------- distributed


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ranks_get_equal_batch_counts_and_cover_everything(world_size):
    ranks = [make(rank=r, world_size=world_size) for r in range(world_size)]
    lens = {len(s) for s in ranks}
    assert len(lens) == 1
    per_rank = [indices(s) for s in ranks]
    assert {len(b) for b in per_rank} == lens
    covered = set(itertools.chain.from_iterable(itertools.chain.from_iterable(per_rank)))
    assert covered == set(range(len(MEL)))
    # Same global plan as a single process, padded by repeating its first batches.
    single = make().batches(0)
    glob = ranks[0].global_batches(0)
    assert [b.tolist() for b in glob[: len(single)]] == single
    assert [b.tolist() for b in glob[len(single):]] == single[: len(glob) - len(single)]
    assert len(glob) == len(s := ranks[0]) * world_size and len(s) == -(-len(single) // world_size)


def test_more_ranks_than_batches():
    mel = np.array([200, 210, 220], dtype=np.int64)
    ranks = [planned(mel, mel // 5, 12000, rank=r, world_size=4) for r in range(4)]
    assert [len(list(s)) for s in ranks] == [1, 1, 1, 1]


def test_bad_rank():
    with pytest.raises(ValueError, match="rank"):
        make(rank=2, world_size=2)


# ---------------------------------------------------------------- resume


def _reference(epochs: int = 2) -> list[tuple[int, list[int]]]:
    s = make()
    return [b for _ in range(epochs) for b in s]


@pytest.mark.parametrize("k", [0, 1, 17])
def test_resume_mid_epoch_matches_uninterrupted(k):
    ref = _reference()
    s = make()
    it = iter(s)
    got = [next(it) for _ in range(k)]
    state = s.state_dict()
    assert state["epoch"] == 0 and state["position"] == k
    fresh = make()
    fresh.load_state_dict(state)
    rest = list(fresh) + list(fresh)  # rest of epoch 0, then epoch 1
    assert got + rest == ref


def test_resume_across_epoch_boundary():
    ref = _reference(3)
    s = make()
    list(s)  # epoch 0 done
    assert s.state_dict()["epoch"] == 1 and s.state_dict()["position"] == 0
    it = iter(s)
    got = [next(it) for _ in range(5)]
    fresh = make()
    fresh.load_state_dict(s.state_dict())
    rest = list(fresh) + list(fresh)
    assert ref[: len(s)] + got + rest == ref


def test_resume_with_consumed_behind_prefetch():
    ref = _reference()
    s = make()
    it = iter(s)
    for _ in range(10):  # a loader pulled 10 index lists, the training loop used 6
        next(it)
    fresh = make()
    fresh.load_state_dict(s.state_dict(consumed=6))
    assert ref[:6] + list(fresh) + list(fresh) == ref
    with pytest.raises(ValueError, match="consumed"):
        s.state_dict(consumed=11)


def test_resume_of_a_resumed_pass_and_end_of_epoch_by_consumed():
    s = make()
    s.load_state_dict({**s.state_dict(), "position": 7})
    it = iter(s)
    next(it), next(it)
    assert s.state_dict(consumed=1)["position"] == 8  # counted from the pass's start
    n_left = len(s) - 7
    list(it)
    assert s.state_dict(consumed=n_left) == {**s.state_dict(), "epoch": 1, "position": 0}


def test_resume_at_the_end_of_an_epoch_starts_the_next_epoch():
    # the trainer's record after consuming an epoch's last batch, before the next pass begins
    ref = _reference(2)
    s = make()
    plan = s.plan_state()
    fresh = make()
    assert fresh.resume(plan, 0, len(s)) == 0
    assert fresh.epoch == 1 and list(fresh) == ref[len(s):]
    other = make(batch_frames=3000)  # a changed plan must not replay epoch 0's tail either
    other.resume(plan, 0, len(s))
    assert other.epoch == 1 and other.resume_position == 0
    with pytest.raises(ValueError, match="outside"):
        make().resume(plan, 0, len(s) + 1)


def test_load_state_refusals():
    s = make(rank=0, world_size=2)
    state = s.state_dict()
    with pytest.raises(ValueError, match="world_size=2.*world_size=1"):
        make().load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        make(world_size=2, seed=99).load_state_dict(state)
    with pytest.raises(ValueError, match="different set of utterance lengths"):
        make(mel=MEL + 1, world_size=2).load_state_dict(state)
    with pytest.raises(ValueError, match=r"unknown keys \['extra'\]") as err:
        make(world_size=2).load_state_dict({**state, "extra": 1})
    assert "\n" not in str(err.value)
    missing = dict(state)
    del missing["position"]
    with pytest.raises(ValueError, match=r"misses keys \['position'\]"):
        make(world_size=2).load_state_dict(missing)


def test_changed_plan_maps_position_proportionally(caplog):
    s = make()
    s.load_state_dict({**s.state_dict(), "position": len(s) // 2})
    other = make(batch_frames=3000)  # e.g. lowered after an OOM
    with caplog.at_level(logging.WARNING):
        other.load_state_dict(s.state_dict())
    assert "batch plan changed" in caplog.text
    assert abs(other.resume_position - len(other) // 2) <= 1


class _Tasks:
    """A dataset whose batch of ``(epoch, indices)`` is that pair (what a worker received)."""

    def __getitems__(self, task):
        return task


def test_resume_through_a_multiworker_dataloader():
    # Workers pull (epoch, indices) ahead of the loop; state_dict(consumed) must count what
    # the loop used. DataLoader also calls iter(batch_sampler) twice per pass (init + reset).
    from torch.utils.data import DataLoader

    mel, text = lj_lengths(120, seed=1)

    def loader_for(sampler):
        return DataLoader(_Tasks(), batch_sampler=sampler, num_workers=2,
                          collate_fn=lambda b: b)

    def make_small():
        return planned(mel, text, batch_frames=3000, max_batch_size=8, num_buckets=3)

    ref_sampler = make_small()
    ref = [b for _ in range(2) for b in loader_for(ref_sampler)]
    assert [e for e, _ in ref] == [0] * len(ref_sampler) + [1] * len(ref_sampler)
    sampler = make_small()
    got = []
    for i, batch in enumerate(loader_for(sampler)):
        got.append(batch)
        if i == 6:
            break
    state = sampler.state_dict(consumed=7)
    assert state["position"] == 7 and sampler.state_dict()["position"] > 7  # workers ran ahead
    resumed = make_small()
    resumed.load_state_dict(state)
    loader = loader_for(resumed)
    got += [b for _ in range(2) for b in loader]
    assert got == ref
