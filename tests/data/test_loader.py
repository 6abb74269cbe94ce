"""Store loader: batches follow the batch-dict contract, hold the store's features, use
few shapes, are deterministic across worker counts, and a too-small budget is a clear error."""

import numpy as np
import pytest
import torch

import myxtts.data.feed.loader as loader_mod
from myxtts.config import ConfigError, load_config
from myxtts.data.feed.dataset import StoreBatches
from myxtts.data.feed.loader import (
    Handover,
    build_loader,
    choose_workers,
    default_num_workers,
    measured_handover,
    pad_multiple,
    store_batch_cost,
)
from myxtts.data.store import FeatureStore

KEYS = {"tokens": torch.long, "token_lengths": torch.long, "mel": torch.float32,
        "mel_lengths": torch.long, "stop_target": torch.float32, "ref_mel": torch.float32,
        "ref_lengths": torch.long, "speaker_ids": torch.long, "language_ids": torch.long,
        "indices": torch.long}


def _cfg(**data):
    return load_config(overrides=[f"data.{k}={v}" for k, v in
                                  {"batch_frames": 2000, "ref_frames": 64, **data}.items()])


def test_batches_follow_the_contract_and_hold_store_features(store_path):
    cfg = _cfg()
    loader, sampler = build_loader(store_path, cfg, num_workers=0)
    store = FeatureStore.open(store_path)
    n_mels, ref_frames = cfg.audio.n_mels, cfg.data.ref_frames
    shapes = set()
    seen = set()
    for batch in loader:
        assert set(batch) == set(KEYS)
        for k, dtype in KEYS.items():
            assert batch[k].dtype == dtype, k
        b, t = batch["mel"].shape[:2]
        length = batch["tokens"].shape[1]
        shapes.add((b, length, t))
        assert t % pad_multiple(cfg) == 0 and batch["mel"].shape[2] == n_mels
        assert batch["ref_mel"].shape == (b, ref_frames, n_mels)
        assert batch["stop_target"].shape == (b, t) and b * t <= cfg.data.batch_frames
        for j in range(b):
            i = int(batch["indices"][j])
            seen.add(i)
            n = int(batch["mel_lengths"][j])
            assert n == store.mel_lengths[i]
            assert torch.equal(batch["mel"][j, :n], torch.from_numpy(store.mel(i).astype(np.float32)))
            assert not batch["mel"][j, n:].any()
            stop = batch["stop_target"][j]
            assert stop[: n - 1].sum() == 0 and stop[n - 1:].eq(1).all()
            k = int(batch["token_lengths"][j])
            assert batch["tokens"][j, :k].tolist() == store.tokens(i).tolist()
            assert not batch["tokens"][j, k:].any()
            assert int(batch["speaker_ids"][j]) == store.speaker_ids[i]
            r = int(batch["ref_lengths"][j])
            assert 1 <= r <= ref_frames and not batch["ref_mel"][j, r:].any()
            crop = batch["ref_mel"][j, :r].numpy()
            # The crop is a window of one of the utterance's same-speaker references.
            found = False
            for ref in store.refs(i):
                m = store.mel(ref).astype(np.float32)
                starts = [s for s in range(len(m) - r + 1) if np.array_equal(m[s], crop[0])]
                found = found or any(np.array_equal(m[s:s + r], crop) for s in starts)
            assert found
    assert seen == set(range(len(store)))  # one epoch covers every utterance
    assert shapes <= set(sampler.shapes()) and len(shapes) <= cfg.data.num_buckets
    assert sampler.epoch == 1  # the pass advanced the sampler


