"""The data role's slot ring: every batch once, in order, with the values the source made,
whichever side is slow; batches the consumer holds are never overwritten; errors surface."""

from __future__ import annotations

import time

import pytest
import torch

from myxtts.data.feed.protocol import DeviceFeed
from myxtts.data.feed.ring import SlotRing


class Source:
    """Re-iterable like a DataLoader: each pass yields ``n`` batches of varying shapes whose
    values encode (pass, position), optionally after ``delay`` seconds each."""

    def __init__(self, n: int = 7, delay: float = 0.0, fail_at: int | None = None) -> None:
        self.n, self.delay, self.fail_at, self.passes = n, delay, fail_at, 0

    def __iter__(self):
        p, self.passes = self.passes, self.passes + 1
        for k in range(self.n):
            if self.delay:
                time.sleep(self.delay)
            if self.fail_at == k:
                raise OSError(f"disk went away at batch {k}")
            yield make_batch(p, k)


def make_batch(p: int, k: int) -> dict:
    b, t = 2 + k % 3, 5 + 4 * (k % 4)  # shapes change from batch to batch, as buckets do
    return {"mel": torch.full((b, t, 3), float(100 * p + k)),
            "mel_lengths": torch.arange(b, dtype=torch.long) + k}


def frames_of(p: int, k: int) -> int:
    return int(make_batch(p, k)["mel_lengths"].sum())


def assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key in want:
        if isinstance(want[key], torch.Tensor):
            assert got[key].dtype == want[key].dtype and torch.equal(got[key], want[key]), key
        else:
            assert got[key] == want[key], key


@pytest.mark.parametrize("producer_delay, consumer_delay", [(0.0, 0.0), (0.01, 0.0), (0.0, 0.01)])
def test_every_batch_once_in_order_with_the_source_values(producer_delay, consumer_delay):
    ring = SlotRing(Source(delay=producer_delay), torch.device("cpu"), slots=3)
    try:
        for p in range(3):  # passes follow each other; the producer runs ahead across them
            got, frames = [], []
            for batch, n_frames in ring:
                got.append({k: v.clone() if isinstance(v, torch.Tensor) else v
                            for k, v in batch.items()})
                frames.append(n_frames)
                time.sleep(consumer_delay)
            assert len(got) == 7
            for k, batch in enumerate(got):
                assert_same(batch, make_batch(p, k))
            assert frames == [frames_of(p, k) for k in range(7)]  # counted on the host item
    finally:
        ring.close()


def test_slots_are_allocated_once_and_reused():
    ring = SlotRing(Source(n=12), torch.device("cpu"), slots=3)
    try:  # every batch kept alive: freed memory cannot be handed out again and look "reused"
        batches = [b for _ in range(2) for b, _ in ring]
    finally:
        ring.close()
    storages = {b["mel"].untyped_storage().data_ptr() for b in batches}
    # 24 batches through three slots, each grown only when a bigger batch arrives
    assert len(batches) == 24 and len(storages) <= 3 * 3


@pytest.mark.parametrize("hold", [1, 3])
def test_held_batches_are_not_overwritten_while_the_producer_runs_ahead(hold):
    ring = SlotRing(Source(n=9), torch.device("cpu"), slots=2, hold=hold)
    assert ring.n_slots == 2 + hold - 1
    try:
        held: list[tuple[int, dict]] = []
        for k, (batch, _) in enumerate(ring):
            held = [*held, (k, batch)][-hold:]
            time.sleep(0.02)  # let the producer fill every free slot meanwhile
            for j, b in held:  # what gradient accumulation keeps is still intact
                assert_same(b, make_batch(0, j))
    finally:
        ring.close()


def test_a_transform_runs_on_the_producer_side_and_frames_are_counted_before_it():
    calls, counted = [], []

    def transform(item: dict, device: torch.device) -> dict:
        calls.append(device)
        return {"mel": item["mel"] * 2}  # the transformed batch has no lengths any more

    def frames(item: dict) -> int:
        counted.append(item["mel"][0, 0, 0].item())
        return 10 * len(counted)

    ring = SlotRing(Source(n=3), torch.device("cpu"), transform=transform, frames=frames)
    try:
        got = [(b["mel"][0, 0, 0].item(), n) for b, n in ring]
    finally:
        ring.close()
    assert got == [(0.0, 10), (2.0, 20), (4.0, 30)] and calls[:3] == [torch.device("cpu")] * 3
    assert counted[:3] == [0.0, 1.0, 2.0]  # the untransformed items


def test_the_ring_is_a_device_feed():
    ring = SlotRing(Source(n=1), torch.device("cpu"))
    assert isinstance(ring, DeviceFeed)
    ring.close()


def test_a_source_error_surfaces_in_the_consumer_and_stops_the_ring():
    ring = SlotRing(Source(n=5, fail_at=3), torch.device("cpu"))
    with pytest.raises(OSError, match="disk went away at batch 3"):
        list(ring)
    assert not ring._thread.is_alive()


def test_an_empty_pass_is_an_error_not_a_hang():
    ring = SlotRing(Source(n=0), torch.device("cpu"))
    with pytest.raises(RuntimeError, match="gave no batch"):
        list(ring)


def test_occupancy_reports_ready_slots():
    ring = SlotRing(Source(n=6), torch.device("cpu"), slots=3)
    try:
        it = iter(ring)
        next(it)
        ring.occupancy()  # forget the first request (the producer had only just started)
        deadline = time.time() + 30
        while ring._ready.qsize() < 2 and time.time() < deadline:
            time.sleep(0.01)  # the producer fills the two free slots (one is held)
        next(it)
        assert ring.occupancy() == 2.0
        assert ring.occupancy() == 0.0  # reset by the read
    finally:
        ring.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("data_on_gpu", [False, True])
def test_cuda_ring_equals_the_source(data_on_gpu):
    dev = torch.device("cuda:0")
    last = torch.cuda.device_count() - 1  # a second GPU when there is one: peer copies

    def transform(item: dict, device: torch.device) -> dict:
        return {k: v.to(device) * 1 if isinstance(v, torch.Tensor) else v for k, v in item.items()}

    ring = SlotRing(Source(n=10), dev, slots=3, transform=transform,
                    data_device=torch.device("cuda", last) if data_on_gpu else torch.device("cpu"))
    try:
        for p in range(2):
            for k, (batch, n_frames) in enumerate(ring):
                torch.cuda._sleep(1_000_000)  # a slow consumer on the GPU
                assert n_frames == frames_of(p, k)
                got = {kk: v.cpu() if isinstance(v, torch.Tensor) else v for kk, v in batch.items()}
                assert_same(got, make_batch(p, k))
    finally:
        ring.close()
