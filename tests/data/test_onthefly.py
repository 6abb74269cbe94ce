"""On-the-fly loading from raw audio gives the store's features, tokens and reference crops."""

import numpy as np
import pytest
import torch

from myxtts.audio.frames import crop_window, n_frames_for
from myxtts.audio.mel import MelSpectrogram
from myxtts.config import AudioConfig, ConfigError, load_config
from myxtts.data.batch import check_batch
from myxtts.data.feed.dataset import StoreBatches
from myxtts.data.feed.onthefly import build_onthefly_loader, read_raw_splits
from myxtts.data.prepare.build import prepare_store
from myxtts.data.store import FeatureStore
from myxtts.synthetic import make_demo_data


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    root = tmp_path_factory.mktemp("otf")
    data = make_demo_data(root / "demo", speakers=2, utterances=10, seed=4)
    cfg = load_config(overrides=["data.batch_frames=3000", "data.ref_frames=48"])
    prepare_store(data, root / "store", cfg, workers=1, progress=False, echo=lambda s: None)
    return data, root / "store", cfg


@pytest.mark.parametrize("workers", [0, 1])
def test_onthefly_batches_equal_store_features(demo, workers):
    data, path, cfg = demo
    store = FeatureStore.open(path, "train", cfg)
    items = StoreBatches(store, None, cfg.data.ref_frames, cfg.data.shuffle_seed)
    loader, sampler = build_onthefly_loader(data, cfg, mel_stats=store, num_workers=workers)
    assert loader.tokenizer == store.tokenizer and loader.speakers == store.speakers
    np.testing.assert_array_equal(loader.mel_mean, store.mel_mean)
    seen = set()
    for batch in loader:
        shape = check_batch(batch)  # the same contract as the store path's StoreBatches
        b, t = shape.batch, shape.frames
        assert (shape.ref_frames, shape.n_mels) == (48, 80)
        assert (b, shape.text, t) in sampler.shapes()
        for j in range(b):
            i = int(batch["indices"][j])
            seen.add(i)
            n = int(batch["mel_lengths"][j])
            stored = store.mel(i).astype(np.float32)
            assert n == len(stored) and not batch["mel"][j, n:].any()
            # The store keeps float16: equal up to its rounding (2^-11 relative).
            np.testing.assert_allclose(batch["mel"][j, :n].numpy(), stored, rtol=2**-10, atol=1e-3)
            assert batch["stop_target"][j, n - 1:].eq(1).all() and not batch["stop_target"][j, :n - 1].any()
            k = int(batch["token_lengths"][j])
            assert batch["tokens"][j, :k].tolist() == store.tokens(i).tolist()
            # Same references, same hash -> the same crop as the store path (epoch 0).
            stored_ref = items.batch(0, [i])
            r = int(batch["ref_lengths"][j])
            ref = stored_ref["ref_mel"][0, :int(stored_ref["ref_lengths"][0])].numpy()
            assert r == len(ref) and not batch["ref_mel"][j, r:].any()
            np.testing.assert_allclose(batch["ref_mel"][j, :r].numpy(), ref, rtol=2**-10, atol=1e-3)
    assert seen == set(range(len(store)))


def test_reference_crops_read_alone_equal_those_cut_from_the_loaded_clip(demo):
    """Once a clip has been loaded its span is known, and a reference crop of it is read
    from the file alone: the same samples, bit for bit, as cutting the whole loaded clip.
    What loading found out belongs to the split (every dataset over it shares it): a copy of
    the split knows nothing yet."""
    import dataclasses

    from myxtts.data.feed.raw import RawAudioDataset

    data, _, cfg = demo
    raw = read_raw_splits(data, cfg)[0]["train"]
    warm = RawAudioDataset(raw, cfg.audio, cfg.data.ref_frames, 7)
    cold = RawAudioDataset(dataclasses.replace(raw), cfg.audio, cfg.data.ref_frames, 7)
    n = len(raw.paths)
    warm.__getitems__((0, list(range(n))))  # every clip loaded once: every span known
    assert (warm.spans.numpy() >= 0).all() and (cold.spans.numpy() < 0).all()
    assert RawAudioDataset(raw, cfg.audio, cfg.data.ref_frames, 3).spans is warm.spans
    for epoch in (1, 2):
        for i in range(n):
            fresh = RawAudioDataset(dataclasses.replace(raw), cfg.audio, cfg.data.ref_frames, 7)
            a, b = warm.item(i, epoch), fresh.item(i, epoch)
            np.testing.assert_array_equal(a["ref_wav"], b["ref_wav"])
            assert (a["ref_first"], a["ref_frames"]) == (b["ref_first"], b["ref_frames"])


