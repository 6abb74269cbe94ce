"""Collator: exact batches (the data.batch contract, bucket shapes, values), float16 input, errors."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from myxtts.data.batch import BatchShape, check_batch, to_model_dtypes
from myxtts.data.feed.buckets import ShapeTable
from myxtts.data.feed.collate import Collator
from myxtts.data.feed.sampler import BucketBatchSampler

N_MELS, REF = 4, 6
TABLE = ShapeTable(boundaries=(16, 40), text_caps=(8, 24), batch_sizes=(4, 2))


def item(index: int, n_frames: int, n_tokens: int, n_ref: int, mel_dtype=np.float32) -> dict:
    rng = np.random.default_rng(index)
    return {
        "tokens": rng.integers(1, 50, n_tokens).astype(np.int32),
        "mel": rng.normal(size=(n_frames, N_MELS)).astype(mel_dtype),
        "ref_mel": rng.normal(size=(n_ref, N_MELS)).astype(mel_dtype),
        "speaker_id": index % 3,
        "language_id": index % 2,
        "index": index,
    }


def test_batch_dict_keys_dtypes_shapes_and_values():
    items = [item(0, 30, 20, 6), item(1, 17, 5, 3), item(2, 1, 1, 9)]
    out = Collator(TABLE, N_MELS, REF)(items)
    B, T, L = 3, 40, 24  # longest mel 30 -> bucket edge 40, its text cap 24
    assert check_batch(out) == BatchShape(B, L, T, REF, N_MELS)  # every field, dtype, shape
    assert out["mel_lengths"].tolist() == [30, 17, 1]
    assert out["token_lengths"].tolist() == [20, 5, 1]
    assert out["ref_lengths"].tolist() == [6, 3, 6]  # 9 reference frames cropped to 6
    assert out["speaker_ids"].tolist() == [0, 1, 2]
    assert out["language_ids"].tolist() == [0, 1, 0]
    assert out["indices"].tolist() == [0, 1, 2]
    for i, it in enumerate(items):
        n, t, r = len(it["mel"]), len(it["tokens"]), out["ref_lengths"][i]
        np.testing.assert_array_equal(out["tokens"][i, :t].numpy(), it["tokens"])
        assert (out["tokens"][i, t:] == 0).all()  # PAD
        np.testing.assert_array_equal(out["mel"][i, :n].numpy(), it["mel"])
        assert (out["mel"][i, n:] == 0).all()
        np.testing.assert_array_equal(out["ref_mel"][i, :r].numpy(), it["ref_mel"][:r])
        assert (out["ref_mel"][i, r:] == 0).all()
        expected_stop = (torch.arange(T) >= n - 1).float()
        assert torch.equal(out["stop_target"][i], expected_stop)
    # Masks derived from lengths select exactly the real frames.
    mask = torch.arange(T)[None] < out["mel_lengths"][:, None]
    assert mask.sum().item() == 48


def test_small_batch_pads_to_first_bucket():
    out = Collator(TABLE, N_MELS, REF)([item(0, 16, 8, 2), item(1, 3, 2, 2)])
    assert out["mel"].shape == (2, 16, N_MELS) and out["tokens"].shape == (2, 8)


def test_float16_mels_are_converted_exactly():
    items = [item(0, 12, 4, 5, np.float16), item(1, 9, 3, 6, np.float16)]
    out = Collator(TABLE, N_MELS, REF)(items)
    assert out["mel"].dtype == torch.float32 and out["ref_mel"].dtype == torch.float32
    np.testing.assert_array_equal(out["mel"][0, :12].numpy(), items[0]["mel"].astype(np.float32))
    np.testing.assert_array_equal(out["ref_mel"][1].numpy(), items[1]["ref_mel"].astype(np.float32))


def test_batches_for_a_gpu_carry_float16_mels_that_cast_back_exactly():
    """transfer=True (training on CUDA): mels stay float16 on the host and over PCIe; the
    cast on the device gives exactly the float32 batch (the store's mels are float16)."""
    items = [item(0, 12, 4, 5, np.float16), item(1, 30, 20, 6, np.float16)]
    wire = Collator(TABLE, N_MELS, REF, transfer=True)(items)
    assert wire["mel"].dtype == wire["ref_mel"].dtype == torch.float16
    assert check_batch(wire, transfer=True) == check_batch(to_model_dtypes(wire))
    plain = Collator(TABLE, N_MELS, REF)(items)
    cast = to_model_dtypes(wire)
    assert cast.keys() == plain.keys()
    for k in plain:
        assert cast[k].dtype == plain[k].dtype and torch.equal(cast[k], plain[k]), k
    shape = check_batch(plain)
    assert shape.nbytes(transfer=True) < shape.nbytes()  # what the slots and PCIe carry


def test_float16_memmap_input(tmp_path):
    arr = np.lib.format.open_memmap(tmp_path / "m.npy", mode="w+", dtype=np.float16, shape=(20, N_MELS))
    arr[:] = np.arange(20 * N_MELS).reshape(20, N_MELS) / 8
    arr.flush()
    mm = np.load(tmp_path / "m.npy", mmap_mode="r", allow_pickle=False)
    it = {**item(0, 1, 3, 2), "mel": mm[2:15], "ref_mel": mm[:4]}
    out = Collator(TABLE, N_MELS, REF)([it])
    np.testing.assert_array_equal(out["mel"][0, :13].numpy(), np.asarray(mm[2:15], np.float32))
    assert out["mel"].shape == (1, 16, N_MELS)


def test_without_shape_table_pads_to_rounded_batch_max():
    out = Collator(None, N_MELS, REF, pad_multiple=8)([item(0, 17, 9, 2), item(1, 3, 2, 2)])
    assert out["mel"].shape == (2, 24, N_MELS) and out["tokens"].shape == (2, 16)


def test_errors_name_the_cause():
    col = Collator(TABLE, N_MELS, REF)
    with pytest.raises(ValueError, match="text tokens but its bucket caps text at 8"):
        col([item(0, 10, 9, 2)])
    with pytest.raises(ValueError, match="longest bucket is 40 frames"):
        col([item(0, 41, 9, 2)])
    bad = item(0, 10, 3, 2)
    bad["mel"] = np.zeros((10, N_MELS + 1), np.float32)
    with pytest.raises(ValueError, match=r"audio.n_mels"):
        col([bad])
    with pytest.raises(ValueError, match="empty"):
        col([])


def test_collator_pickles_for_worker_processes():
    col = pickle.loads(pickle.dumps(Collator(TABLE, N_MELS, REF)))
    assert col([item(0, 5, 3, 2)])["mel"].shape == (1, 16, N_MELS)


class _LengthDataset(Dataset):
    def __init__(self, mel_lengths, text_lengths):
        self.mel_lengths, self.text_lengths = mel_lengths, text_lengths

    def __len__(self):
        return len(self.mel_lengths)

    def __getitem__(self, i):
        return item(int(i), int(self.mel_lengths[i]), int(self.text_lengths[i]), 4, np.float16)


def test_with_sampler_in_a_dataloader_every_batch_has_its_bucket_shape():
    rng = np.random.default_rng(0)
    mel = rng.integers(20, 300, 200)
    text = rng.integers(3, 60, 200)
    sampler = BucketBatchSampler(mel, text, batch_frames=1200, max_batch_size=16, num_buckets=4)
    loader = DataLoader(_LengthDataset(mel, text), batch_sampler=sampler,
                        collate_fn=Collator(sampler.shape_table(), N_MELS, REF))
    shapes = set()
    seen = set()
    for batch in loader:
        shapes.add((batch["tokens"].shape[0], batch["tokens"].shape[1], batch["mel"].shape[1]))
        seen.update(batch["indices"].tolist())
        np.testing.assert_array_equal(batch["mel_lengths"].numpy(), mel[batch["indices"].numpy()])
    assert shapes <= set(sampler.shapes()) and len(shapes) == len(sampler.shapes())
    assert seen == set(range(200))


def test_resume_through_a_multiworker_dataloader():
    # Workers pull index lists ahead of the loop; state_dict(consumed) must count what the
    # loop used. DataLoader also calls iter(batch_sampler) twice per pass (init + reset).
    rng = np.random.default_rng(1)
    mel, text = rng.integers(20, 300, 120), rng.integers(3, 60, 120)

    def loader_for(sampler):
        return DataLoader(_LengthDataset(mel, text), batch_sampler=sampler, num_workers=2,
                          collate_fn=Collator(sampler.shape_table(), N_MELS, REF))

    def make():
        return BucketBatchSampler(mel, text, batch_frames=1200, max_batch_size=8, num_buckets=3)

    ref_sampler = make()
    ref = [b["indices"].tolist() for _ in range(2) for b in loader_for(ref_sampler)]
    sampler = make()
    got = []
    for i, batch in enumerate(loader_for(sampler)):
        got.append(batch["indices"].tolist())
        if i == 6:
            break
    state = sampler.state_dict(consumed=7)
    assert state["position"] == 7 and sampler.state_dict()["position"] > 7  # workers ran ahead
    resumed = make()
    resumed.load_state_dict(state)
    loader = loader_for(resumed)
    got += [b["indices"].tolist() for _ in range(2) for b in loader]
    assert got == ref
