"""One stream of batches across epochs for the store loader's workers, several batches to a
task: every pass is still exactly the sampler's (whole epochs, a pass left early restarting
where it was, set_epoch, a resumed position), with the batches 0 workers build."""

import pytest
import torch

import myxtts.data.feed.loader as loader_mod
from myxtts.data.feed.buckets import plan_buckets
from myxtts.data.feed.loader import batches_per_task, build_loader
from myxtts.data.feed.sampler import BucketBatchSampler
from myxtts.data.feed.stream import WorkerStream

from .test_loader import KEYS, _cfg


def test_a_stream_runs_on_across_epochs_in_groups_from_its_start():
    mel, text = [50 + 7 * i for i in range(40)], [10] * 40
    sampler = BucketBatchSampler(mel, text, plan_buckets(mel, text, 400, 0, 4), seed=3)
    plan = [(e, b) for e in range(4) for b in sampler.batches(e)]
    n = len(sampler)
    stream = WorkerStream(sampler, group=3)
    stream.start = (1, 2)  # a resumed position
    it = iter(stream)
    tasks = [next(it) for _ in range(4)]
    assert all(isinstance(t, list) and len(t) == 3 for t in tasks)
    assert [x for t in tasks for x in t] == plan[n + 2:n + 14]  # across the epoch's end
    assert [next(iter(WorkerStream(sampler, group=1))) for _ in range(2)] == [plan[:1]] * 2
    single = iter(WorkerStream(sampler))  # group 0: one bare (epoch, indices) per task
    assert [next(single) for _ in range(n + 1)] == plan[:n + 1]
    with pytest.raises(ValueError, match="group"):
        WorkerStream(sampler, group=-1)


def test_cheap_batches_travel_several_to_a_task():
    assert batches_per_task(1e-3) == 3 and batches_per_task(0.2e-3) == 3  # capped
    assert batches_per_task(2e-3) == 2 and batches_per_task(30e-3) == 1


@pytest.mark.parametrize("group", [1, 3])
def test_store_workers_stream_keeps_the_samplers_passes(store_path, monkeypatch, group):
    monkeypatch.setattr(loader_mod, "batches_per_task", lambda build_s: group)
    cfg = _cfg()
    ref, ref_sampler = build_loader(store_path, cfg, num_workers=0)
    loader, sampler = build_loader(store_path, cfg, num_workers=2)
    assert loader.slots.slots == 2 * group + 3

    def epoch(e, lo, s):
        s.set_epoch(e)
        return [{k: v.clone() for k, v in b.items()} for b in lo]

    def same(got, want):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert all(torch.equal(a[k], b[k]) for k in KEYS)

    want = {e: epoch(e, ref, ref_sampler) for e in (0, 1, 2, 5)}
    for e in (0, 1):  # consecutive passes
        same([{k: v.clone() for k, v in b.items()} for b in loader], want[e])
    assert sampler.epoch == 2
    it = iter(loader)
    first = {k: v.clone() for k, v in next(it).items()}  # a pass left after one batch ...
    assert sampler.state_dict(1)["position"] == 1
    del it
    same([first], want[2][:1])
    same(list(loader), want[2])  # ... restarts at its start
    same(epoch(5, loader, sampler), want[5])
    # a resumed position mid-epoch: the rest of that epoch, then the next one whole
    state = ref_sampler.state_dict(2)
    ref_sampler.set_epoch(1)
    rest = [{k: v.clone() for k, v in b.items()} for b in ref][2:]
    sampler.load_state_dict(state | {"epoch": 1})
    same(list(loader), rest)
    same(list(loader), want[2])


def test_dropping_a_loader_stops_its_workers_without_the_garbage_collector(store_path):
    """Nothing the workers' stream holds points back at the loader: once the loader is
    dropped its worker processes end (and with them every file they inherited, a run
    folder's lock among them), with no wait for a collection of reference cycles."""
    import gc
    import multiprocessing
    import time

    before = set(multiprocessing.active_children())
    loader, _ = build_loader(store_path, _cfg(), num_workers=2)
    batches = len(list(loader))
    workers = set(multiprocessing.active_children()) - before
    assert batches and len(workers) == 2
    gc.disable()
    try:
        del loader
        deadline = time.time() + 20
        while any(w.is_alive() for w in workers) and time.time() < deadline:
            time.sleep(0.05)
        assert not any(w.is_alive() for w in workers)
    finally:
        gc.enable()