def test_crop_window_reproduces_the_full_clips_frames():
    cfg = AudioConfig()
    mel = MelSpectrogram(cfg)
    rng = np.random.default_rng(0)
    wav = rng.standard_normal(40 * cfg.hop_length + 77).astype(np.float32)
    with torch.no_grad():
        full, n = mel(torch.from_numpy(wav))
        assert int(n) == n_frames_for(len(wav), cfg)
        for start, count in [(0, 8), (1, 8), (17, 10), (33, 8), (n_frames_for(len(wav), cfg) - 1, 1)]:
            a, b, first = crop_window(len(wav), start, count, cfg)
            crop, _ = mel(torch.from_numpy(wav[a:b]))
            torch.testing.assert_close(crop[first:first + count], full[start:start + count],
                                       rtol=1e-5, atol=1e-5)
            assert b - a < len(wav) or start == 0


def test_mel_stats_pass_matches_the_store(demo):
    data, path, cfg = demo
    store = FeatureStore.open(path)
    raw = read_raw_splits(data, cfg)
    loader, _ = build_onthefly_loader(data, cfg, num_workers=0, raw_splits=raw, shuffle=False)
    np.testing.assert_allclose(loader.mel_mean, store.mel_mean, atol=2e-3)
    np.testing.assert_allclose(loader.mel_std, store.mel_std, atol=2e-3)
    val, _ = build_onthefly_loader(data, cfg, split="val", num_workers=0, raw_splits=raw)
    assert len(list(val)) == len(val)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without CUDA")
def test_cuda_data_device_without_cuda_is_a_config_error(demo):
    data, _, _ = demo
    cfg = load_config(overrides=["data.data_device=cuda:0"])
    with pytest.raises(ConfigError, match="data.data_device=cpu"):
        build_onthefly_loader(data, cfg)


def test_unusable_dataset_is_a_clear_error(demo):
    from myxtts.data.store import StoreError

    data, _, _ = demo
    cfg = load_config(overrides=["data.min_duration_s=15", "data.max_duration_s=20"])
    with pytest.raises(StoreError, match="no training utterance is usable"):
        build_onthefly_loader(data, cfg)


def test_the_raw_wav_batch_follows_its_table_and_counts_its_frames_on_the_host(demo):
    from myxtts.data.batch import RAW_FIELDS, check_fields
    from myxtts.data.feed.protocol import DeviceFeed, TrainLoader

    data, path, cfg = demo
    loader, sampler = build_onthefly_loader(data, cfg, mel_stats=FeatureStore.open(path),
                                            num_workers=0)
    assert isinstance(loader, TrainLoader)
    collate, dataset = loader.wav_collator, loader.loader.dataset
    for epoch, indices in list(sampler)[:3]:  # the sampler's (epoch, indices), as a worker gets it
        raw = collate.pad(dataset.__getitems__((epoch, indices)))
        sizes = check_fields(raw, RAW_FIELDS)  # the same check as every batch
        assert sizes["B"] == len(indices) and int(raw["n_frames"]) in {s[2] for s in sampler.shapes()}
        batch = loader.featurizer(raw, torch.device("cpu"))
        check_batch(batch)
        assert loader.featurizer.real_frames(raw) == int(batch["mel_lengths"].sum())
    check_fields(loader.largest_raw_batch(), RAW_FIELDS)
    work = loader.feature_work()  # the data role's heaviest batch: the largest bucket, full
    b, _, frames = max(sampler.shapes(), key=lambda s: s[0] * s[2])
    assert work.device == torch.device("cpu") and loader.num_workers == 0
    assert work.run()["mel"].shape[:2] == (b, frames)
    with pytest.raises(ValueError, match=r"RAW_FIELDS: missing \['n_frames'\], unexpected \['x'\]"):
        check_fields({**{k: v for k, v in raw.items() if k != "n_frames"}, "x": raw["n_frames"]},
                     RAW_FIELDS)
    with pytest.raises(ValueError, match="'wav' is torch.float64, expected torch.float32"):
        check_fields({**raw, "wav": raw["wav"].double()}, RAW_FIELDS)
    feed = loader.device_feed(torch.device("cpu"))
    assert isinstance(feed, DeviceFeed)
    feed.close()


