"""Training from raw audio: the trainer's stream takes the on-the-fly batches through the
data role's slot ring (``data.feed.ring``) and gets exactly what the loader makes."""

from __future__ import annotations

import json

import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.data.feed.ring import SlotRing
from myxtts.train.data import open_train_data
from myxtts.train.distributed import DistInfo
from myxtts.train.tts import BatchStream, train
from tests.helpers import micro_config

CPU = torch.device("cpu")


def _copy(batch: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def test_the_stream_delivers_the_loaders_batches_in_order(micro_store, tmp_path):
    raw = micro_store.parent / "data"  # the demo dataset the micro store was prepared from
    cfg = micro_config(tmp_path, "train.grad_accum_steps=2")  # the ring holds 2 batches
    direct = open_train_data(cfg, raw, CPU, DistInfo(), None)
    n = len(direct.sampler)
    want = [_copy(b) for _ in range(2) for b in direct.loader]  # the single-device path
    assert len(want) == 2 * n

    data = open_train_data(cfg, raw, CPU, DistInfo(), None)
    record = ck.TrainingProgress()
    stream = BatchStream(cfg, data, CPU, record)
    it = iter(stream)
    got = []
    for _ in range(2 * n):
        batch, frames = next(it)
        assert frames == int(batch["mel_lengths"].sum())
        got.append(_copy(batch))
    assert isinstance(stream.feed, SlotRing) and stream.feed.n_slots == cfg.data.ring_slots + 1
    assert (record.epoch, record.batches_consumed) == (1, n)
    it.close()  # stops the producer thread
    assert not stream.feed._thread.is_alive()
    for a, b in zip(got, want):
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), k


def test_training_on_raw_audio_logs_slot_occupancy(micro_store, tmp_path):
    raw = micro_store.parent / "data"
    out = tmp_path / "run"
    assert train(micro_config(out, "train.max_steps=4"), raw, progress=False).step == 4
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    ready = [r["train/data_ready_slots"] for r in rows if "train/data_ready_slots" in r]
    slots = micro_config(out).data.ring_slots  # at most the slots not held (all at the start)
    assert len(ready) == 2 and all(0.0 <= v <= slots for v in ready)
