"""The batch contract: one table of fields drives every producer, check and buffer size."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from myxtts.data import batch as batch_mod
from myxtts.data.batch import (
    FIELDS,
    PAD_ID,
    BatchShape,
    FieldSpec,
    allocate,
    check_batch,
    crop,
    stop_targets,
)
from myxtts.data.feed.dataset import StoreBatches
from myxtts.model.dummy import random_batch

SHAPE = BatchShape(batch=3, text=16, frames=40, ref_frames=12, n_mels=8)


def test_allocate_follows_the_table_and_nbytes_counts_it():
    arrays = allocate(SHAPE)
    assert list(arrays) == list(FIELDS)
    for name, spec in FIELDS.items():
        assert arrays[name].shape == SHAPE.of(name) and arrays[name].dtype == spec.numpy_dtype
        assert not arrays[name].any()  # zeros are the padding of every field
    assert SHAPE.nbytes() == sum(a.nbytes for a in arrays.values())
    aligned = SHAPE.nbytes(align=64)
    assert aligned % 64 == 0 and SHAPE.nbytes() <= aligned < SHAPE.nbytes() + 64 * len(FIELDS)


def test_stop_targets_mark_the_last_real_frame_and_the_padding():
    got = stop_targets(torch.tensor([1, 3, 5]), 5)
    assert got.dtype == torch.float32
    assert got.tolist() == [[1, 1, 1, 1, 1], [0, 0, 1, 1, 1], [0, 0, 0, 0, 1]]
    host = stop_targets(np.array([1, 3, 5]), 5)  # the collator's (numpy) path: the same rule
    assert host.dtype == np.float32 and np.array_equal(host, got.numpy())


@pytest.mark.parametrize("producer", ["store", "random_batch"])
def test_every_producer_builds_the_contract(producer):
    if producer == "store":
        from .tiny_store import tiny_store

        store = tiny_store([(33, 5), (20, 9), (40, 16)], 8)
        out = StoreBatches(store, None, 12, pad_multiple=8).batch(0, [0, 1, 2])
    else:
        out = random_batch(8, 30, [5, 9, 16], [33, 20, 40], [12, 4, 12], n_frames=40)
    assert check_batch(out) == SHAPE
    real = torch.arange(SHAPE.frames)[None] < out["mel_lengths"][:, None]
    assert not out["mel"][~real].any() and torch.equal(
        out["stop_target"], stop_targets(out["mel_lengths"], SHAPE.frames))
    text_pad = torch.arange(SHAPE.text)[None] >= out["token_lengths"][:, None]
    assert (out["tokens"][text_pad] == PAD_ID).all()


def test_check_batch_names_what_is_wrong():
    good = random_batch(8, 30, [5, 9], [12, 20], [4, 6])
    with pytest.raises(ValueError, match=r"missing \['indices'\], unexpected \['extra'\]"):
        check_batch({**{k: v for k, v in good.items() if k != "indices"}, "extra": good["indices"]})
    with pytest.raises(ValueError, match="'mel_lengths' is torch.int32, expected torch.int64"):
        check_batch({**good, "mel_lengths": good["mel_lengths"].int()})
    with pytest.raises(ValueError, match="'stop_target': dimension T is 19"):
        check_batch({**good, "stop_target": good["stop_target"][:, :19]})
    with pytest.raises(ValueError, match=r"'ref_mel' has shape \(2, 6\), expected \[B, R, M\]"):
        check_batch({**good, "ref_mel": good["ref_mel"][..., 0]})


def test_crop_is_the_utterance_padded_alone():
    full = random_batch(8, 30, [5, 9], [12, 20], [4, 6], n_text=16, n_frames=24, n_ref=8, seed=2)
    one = crop(full, 1)
    assert check_batch(one) == BatchShape(1, 9, 20, 6, 8)
    assert torch.equal(one["mel"][0], full["mel"][1, :20])
    assert torch.equal(one["stop_target"], stop_targets(full["mel_lengths"][1:], 20))
    padded = crop(full, 0, {"T": 16})  # a bucket's size instead of its own length
    assert check_batch(padded).frames == 16 and not padded["mel"][0, 12:].any()


def test_a_new_field_is_one_edit_of_the_table(monkeypatch):
    """Sizing and allocation follow FIELDS: an added field needs no edit elsewhere."""
    extended = {**FIELDS, "energy": FieldSpec(torch.float16, ("B", "T"), "frame energy")}
    monkeypatch.setattr(batch_mod, "FIELDS", extended)
    arrays = batch_mod.allocate(SHAPE)
    assert arrays["energy"].shape == (3, 40) and arrays["energy"].dtype == np.float16
    assert SHAPE.nbytes() == sum(a.nbytes for a in arrays.values())