def test_workers_give_the_same_batches(store_path):
    # Four epochs through 2 workers, each batch dropped before the next: every shared slot
    # is handed out and given back several times, and each batch must still be the one
    # assembled for it. Then the same epochs kept whole (list): the workers' slots all stay
    # held, and the batches they send in memory of their own must be the same too.
    cfg = _cfg()
    loader, _ = build_loader(store_path, cfg, num_workers=0)
    expected = [[{k: v.clone() for k, v in b.items()} for b in loader] for _ in range(8)]
    loader, _ = build_loader(store_path, cfg, num_workers=2)
    assert loader.num_workers == 2
    for epoch in expected[:4]:
        n = 0
        for batch in loader:
            for k in KEYS:
                assert torch.equal(batch[k], epoch[n][k]), (n, k)
            n += 1
        assert n == len(epoch)
    assert 4 * len(expected[0]) > 2 * loader.slots.slots  # more batches per worker than slots
    kept = [list(loader) for _ in range(4)]
    assert [len(e) for e in kept] == [len(e) for e in expected[4:]]
    for got, want in zip(kept, expected[4:]):
        for a, b in zip(got, want):
            for k in KEYS:
                assert torch.equal(a[k], b[k]), k


def test_crops_are_deterministic_per_seed_and_epoch(store_path):
    store = FeatureStore.open(store_path)
    everyone = list(range(len(store)))
    batches = StoreBatches(store, None, ref_frames=16, seed=5)
    first = batches.batch(0, everyone)
    again = StoreBatches(store, None, ref_frames=16, seed=5).batch(0, everyone)
    later = batches.batch(1, everyone)
    assert torch.equal(first["ref_mel"], again["ref_mel"])
    assert any(not torch.equal(a, b) for a, b in zip(first["ref_mel"], later["ref_mel"]))
    assert first["indices"].tolist() == everyone and first["ref_mel"].shape[1] == 16
    assert 1 <= int(first["ref_lengths"].min()) and int(first["ref_lengths"].max()) <= 16


def test_batch_budget_too_small_is_a_config_error(store_path):
    with pytest.raises(ConfigError, match=r"data\.batch_frames=100 .*raise data\.batch_frames"):
        build_loader(store_path, _cfg(batch_frames=100), num_workers=0)


def test_store_with_other_features_is_refused(store_path):
    from myxtts.data.store import StoreError

    with pytest.raises(StoreError, match="audio.n_mels"):
        build_loader(store_path, load_config(overrides=["audio.n_mels=40"]))


def test_val_split_and_distributed_ranks(store_path):
    cfg = _cfg()
    val, _ = build_loader(store_path, cfg, split="val", shuffle=False, num_workers=0)
    assert sum(int(b["mel"].shape[0]) for b in val) >= len(FeatureStore.open(store_path, "val"))
    idx = []
    for rank in (0, 1):
        loader, sampler = build_loader(store_path, cfg, rank=rank, world_size=2, num_workers=0)
        batches = list(loader)
        assert len(batches) == len(sampler)
        idx += [i for b in batches for i in b["indices"].tolist()]
    assert set(idx) == set(range(len(FeatureStore.open(store_path))))


def test_default_worker_count_follows_the_measurements():
    assert default_num_workers(1) == 0 and default_num_workers(2) == 0
    assert default_num_workers(3) == 1 and default_num_workers(64) == 2


def test_store_workers_only_where_they_save_the_training_process_time():
    mb = 1_000_000
    cost = Handover(fixed_s=0.2e-3, per_byte_s=0.195e-9)  # a machine's, given for exact notes
    # no core to spare beside the training process: never
    assert choose_workers(2, 50e-3, 5 * mb, cost)[0] == 0
    # a GPU run: a 5 MB batch building in 2 ms, copied into pinned memory as it is taken
    # from a worker (~1.18 ms): a worker saves < 1 ms
    n, why = choose_workers(16, 2e-3, 5 * mb, cost)
    assert n == 0 and "2.00 ms" in why and "would save 0.82 ms" in why
    # a CPU run uses the worker's slot as it is (0.2 ms): the same batch is worth a worker
    n, why = choose_workers(16, 2e-3, 0, cost)
    assert n == 2 and "0.20 ms" in why and " saves 1.80 ms" in why
    # a slow disk or a costly batch: workers take most of it off the training process
    assert choose_workers(16, 20e-3, 5 * mb, cost)[0] == 2
    assert choose_workers(3, 20e-3, 5 * mb, cost)[0] == 1
    # a machine whose messages cost 2 ms: the same 2 ms batch never pays for a worker
    assert choose_workers(16, 2e-3, 0, Handover(2e-3, 0.0))[0] == 0


