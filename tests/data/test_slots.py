"""Shared-memory slots between loader workers and the training process: a worker builds its
batch in a free slot, the training process hands the slot's memory out without a copy, and
a slot goes back to its worker only once nothing holds any part of its batch."""

import gc

import numpy as np
import pytest
import torch

import myxtts.data.feed.slots as slots_mod
from myxtts.data.feed.loader import build_loader
from myxtts.data.feed.slots import FREE, SlotCollator, SlotRef, Slots

from .test_loader import KEYS, _cfg


class Writer:
    """Worker 0 of a store loader: ``writer(k)`` builds the k-th batch of epoch 0 into a free
    slot (``Slots.write``, as ``StoreBatches.__getitems__`` does); ``built(k)`` is that batch
    built in memory of its own."""

    def __init__(self, loader, sampler):
        self.batches, self.tasks = loader.batches, sampler.batches(0)[:4]

    def __call__(self, k):
        return self.batches.slots.write(lambda alloc: self.batches.batch(0, self.tasks[k], alloc))

    def built(self, k):
        return self.batches.batch(0, self.tasks[k])


@pytest.fixture
def worker(store_path, monkeypatch):
    """(Slots with 2 slots for one worker, its Writer): calls made in this process act as
    worker 0's, ``take`` as the training process's."""
    loader, sampler = build_loader(store_path, _cfg(), num_workers=1)
    slots = loader.slots
    slots.allocate(1, 2)
    monkeypatch.setattr(slots_mod, "get_worker_info", lambda: type("W", (), {"id": 0})())
    return slots, Writer(loader, sampler)


def _same(batch, expected):
    for k in KEYS:
        assert torch.equal(batch[k], expected[k]), k


def test_a_batch_is_built_in_its_slot_and_handed_out_without_a_copy(worker):
    slots, write = worker
    ref = write(0)
    assert isinstance(ref, SlotRef) and ref.slot == 0
    batch = slots.take(ref, pin=False)
    _same(batch, write.built(0))
    base = slots.buffers[0, 0]
    start, end = base.data_ptr(), base.data_ptr() + base.numel()
    assert all(start <= t.data_ptr() < end for t in batch.values())  # the slot's own memory


def test_a_held_batch_keeps_its_slot_and_a_dropped_one_gives_it_back(worker):
    slots, write = worker
    first = slots.take(write(0), pin=False)
    second = slots.take(write(1), pin=False)
    expected = [{k: v.clone() for k, v in b.items()} for b in (first, second)]
    # both slots held: the worker's next batch comes in memory of its own, and is right
    own = write(2)
    assert isinstance(own, dict)
    _same(own, write.built(2))
    _same(first, expected[0])
    _same(second, expected[1])  # neither held batch was touched
    view = first["mel"][:, :3]  # a view alone still holds the slot
    del first
    gc.collect()
    slots._release_dropped()
    assert slots.held() == 2 and int(slots.headers[0, 0]) > 0
    del view
    slots._release_dropped()
    assert slots.held() == 1 and int(slots.headers[0, 0]) == FREE
    ref = write(2)
    assert isinstance(ref, SlotRef) and ref.slot == 0
    third = slots.take(ref, pin=False)
    _same(third, write.built(2))
    _same(second, expected[1])


def test_batches_a_pass_left_unread_are_reclaimed(worker):
    slots, write = worker
    skipped = write(0)  # sent, never taken (a pass left early)
    later = write(1)
    assert {skipped.slot, later.slot} == {0, 1}
    batch = slots.take(later, pin=False)
    assert int(slots.headers[0, skipped.slot]) == FREE  # older, not held: given back
    _same(batch, write.built(1))


def test_a_slot_written_under_a_reader_is_an_error_not_wrong_data(worker):
    slots, write = worker
    ref = write(0)
    slots.headers[0, ref.slot] = ref.seq + 7  # what a broken protocol would leave
    with pytest.raises(RuntimeError, match="overwritten"):
        slots.take(ref, pin=False)


def test_any_collate_functions_batch_is_copied_into_a_slot(monkeypatch):
    # The on-the-fly path's collate function builds its own tensors: they are copied in.
    monkeypatch.setattr(slots_mod, "get_worker_info", lambda: type("W", (), {"id": 0})())
    made = {"wav": torch.randn(3, 1000), "lengths": torch.tensor([1000, 700, 20])}
    slots = Slots(1 << 16)
    collate = SlotCollator(lambda items: {k: v.clone() for k, v in made.items()}, slots)
    slots.allocate(1, 2)
    ref = collate([None])
    assert isinstance(ref, SlotRef)
    batch = slots.take(ref, pin=False)
    assert batch.keys() == made.keys() and all(torch.equal(batch[k], made[k]) for k in made)
    # a batch larger than a slot travels in memory of its own, and frees the slot it tried
    small = Slots(1024)
    small.allocate(1, 2)
    out = SlotCollator(lambda items: {k: v.clone() for k, v in made.items()}, small)([None])
    assert isinstance(out, dict) and torch.equal(out["wav"], made["wav"])
    assert int(small.headers[0, 0]) == FREE
    assert SlotCollator(lambda items: None, slots)([None]) is None  # no clip of it loaded
    assert (slots.headers[0] == FREE).sum() == 1  # only the taken batch's slot is held


def test_an_array_counts_as_free_only_once_no_tensor_or_view_holds_it():
    from myxtts.data.feed.buffers import unreferenced

    held = (np.zeros(8, np.float32),)
    assert unreferenced(held)
    view = torch.from_numpy(held[0])[2:5]
    assert not unreferenced(held)
    del view
    assert unreferenced(held)
    assert not unreferenced((held[0], np.zeros(1)))  # ``held`` holds it too


def test_a_batch_that_fails_to_build_gives_its_slot_back(worker):
    slots, _ = worker

    def broken(alloc):
        alloc({"mel": ((2, 3), torch.float32)})
        raise ValueError("utterance 7: mel must be [frames, 80]")

    with pytest.raises(ValueError, match="utterance 7"):
        slots.write(broken)
    assert (slots.headers[0] == FREE).all()
