"""DevicePrefetcher: CPU pass-through, generic device move, CUDA side-stream copies."""

from __future__ import annotations

import pytest
import torch

from myxtts.data.feed.prefetch import DevicePrefetcher


def batches(n: int = 5) -> list[dict]:
    return [{"mel": torch.full((2, 3), float(i)), "indices": torch.tensor([i, i + 1]),
             "name": f"b{i}", "nested": {"x": torch.arange(3) + i}} for i in range(n)]


def test_cpu_is_identity_passthrough_in_order_nothing_lost():
    data = batches()
    pf = DevicePrefetcher(data, "cpu", num_batches=2)
    out = list(pf)
    assert len(out) == len(data) == len(pf)
    assert all(a is b for a, b in zip(out, data))
    assert list(pf) == out  # every iter() is a new pass


def test_len_follows_the_underlying_iterable():
    with pytest.raises(TypeError):
        len(DevicePrefetcher((b for b in batches()), "cpu"))
    assert len(list(DevicePrefetcher((b for b in batches(3)), "cpu"))) == 3


def test_other_devices_move_tensors_and_keep_other_values():
    out = list(DevicePrefetcher(batches(3), "meta"))
    assert [b["name"] for b in out] == ["b0", "b1", "b2"]
    assert out[1]["mel"].device.type == "meta" and out[1]["nested"]["x"].device.type == "meta"
    assert out[1]["mel"].shape == (2, 3)


def test_transform_runs_on_each_batch_once_it_is_on_the_device():
    from myxtts.data.batch import to_model_dtypes

    data = [{"mel": torch.full((2, 3), 0.5, dtype=torch.float16), "indices": torch.tensor([i])}
            for i in range(3)]
    for device in ("cpu", "meta"):
        out = list(DevicePrefetcher(data, device, transform=to_model_dtypes))
        assert [b["mel"].dtype for b in out] == [torch.float32] * 3
        assert [b["indices"].dtype for b in out] == [torch.int64] * 3
    on_cpu = list(DevicePrefetcher(data, "cpu", transform=to_model_dtypes))
    assert torch.equal(on_cpu[2]["mel"], torch.full((2, 3), 0.5))
    assert on_cpu[2]["indices"] is data[2]["indices"]  # nothing else is touched


def test_the_store_feed_pairs_each_batch_with_its_real_frames_in_model_dtypes():
    from myxtts.data.feed.prefetch import PrefetchFeed
    from myxtts.data.feed.protocol import DeviceFeed

    data = [{"mel": torch.full((2, 4, 3), 0.5, dtype=torch.float16),
             "mel_lengths": torch.tensor([4, i + 1])} for i in range(3)]
    for device in ("cpu", "meta"):
        feed = PrefetchFeed(data, device, num_batches=2)
        assert isinstance(feed, DeviceFeed) and feed.occupancy() is None
        for _ in range(2):  # every iter() is a new pass
            out = list(feed)
            assert [n for _, n in out] == [5, 6, 7]  # counted on the host, before the copy
            assert [b["mel"].dtype for b, _ in out] == [torch.float32] * 3
            assert {b["mel"].device.type for b, _ in out} == {device}
        feed.close()


def test_rejects_zero_batches():
    with pytest.raises(ValueError, match="prefetch_batches"):
        DevicePrefetcher([], "cpu", num_batches=0)


@pytest.mark.gpu
@pytest.mark.parametrize("num_batches", [1, 2, 8])
def test_cuda_copies_values_to_device_in_order(num_batches):
    data = batches(6)
    pf = DevicePrefetcher(data, "cuda", num_batches=num_batches)
    out = []
    for b in pf:
        # Use each batch on the compute stream right away, like a training step would.
        out.append({"sum": (b["mel"] * 2).sum(), **b})
    assert len(out) == len(data) == len(pf)
    for src, got in zip(data, out):
        assert got["mel"].is_cuda and got["indices"].is_cuda and got["nested"]["x"].is_cuda
        assert got["name"] == src["name"]
        assert torch.equal(got["mel"].cpu(), src["mel"])
        assert torch.equal(got["indices"].cpu(), src["indices"])
        assert torch.equal(got["nested"]["x"].cpu(), src["nested"]["x"])
        assert got["sum"].item() == pytest.approx(2 * src["mel"].sum().item())
    assert not data[0]["mel"].is_cuda  # inputs untouched


@pytest.mark.gpu
def test_cuda_float16_batches_are_cast_on_the_device_exactly():
    from myxtts.data.batch import to_model_dtypes

    data = [{"mel": (torch.randn(4, 100, 80) * 3).half().pin_memory(),
             "mel_lengths": torch.tensor([100, 90, 80, 70])} for _ in range(4)]
    out = list(DevicePrefetcher(data, "cuda", num_batches=2, transform=to_model_dtypes))
    for src, got in zip(data, out):
        assert got["mel"].is_cuda and got["mel"].dtype == torch.float32
        assert torch.equal(got["mel"].cpu(), src["mel"].float())
        assert got["mel_lengths"].dtype == torch.int64


@pytest.mark.gpu
def test_cuda_pinned_input_and_large_batches_survive_allocator_reuse():
    # Many big batches through a 2-deep pipeline: with missing record_stream / waits, the
    # values read on the compute stream would come from reused or unfinished buffers.
    data = [{"mel": torch.full((64, 1024, 80), float(i)).pin_memory()} for i in range(12)]
    sums = []
    for b in DevicePrefetcher(data, torch.device("cuda", 0), num_batches=2):
        sums.append((b["mel"] @ torch.ones(80, 1, device="cuda")).mean())
        del b
    assert [s.item() for s in sums] == [80.0 * i for i in range(12)]
