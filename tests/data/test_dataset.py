"""StoreBatches: exact batches (the data.batch contract, bucket shapes, values, the hashed
reference crop), float16 store frames, the batches for a GPU, errors, pickling."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from myxtts.data.batch import BatchShape, check_batch, to_model_dtypes
from myxtts.data.feed.buckets import BucketPlan, plan_buckets
from myxtts.data.feed.dataset import StoreBatches, mix64
from myxtts.data.feed.sampler import BucketBatchSampler

from .tiny_store import mel, tiny_store, tokens

N_MELS, REF = 4, 6
PLAN = BucketPlan(boundaries=(16, 40), text_caps=(8, 24), batch_sizes=(4, 2), num_buckets=2)
# utterance -> (mel frames, tokens)
UTTS = [(30, 20), (17, 5), (1, 1), (12, 4), (9, 3), (16, 8), (3, 2), (41, 9), (10, 9)]


def crop(store, i: int, epoch: int = 0, seed: int = 0) -> np.ndarray:
    """Utterance i's reference crop (it is its own reference): a window of at most REF
    frames, starting where the (seed, epoch, index) hash says."""
    m = mel(store, i)
    start = (mix64(seed, epoch, i) >> 32) % (len(m) - REF + 1) if len(m) > REF else 0
    return m[start:start + REF]


def test_batch_dict_keys_dtypes_shapes_and_values():
    store = tiny_store(UTTS, N_MELS)
    out = StoreBatches(store, PLAN, REF).batch(0, [0, 1, 2])
    B, T, L = 3, 40, 24  # longest mel 30 -> bucket edge 40, its text cap 24
    assert check_batch(out) == BatchShape(B, L, T, REF, N_MELS)  # every field, dtype, shape
    assert out["mel_lengths"].tolist() == [30, 17, 1]
    assert out["token_lengths"].tolist() == [20, 5, 1]
    assert out["ref_lengths"].tolist() == [6, 6, 1]  # references cropped to REF frames
    assert out["speaker_ids"].tolist() == [0, 1, 2]
    assert out["language_ids"].tolist() == [0, 1, 0]
    assert out["indices"].tolist() == [0, 1, 2]
    for i in range(B):
        n, t, r = UTTS[i][0], UTTS[i][1], int(out["ref_lengths"][i])
        np.testing.assert_array_equal(out["tokens"][i, :t].numpy(), tokens(store, i))
        assert (out["tokens"][i, t:] == 0).all()  # PAD
        np.testing.assert_array_equal(out["mel"][i, :n].numpy(), mel(store, i).astype(np.float32))
        assert (out["mel"][i, n:] == 0).all()
        np.testing.assert_array_equal(out["ref_mel"][i, :r].numpy(), crop(store, i).astype(np.float32))
        assert (out["ref_mel"][i, r:] == 0).all()
        expected_stop = (torch.arange(T) >= n - 1).float()
        assert torch.equal(out["stop_target"][i], expected_stop)
    # Masks derived from lengths select exactly the real frames.
    mask = torch.arange(T)[None] < out["mel_lengths"][:, None]
    assert mask.sum().item() == 48
    # Crops follow (seed, epoch, index): another epoch or seed crops elsewhere.
    again = StoreBatches(store, PLAN, REF).batch(0, [0, 1, 2])
    assert torch.equal(again["ref_mel"], out["ref_mel"])
    later = StoreBatches(store, PLAN, REF, seed=5).batch(3, [0, 1])
    for i in (0, 1):
        np.testing.assert_array_equal(later["ref_mel"][i].numpy(),
                                      crop(store, i, 3, 5).astype(np.float32))


def test_small_batch_pads_to_first_bucket():
    out = StoreBatches(tiny_store(UTTS, N_MELS), PLAN, REF).batch(0, [5, 6])
    assert out["mel"].shape == (2, 16, N_MELS) and out["tokens"].shape == (2, 8)


def test_float16_store_frames_are_cast_exactly_into_a_cpu_batch():
    store = tiny_store(UTTS, N_MELS)
    out = StoreBatches(store, PLAN, REF).batch(0, [3, 4])
    assert out["mel"].dtype == torch.float32 and out["ref_mel"].dtype == torch.float32
    np.testing.assert_array_equal(out["mel"][0, :12].numpy(), mel(store, 3).astype(np.float32))
    np.testing.assert_array_equal(out["ref_mel"][1].numpy(), crop(store, 4).astype(np.float32))


def test_batches_for_a_gpu_carry_float16_mels_that_cast_back_exactly():
    """transfer=True (training on CUDA): mels stay float16 on the host and over PCIe; the
    cast on the device gives exactly the float32 batch (the store's mels are float16)."""
    store = tiny_store(UTTS, N_MELS)
    wire = StoreBatches(store, PLAN, REF, transfer=True).batch(0, [3, 0])
    assert wire["mel"].dtype == wire["ref_mel"].dtype == torch.float16
    assert check_batch(wire, transfer=True) == check_batch(to_model_dtypes(wire))
    np.testing.assert_array_equal(wire["mel"][1, :30].numpy().view(np.uint16),
                                  mel(store, 0).view(np.uint16))  # the store's bytes
    plain = StoreBatches(store, PLAN, REF).batch(0, [3, 0])
    cast = to_model_dtypes(wire)
    assert cast.keys() == plain.keys()
    for k in plain:
        assert cast[k].dtype == plain[k].dtype and torch.equal(cast[k], plain[k]), k
    shape = check_batch(plain)
    assert shape.nbytes(transfer=True) < shape.nbytes()  # what the slots and PCIe carry


def test_float16_memmap_input(tmp_path):
    utts = [(13, 3), (4, 2)]
    arr = np.lib.format.open_memmap(tmp_path / "m.npy", mode="w+", dtype=np.float16, shape=(17, N_MELS))
    arr[:] = np.arange(17 * N_MELS).reshape(17, N_MELS) / 8
    arr.flush()
    mm = np.load(tmp_path / "m.npy", mmap_mode="r", allow_pickle=False)
    out = StoreBatches(tiny_store(utts, N_MELS, mm), PLAN, REF).batch(0, [0])
    np.testing.assert_array_equal(out["mel"][0, :13].numpy(), np.asarray(mm[:13], np.float32))
    assert out["mel"].shape == (1, 16, N_MELS)


def test_without_a_plan_pads_to_rounded_batch_max():
    store = tiny_store([(17, 9), (3, 2)], N_MELS)
    out = StoreBatches(store, None, REF, pad_multiple=8).batch(0, [0, 1])
    assert out["mel"].shape == (2, 24, N_MELS) and out["tokens"].shape == (2, 16)


def test_errors_name_the_cause():
    batches = StoreBatches(tiny_store(UTTS, N_MELS), PLAN, REF)
    with pytest.raises(ValueError, match="text tokens but its bucket caps text at 8"):
        batches.batch(0, [8])  # 10 frames (first bucket), 9 tokens
    with pytest.raises(ValueError, match="longest bucket is 40 frames"):
        batches.batch(0, [7])
    with pytest.raises(ValueError, match="empty"):
        batches.batch(0, [])
    with pytest.raises(IndexError, match="out of range"):
        batches.batch(0, [len(UTTS)])
    with pytest.raises(ValueError, match="data.ref_frames"):
        StoreBatches(tiny_store(UTTS, N_MELS), PLAN, 0)


def test_store_batches_pickle_for_worker_processes():
    batches = StoreBatches(tiny_store(UTTS, N_MELS), PLAN, REF)
    want = batches.batch(0, [5])
    copy = pickle.loads(pickle.dumps(batches))
    got = copy.batch(0, [5])
    assert got["mel"].shape == (1, 16, N_MELS)
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_every_batch_of_the_sampler_has_its_bucket_shape():
    rng = np.random.default_rng(0)
    frames = rng.integers(20, 300, 200)
    text = rng.integers(3, 60, 200)
    store = tiny_store(list(zip(frames.tolist(), text.tolist())), N_MELS)
    plan = plan_buckets(frames, text, batch_frames=1200, max_batch_size=16, num_buckets=4)
    sampler = BucketBatchSampler(frames, text, plan)
    batches = StoreBatches(store, plan, REF)
    shapes = set()
    seen = set()
    for epoch, indices in sampler:
        batch = batches.batch(epoch, indices)
        shapes.add((batch["tokens"].shape[0], batch["tokens"].shape[1], batch["mel"].shape[1]))
        seen.update(batch["indices"].tolist())
        np.testing.assert_array_equal(batch["mel_lengths"].numpy(), frames[batch["indices"].numpy()])
    assert shapes <= set(sampler.shapes()) and len(shapes) == len(sampler.shapes())
    assert seen == set(range(200))
