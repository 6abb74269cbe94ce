"""CopyFeed: each batch with its real frames counted on the host, in the model's dtypes, on
the device: a CPU pass-through, a generic device move, CUDA side-stream copies ahead of use."""

from __future__ import annotations

import pytest
import torch

from myxtts.data.feed.prefetch import CopyFeed
from myxtts.data.feed.protocol import DeviceFeed


def batches(n: int = 5) -> list[dict]:
    return [{"mel": torch.full((2, 3), float(i)), "mel_lengths": torch.tensor([i, i + 1]),
             "indices": torch.tensor([i, i + 1]), "name": f"b{i}"} for i in range(n)]


def test_cpu_passes_the_batches_through_in_order_nothing_lost():
    data = batches()
    feed = CopyFeed(data, "cpu", ahead=2)
    out = list(feed)
    assert len(out) == len(data)
    assert all(a[k] is b[k] for (a, _), b in zip(out, data) for k in b)  # no copy, no cast
    assert [n for _, n in out] == [2 * i + 1 for i in range(5)]  # real frames, on the host
    assert [b for b, _ in feed] == [b for b, _ in out]  # every iter() is a new pass
    assert len(list(CopyFeed((b for b in batches(3)), "cpu"))) == 3  # any iterable


def test_other_devices_move_tensors_and_keep_other_values():
    out = list(CopyFeed(batches(3), "meta"))
    assert [b["name"] for b, _ in out] == ["b0", "b1", "b2"]
    assert out[1][0]["mel"].device.type == "meta" and out[1][0]["mel"].shape == (2, 3)
    assert [n for _, n in out] == [1, 3, 5]  # counted before the move


def test_the_store_feed_pairs_each_batch_with_its_real_frames_in_model_dtypes():
    data = [{"mel": torch.full((2, 4, 3), 0.5, dtype=torch.float16),
             "mel_lengths": torch.tensor([4, i + 1]), "indices": torch.tensor([i])}
            for i in range(3)]
    for device in ("cpu", "meta"):
        feed = CopyFeed(data, device, ahead=2)
        assert isinstance(feed, DeviceFeed) and feed.occupancy() is None  # nothing ahead
        for _ in range(2):  # every iter() is a new pass
            out = list(feed)
            assert [n for _, n in out] == [5, 6, 7]  # counted on the host, before the copy
            assert [b["mel"].dtype for b, _ in out] == [torch.float32] * 3
            assert [b["indices"].dtype for b, _ in out] == [torch.int64] * 3
            assert {b["mel"].device.type for b, _ in out} == {device}
        feed.close()
    on_cpu = list(CopyFeed(data, "cpu"))
    assert torch.equal(on_cpu[2][0]["mel"], torch.full((2, 4, 3), 0.5))
    assert on_cpu[2][0]["indices"] is data[2]["indices"]  # nothing else is touched
    assert [n for _, n in CopyFeed(data, "cpu", frames=None)] == [0, 0, 0]  # not counted


def test_rejects_zero_batches_ahead():
    with pytest.raises(ValueError, match="prefetch_batches"):
        CopyFeed([], "cpu", ahead=0)


@pytest.mark.gpu
@pytest.mark.parametrize("ahead", [1, 2, 8])
def test_cuda_copies_values_to_device_in_order(ahead):
    data = batches(6)
    feed = CopyFeed(data, "cuda", ahead=ahead)
    out = []
    for b, n in feed:
        # Use each batch on the compute stream right away, like a training step would.
        out.append(({"sum": (b["mel"] * 2).sum(), **b}, n))
    assert len(out) == len(data)
    for src, (got, n) in zip(data, out):
        assert got["mel"].is_cuda and got["indices"].is_cuda and got["name"] == src["name"]
        assert n == int(src["mel_lengths"].sum())
        assert torch.equal(got["mel"].cpu(), src["mel"])
        assert torch.equal(got["indices"].cpu(), src["indices"])
        assert got["sum"].item() == pytest.approx(2 * src["mel"].sum().item())
    assert not data[0]["mel"].is_cuda  # inputs untouched
    assert 0 <= feed.occupancy() <= ahead  # copies finished when each batch was asked for
    assert feed.occupancy() == 0.0  # reset by the read
    feed.close()


@pytest.mark.gpu
def test_cuda_float16_batches_are_cast_on_the_device_exactly():
    data = [{"mel": (torch.randn(4, 100, 80) * 3).half().pin_memory(),
             "mel_lengths": torch.tensor([100, 90, 80, 70])} for _ in range(4)]
    out = list(CopyFeed(data, "cuda", ahead=2))
    for src, (got, _) in zip(data, out):
        assert got["mel"].is_cuda and got["mel"].dtype == torch.float32
        assert torch.equal(got["mel"].cpu(), src["mel"].float())
        assert got["mel_lengths"].dtype == torch.int64


@pytest.mark.gpu
def test_cuda_pinned_input_and_large_batches_survive_allocator_reuse():
    # Many big batches through a 2-deep pipeline: with missing record_stream / waits, the
    # values read on the compute stream would come from reused or unfinished buffers.
    data = [{"mel": torch.full((64, 1024, 80), float(i)).pin_memory(),
             "mel_lengths": torch.tensor([1024] * 64)} for i in range(12)]
    sums = []
    for b, _ in CopyFeed(data, torch.device("cuda", 0), ahead=2):
        sums.append((b["mel"] @ torch.ones(80, 1, device="cuda")).mean())
        del b
    assert [s.item() for s in sums] == [80.0 * i for i in range(12)]


@pytest.mark.gpu
def test_a_pass_left_early_and_close_drop_the_copies_ahead():
    data = batches(6)
    feed = CopyFeed(data, "cuda", ahead=3)
    it = iter(feed)
    first, _ = next(it)
    assert len(feed._queue) == 3  # batches 1..3 copied ahead of batch 0
    assert [b["name"] for b, _ in feed] == [b["name"] for b in data]  # a new pass, whole
    feed.close()
    assert not feed._queue and first["mel"].is_cuda