@pytest.fixture(scope="module")
def one_silent_clip(tmp_path_factory):
    """A demo corpus whose 4th train clip is silent: its header reads (it is bucketed like
    any clip), its decode is refused -- the way a clip fails only once a worker loads it."""
    import soundfile as sf

    data = make_demo_data(tmp_path_factory.mktemp("silent") / "demo", speakers=2, utterances=8,
                          seed=5)
    cfg = load_config(overrides=["data.batch_frames=3000", "data.ref_frames=48"])
    splits = read_raw_splits(data, cfg)
    victim = splits[0]["train"].paths[3]
    info = sf.info(victim)
    sf.write(victim, np.zeros(info.frames, np.float32), info.samplerate)
    return data, cfg, read_raw_splits(data, cfg), 3


def test_a_clip_that_fails_to_load_keeps_its_batch_in_its_bucket_and_is_said_once(
        one_silent_clip, monkeypatch, caplog):
    import myxtts.data.feed.raw as raw_mod

    data, cfg, splits, victim = one_silent_clip
    stats = (np.zeros(80, np.float32), np.ones(80, np.float32))
    loader, sampler = build_onthefly_loader(data, cfg, mel_stats=stats, num_workers=0,
                                            raw_splits=splits)
    dataset, collate = loader.loader.dataset, loader.wav_collator
    reads = []
    real_load = raw_mod.load_audio_span  # what the loader reads a clip with
    monkeypatch.setattr(raw_mod, "load_audio_span",
                        lambda path, a: reads.append(path) or real_load(path, a))
    hit = 0
    with caplog.at_level("WARNING", logger="myxtts.data.feed.onthefly"):
        for epoch in range(3):
            for indices in sampler.batches(epoch):
                raw = collate.pad(dataset.__getitems__((epoch, indices)))
                # the bucket the sampler drew: as many utterances, the same padded frames
                assert raw["wav"].shape[0] == len(indices)
                edge = sampler.plan.shape_for(int(splits[0]["train"].est_frames[indices].max()))
                assert int(raw["n_frames"]) == edge[0]
                got = raw["indices"].tolist()
                assert victim not in got and set(got) == set(indices) - {victim}
                hit += victim in indices
    assert hit >= 3  # the clip was drawn in every epoch ...
    said = [r for r in caplog.records if "cannot be used" in r.getMessage()]
    assert len(said) == 1 and "silent" in said[0].getMessage()  # ... said once
    assert reads.count(splits[0]["train"].paths[victim]) == 1  # ... and read once
    assert int(dataset.failed.sum()) == 1


def test_loader_workers_share_which_clips_failed(one_silent_clip):
    data, cfg, splits, victim = one_silent_clip
    stats = (np.zeros(80, np.float32), np.ones(80, np.float32))
    loader, sampler = build_onthefly_loader(data, cfg, mel_stats=stats, num_workers=2,
                                            raw_splits=splits)
    sizes = [len(b) for b in sampler.batches(0)]
    assert [int(b["mel"].shape[0]) for b in loader] == sizes  # no batch lost an utterance
    n = len(splits[0]["train"].paths)
    # the workers marked it in memory the main process (and every worker) reads
    assert loader.loader.dataset.failed.tolist() == [int(i == victim) for i in range(n)]


@pytest.mark.slow
def test_workers_stream_keeps_the_samplers_passes(demo):
    """With workers the batches flow on across epochs; every pass is still the sampler's:
    whole epochs, an abandoned pass restarting where it was, set_epoch, state_dict."""
    data, path, cfg = demo
    stats = (np.zeros(80, np.float32), np.ones(80, np.float32))
    raw = read_raw_splits(data, cfg)
    ref, ref_sampler = build_onthefly_loader(data, cfg, mel_stats=stats, num_workers=0, raw_splits=raw)
    loader, sampler = build_onthefly_loader(data, cfg, mel_stats=stats, num_workers=2, raw_splits=raw)

    def epoch(e: int, lo, s) -> list[list[int]]:
        s.set_epoch(e)
        return [b["indices"].tolist() for b in lo]

    want = {e: epoch(e, ref, ref_sampler) for e in (0, 1, 2, 5)}
    got = [[b["indices"].tolist() for b in loader] for _ in range(2)]  # consecutive passes
    assert got == [want[0], want[1]] and sampler.epoch == 2
    it = iter(loader)
    first = next(it)["indices"].tolist()  # a pass abandoned after one batch ...
    assert sampler.state_dict(1)["position"] == 1
    del it
    assert [b["indices"].tolist() for b in loader] == want[2] and first == want[2][0]  # ... restarts
    assert epoch(5, loader, sampler) == want[5]
    ref_sampler.set_epoch(3)
    sampler.set_epoch(3)
    for x, y in zip(ref, loader, strict=True):  # the features too, not just the order
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
