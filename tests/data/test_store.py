"""Feature store: round trip against compute_mel, zero-copy access, verification and the
errors a user meets (other features, interrupted prepare, old format, damaged files)."""

import json
import pickle
import shutil

import numpy as np
import pytest

from myxtts.audio import compute_mel, load_audio
from myxtts.config import Config, load_config
from myxtts.data.prepare.build import prepare_store
from myxtts.data.prepare.plan import choose_refs
from myxtts.data.prepare.readers import read_dataset
from myxtts.data.store import FeatureStore, StoreError, verify_store
from myxtts.synthetic import make_demo_data
from myxtts.text import clean_text
from tests.data.store_damage import flip_a_byte_is_found, poison_mel, truncation_is_named


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    data = make_demo_data(root / "demo", speakers=3, utterances=8, seed=1)
    cfg = Config()
    prepare_store(data, root / "store", cfg, workers=1, progress=False, echo=lambda s: None)
    return data, root / "store", cfg


@pytest.fixture()
def store_copy(demo, tmp_path):
    _, store, _ = demo
    dst = tmp_path / "copy"
    shutil.copytree(store, dst)
    return dst


def test_round_trip_equals_compute_mel_and_tokenizer(demo):
    data, path, cfg = demo
    store = FeatureStore.open(path, "train", cfg)
    utts = {u.id: u for u in read_dataset(data, cfg).all}
    assert len(store) > 0 and len(store.ids) == len(store)
    for i in (0, len(store) // 2, len(store) - 1):
        u = utts[store.ids[i]]
        expected = compute_mel(load_audio(u.audio_path, cfg.audio), cfg.audio)  # float32 [T, n_mels]
        mel = store.mel(i)
        assert mel.dtype == np.float16 and mel.shape == expected.shape
        # float16 keeps 11 significant bits: relative error <= 2^-11.
        np.testing.assert_allclose(mel.astype(np.float32), expected, rtol=2**-10, atol=1e-3)
        text = clean_text(u.text, u.language, cfg.text)
        assert store.tokens(i).tolist() == store.tokenizer.encode(text, u.language)
        assert store.speakers[store.speaker_ids[i]] == u.speaker
        assert store.languages[store.language_ids[i]] == u.language
        assert store.mel_lengths[i] == mel.shape[0] and store.token_lengths[i] == len(store.tokens(i))


def test_access_is_a_view_of_one_memmap(demo):
    _, path, _ = demo
    store = FeatureStore.open(path)
    a, b = store.mel(1), store.mel(2)
    assert isinstance(store.mel_array, np.memmap)
    assert np.shares_memory(a, store.mel_array) and np.shares_memory(b, store.mel_array)
    assert np.shares_memory(store.tokens(3), store.token_array)
    assert not a.flags.writeable  # read-only mapping: a stray write cannot damage the store
    # Consecutive utterances are back to back in the file.
    assert store.mel_offsets[2] == store.mel_offsets[1] + store.mel_lengths[1]


def test_pickle_carries_the_path_not_the_arrays(demo):
    _, path, _ = demo
    store = FeatureStore.open(path, "val")
    _ = store.mel(0)  # map the file before pickling
    blob = pickle.dumps(store)
    assert len(blob) < 500
    again = pickle.loads(blob)
    assert again.split == "val" and np.array_equal(again.mel(0), store.mel(0))


def test_mel_stats_are_train_frame_statistics(demo):
    _, path, _ = demo
    store = FeatureStore.open(path)
    frames = store.mel_array.astype(np.float64)
    np.testing.assert_allclose(store.mel_mean, frames.mean(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(store.mel_std, np.maximum(frames.std(0), 1e-2), rtol=1e-4, atol=1e-4)


def test_refs_same_speaker_and_verify_clean(demo):
    _, path, _ = demo
    assert verify_store(path) == []
    for split in ("train", "val"):
        store = FeatureStore.open(path, split)
        counts = np.bincount(store.speaker_ids)
        for i in range(len(store)):
            refs = store.refs(i)
            assert len(refs) >= 1 and len(set(refs.tolist())) == len(refs)
            assert (store.speaker_ids[refs] == store.speaker_ids[i]).all()
            if counts[store.speaker_ids[i]] > 1:
                assert i not in refs.tolist()


def test_choose_refs_rules_and_determinism():
    speakers = np.array([0, 0, 0, 1, 2, 2, 0])
    refs = choose_refs(speakers, 4, [7, 0])
    assert refs.shape == (7, 4) and refs.dtype == np.int32
    assert refs[3].tolist() == [3, -1, -1, -1]  # single clip: itself
    assert sorted(refs[4][refs[4] >= 0].tolist()) == [5]
    assert sorted(refs[0][refs[0] >= 0].tolist()) == [1, 2, 6]  # all 3 others, never itself
    assert np.array_equal(refs, choose_refs(speakers, 4, [7, 0]))
    many = choose_refs(np.zeros(50, np.int64), 3, [1, 0])
    assert (many >= 0).all() and all(i not in row for i, row in enumerate(many.tolist()))


def test_other_features_are_refused_naming_keys_and_fix(demo):
    _, path, _ = demo
    other = load_config(overrides=["audio.hop_length=200", "text.lowercase=false"])
    with pytest.raises(StoreError) as e:
        FeatureStore.open(path, "train", other)
    msg = str(e.value)
    assert "audio.hop_length" in msg and "text.lowercase" in msg
    assert "--force" not in msg and "myxtts prepare DATA --out NEW_STORE" in msg  # nothing destroyed
    assert "audio.n_fft" not in msg


def test_interrupted_store_is_refused(store_copy):
    (store_copy / ".partial").write_text("x")
    with pytest.raises(StoreError, match="incomplete store.*re-run the same"):
        FeatureStore.open(store_copy)
    (store_copy / ".partial").unlink()
    (store_copy / "manifest.json").unlink()
    (store_copy / ".work").mkdir()
    with pytest.raises(StoreError, match="incomplete store"):
        FeatureStore.open(store_copy)
    assert "incomplete store" in verify_store(store_copy)[0]


def test_other_format_version_is_refused(store_copy):
    manifest = json.loads((store_copy / "manifest.json").read_text())
    manifest["format_version"] = 0
    (store_copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(StoreError, match=r"format version 0 .*reads version 1.*--force"):
        FeatureStore.open(store_copy)


def test_missing_store_names_the_command(tmp_path):
    with pytest.raises(StoreError, match="myxtts prepare DATA --out"):
        FeatureStore.open(tmp_path / "nothing")


def test_verify_detects_a_flipped_byte(store_copy):
    flip_a_byte_is_found(store_copy, "train/mel.f16", 0x40)
    assert verify_store(store_copy, check_hashes=False) == []  # sizes and index still agree


def test_truncated_file_is_named(store_copy):
    truncation_is_named(store_copy, "train/tokens.i32", 8)


def test_verify_detects_inconsistent_index(store_copy):
    # Rewrite refs.npy so one utterance references another speaker, and fix up the
    # manifest checksums: only the index check can catch this.
    import hashlib

    from myxtts.data.store.writer import npy_bytes

    store = FeatureStore.open(store_copy)
    refs = store.ref_table.copy()
    other = int(np.flatnonzero(store.speaker_ids != store.speaker_ids[0])[0])
    refs[0, 0] = other
    blob = npy_bytes(refs)
    (store_copy / "train" / "refs.npy").write_bytes(blob)
    manifest = json.loads((store_copy / "manifest.json").read_text())
    manifest["files"]["train/refs.npy"] = {"size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
    (store_copy / "manifest.json").write_text(json.dumps(manifest))
    problems = verify_store(store_copy)
    assert len(problems) == 1 and "another speaker" in problems[0]


def test_verify_recomputes_the_feature_hash(store_copy):
    manifest = json.loads((store_copy / "manifest.json").read_text())
    manifest["feature_hash"] = "0123456789abcdef"  # edited to pass as another config's store
    (store_copy / "manifest.json").write_text(json.dumps(manifest))
    problems = verify_store(store_copy)
    assert len(problems) == 1 and "is not the hash of its audio/text sections" in problems[0]


def test_nan_features_are_found_by_verify_and_refused_by_train(store_copy, tmp_path):
    from myxtts.train.data import open_train_data
    from myxtts.train.distributed import DistInfo
    from myxtts.train.errors import TrainError
    from tests.helpers import micro_config

    uid = poison_mel(store_copy, "train", utterance=3)  # the prepare's record is stale now
    problems = verify_store(store_copy)
    assert problems == [f"{store_copy / 'train'}: 1 mel frames hold NaN or infinity (first in "
                        f"utterance 3, {uid})"]
    with pytest.raises(TrainError, match=r"1 mel frames of the train split hold NaN .* utterance 3"):
        open_train_data(micro_config(tmp_path), store_copy, "cpu", DistInfo(), None)


def test_nan_statistics_are_refused(store_copy):
    manifest = json.loads((store_copy / "manifest.json").read_text())
    manifest["mel_stats"]["std"][0] = float("nan")
    (store_copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(StoreError, match=r"manifest.json: mel_stats.std of band 0 is nan, not "
                                         r"a finite number"):
        FeatureStore.open(store_copy).check_statistics()
    assert any("mel_stats.std of band 0 is nan" in p for p in verify_store(store_copy))