def test_the_handover_is_measured_on_this_machine_once():
    """The cost a worker's batch has for the training process is measured where the run
    runs (a pipe message, a copy), once per process, not taken from another machine."""
    measured = measured_handover()
    assert measured is measured_handover()  # once per process
    assert 0 < measured.fixed_s < 0.1 and 0 < measured.per_byte_s < 1e-6  # a message, a copy
    assert measured.seconds(10_000_000) > measured.seconds(0) == measured.fixed_s


def test_auto_workers_are_chosen_and_said_and_a_users_count_is_honoured(store_path, monkeypatch,
                                                                         caplog):
    monkeypatch.setattr(loader_mod, "available_cpus", lambda: 16)
    monkeypatch.setattr(loader_mod, "batch_cost", lambda *a, **k: (1e-3, 2_000_000))
    with caplog.at_level("INFO", logger="myxtts.data.feed.loader"):
        auto, _ = build_loader(store_path, _cfg(num_workers=-1))
    assert auto.num_workers == 0 and auto.worker_note is None
    assert "store loader: 0 workers" in caplog.text and "1.00 ms" in caplog.text
    mine, _ = build_loader(store_path, _cfg(num_workers=2))
    assert mine.num_workers == 2  # honoured, and the reason it is slower is kept for profile
    assert "save the training process too little" in mine.worker_note
    monkeypatch.setattr(loader_mod, "batch_cost", lambda *a, **k: (30e-3, 2_000_000))
    assert build_loader(store_path, _cfg(num_workers=-1))[0].num_workers == 2
    assert build_loader(store_path, _cfg(num_workers=2))[0].worker_note is None


def test_batch_cost_builds_the_largest_batch_of_the_first_epoch(store_path):
    seconds, nbytes = store_batch_cost(FeatureStore.open(store_path), _cfg())
    assert 0 < seconds < 5 and nbytes > 0


def test_batches_for_a_gpu_carry_the_stores_float16_bytes_without_a_host_cast(store_path):
    """On the GPU path the mels go from the memmap into the batch as float16, one copy and no
    cast: the batch holds the store's bytes; the CPU path's batches are the same utterances
    widened to float32."""
    store = FeatureStore.open(store_path)
    cfg = _cfg()
    for workers in (0, 2):
        wire, _ = build_loader(store_path, cfg, num_workers=workers, device="cuda")
        host, _ = build_loader(store_path, cfg, num_workers=workers)
        for a, b in zip(wire, host):
            assert a["mel"].dtype == a["ref_mel"].dtype == torch.float16
            assert b["mel"].dtype == b["ref_mel"].dtype == torch.float32
            for j, i in enumerate(a["indices"].tolist()):
                n = int(a["mel_lengths"][j])
                assert np.array_equal(a["mel"][j, :n].numpy().view(np.uint16),
                                      store.mel(i).view(np.uint16))  # the store's bytes
            for k in KEYS:
                assert torch.equal(a[k].to(b[k].dtype), b[k]), k


def test_the_store_loaders_feed_yields_its_batches_with_their_real_frames(store_path):
    from myxtts.data.feed.protocol import DeviceFeed, TrainLoader

    loader, sampler = build_loader(store_path, _cfg(prefetch_batches=3), num_workers=0)
    assert isinstance(loader, TrainLoader) and loader.feature_work() is None  # features made
    sampler.set_epoch(0)
    want = list(loader)
    sampler.set_epoch(0)  # the same epoch again (a pass advances the sampler)
    feed = loader.device_feed(torch.device("cpu"), hold=2)
    assert isinstance(feed, DeviceFeed) and feed.ahead == 3
    got = list(feed)
    feed.close()
    assert len(got) == len(want) and feed.occupancy() is None  # nothing copied ahead on a CPU
    for (batch, frames), ref in zip(got, want):
        assert frames == int(ref["mel_lengths"].sum())
        assert batch.keys() == ref.keys() and all(torch.equal(batch[k], ref[k]) for k in ref)
