"""Audio in the store (``prepare --audio``): the waveform behind every mel, int16 and
memory-mapped, covered by the manifest, ``--verify``, the prepare key and resume."""

import hashlib
import json
import shutil

import numpy as np
import pytest

from myxtts.audio import load_audio
from myxtts.audio.frames import frames_for_samples
from myxtts.cli.main import main
from myxtts.config import load_config
from myxtts.data.prepare.build import prepare_store
from myxtts.data.prepare.readers import read_dataset
from myxtts.data.store import FeatureStore, StoreError, verify_store
from myxtts.data.store.audio import format_size, quantize
from myxtts.data.store.reader import require_audio
from myxtts.data.store.writer import npy_bytes
from myxtts.synthetic import make_demo_data
from tests.data.store_damage import flip_a_byte_is_found, truncation_is_named

QUIET = {"progress": False, "echo": lambda s: None}
AUDIO = ["data.store_audio=true"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The same dataset prepared twice: without audio and with it."""
    root = tmp_path_factory.mktemp("audio")
    data = make_demo_data(root / "demo", speakers=2, utterances=8, seed=5)
    plain, with_audio = root / "plain", root / "with-audio"
    prepare_store(data, plain, load_config(), workers=1, **QUIET)
    result = prepare_store(data, with_audio, load_config(overrides=AUDIO), workers=1, **QUIET)
    return data, plain, with_audio, result


@pytest.fixture()
def audio_copy(demo, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(demo[2], dst)
    return dst


def _manifest(path):
    return json.loads((path / "manifest.json").read_text())


def _rewrite(store, rel, blob):
    """Replace a store file and fix its manifest entry: only the index checks can object."""
    (store / rel).write_bytes(blob)
    manifest = _manifest(store)
    manifest["files"][rel] = {"size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
    (store / "manifest.json").write_text(json.dumps(manifest))


def test_quantize_rounds_and_saturates():
    x = np.array([0.0, 1.0, -1.0, 1.5, -1.5, 0.6 / 32767, -0.4 / 32767], np.float32)
    assert quantize(x).tolist() == [0, 32767, -32767, 32767, -32768, 1, 0]
    assert quantize(x).dtype == np.int16
    assert frames_for_samples(np.array([0, 255, 256, 1000]), 1024, 256).tolist() == [1, 1, 2, 4]
    assert format_size(999) == "999 B" and format_size(1_234_567_890) == "1.2 GB"


def test_audio_round_trip_matches_the_clip_behind_each_mel(demo):
    data, _, path, _ = demo
    cfg = load_config(overrides=AUDIO)
    clips = {u.id: u for u in read_dataset(data, cfg).all}
    hop = cfg.audio.hop_length
    for split in ("train", "val"):
        store = FeatureStore.open(path, split, cfg)
        assert store.has_audio and require_audio(store) is store and len(store) > 0
        assert store.audio_lengths.dtype == np.int64 and store.audio_lengths.shape == (len(store),)
        assert store.audio_sample_rate == _manifest(path)["audio"]["sample_rate"] == 22050
        for i in range(len(store)):
            audio = store.audio(i)
            assert audio.dtype == np.int16 and audio.shape == (store.audio_lengths[i],)
            assert np.shares_memory(audio, store.audio_array) and not audio.flags.writeable
            assert store.mel_lengths[i] == 1 + len(audio) // hop == store.mel(i).shape[0]
            expected = load_audio(clips[store.ids[i]].audio_path, cfg.audio)  # trimmed, resampled
            assert len(expected) == len(audio)
            # int16 rounding: at most half a step off (plus float32 slack).
            np.testing.assert_allclose(audio / 32767.0, expected, rtol=0, atol=0.5 / 32767 + 1e-7)
            assert abs(len(audio) / 22050 - store.durations_s[i]) < 1e-4
    assert verify_store(path) == []


def test_audio_leaves_the_features_byte_identical(demo):
    _, plain, path, result = demo
    with_audio, without = _manifest(path), _manifest(plain)
    assert with_audio["store_audio"] is True and without["store_audio"] is False
    extra = {f"{s}/{n}" for s in ("train", "val") for n in ("audio.i16", "audio_index.npy")}
    assert set(with_audio["files"]) == set(without["files"]) | extra
    for rel in without["files"]:  # mels, tokens, index, refs, ids, vocab, report
        assert with_audio["files"][rel] == without["files"][rel], rel
    size = sum(with_audio["files"][f"{s}/audio.i16"]["size"] for s in ("train", "val"))
    assert f"audio: {format_size(size)} int16 kept for vocoder training" in result.summary
    index = np.load(path / "train" / "audio_index.npy")
    assert index.dtype == np.int64 and index.shape == (len(FeatureStore.open(path)), 2)


def test_store_without_audio_says_how_to_add_it(demo):
    _, plain, _, _ = demo
    store = FeatureStore.open(plain)
    assert not store.has_audio
    expected = (f"{plain} has no audio (prepared without --audio); re-run `myxtts prepare DATA "
                f"--out {plain} --audio --force` to add it")
    for call in (store.require_audio, lambda: require_audio(store), lambda: store.audio(0),
                 lambda: store.audio_lengths):
        with pytest.raises(StoreError) as e:
            call()
        assert str(e.value) == expected and "\n" not in str(e.value)


def test_a_manifest_from_before_audio_reads_as_no_audio(demo, tmp_path):
    _, plain, _, _ = demo
    old = tmp_path / "old"
    shutil.copytree(plain, old)
    manifest = _manifest(old)
    del manifest["store_audio"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    assert not FeatureStore.open(old).has_audio and verify_store(old) == []


def test_verify_detects_a_corrupted_audio_file(audio_copy):
    flip_a_byte_is_found(audio_copy, "val/audio.i16", 0x10)


def test_truncated_audio_file_is_named(audio_copy):
    truncation_is_named(audio_copy, "train/audio.i16", 2)


def test_verify_detects_audio_lengths_that_disagree_with_the_mels(audio_copy):
    index = np.load(audio_copy / "train" / "audio_index.npy")
    hop = _manifest(audio_copy)["audio"]["hop_length"]
    index[0, 1] -= hop  # move one hop of samples from clip 0 to clip 1: sizes still add up
    index[1, 0] -= hop
    index[1, 1] += hop
    _rewrite(audio_copy, "train/audio_index.npy", npy_bytes(index))
    problems = verify_store(audio_copy)
    assert len(problems) == 1 and "2 utterances whose audio and mel lengths disagree" in problems[0]


def test_verify_detects_non_contiguous_audio_offsets(audio_copy):
    index = np.load(audio_copy / "val" / "audio_index.npy")
    index[[0, 1], 0] = index[[1, 0], 0]  # swapped offsets, same lengths
    _rewrite(audio_copy, "val/audio_index.npy", npy_bytes(index))
    problems = verify_store(audio_copy)
    assert any("val/audio_index.npy: offsets not contiguous" in p for p in problems)


def test_audio_index_of_the_wrong_shape_is_refused(audio_copy):
    index = np.load(audio_copy / "train" / "audio_index.npy")
    _rewrite(audio_copy, "train/audio_index.npy", npy_bytes(index[:-1]))
    with pytest.raises(StoreError, match=r"audio_index\.npy.*expected int64"):
        FeatureStore.open(audio_copy)
    assert any("audio_index.npy" in p for p in verify_store(audio_copy))


def test_audio_files_must_be_in_the_manifest(audio_copy):
    manifest = _manifest(audio_copy)
    del manifest["files"]["train/audio.i16"]
    (audio_copy / "manifest.json").write_text(json.dumps(manifest))
    problems = verify_store(audio_copy)
    assert problems == [f"{audio_copy / 'train' / 'audio.i16'}: not listed in the manifest"]


def test_asking_for_audio_needs_force_and_names_the_key(demo, tmp_path, capsys):
    data, plain, with_audio, _ = demo
    out = tmp_path / "s"
    shutil.copytree(plain, out)
    code = main(["prepare", str(data), "--out", str(out), "--quiet", "--workers", "1", "--audio"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "data.store_audio: store False, config True" in err and "--force" in err
    assert not FeatureStore.open(out).has_audio  # refused: nothing changed
    assert main(["prepare", str(data), "--out", str(out), "--quiet", "--workers", "1",
                 "--audio", "--force"]) == 0
    assert "int16 kept for vocoder training" in capsys.readouterr().out
    assert _manifest(out)["files"] == _manifest(with_audio)["files"]
    assert main(["prepare", "--verify", str(out)]) == 0
    # And back: the same command without --audio is a different store, refused the same way.
    with pytest.raises(StoreError, match=r"data\.store_audio: store True, config False.*--force"):
        prepare_store(data, out, load_config(), workers=1, **QUIET)


def test_resume_redoes_chunks_without_valid_audio(demo, tmp_path, monkeypatch):
    # An interrupted run with audio, then: a chunk gone, one without audio (as a run
    # without --audio writes it), one whose audio disagrees with its mels. Resume must
    # re-extract exactly those and give the uninterrupted store's bytes.
    from myxtts.data.prepare import build as prep

    data, _, reference, _ = demo
    cfg = load_config(overrides=AUDIO)

    def crash(*args, **kwargs):
        raise RuntimeError("crash after extraction")

    monkeypatch.setattr(prep, "_pack", crash)
    plain_out, out = tmp_path / "plain", tmp_path / "store"
    for config, where in ((load_config(), plain_out), (cfg, out)):
        with pytest.raises(RuntimeError, match="crash after extraction"):
            prepare_store(data, where, config, workers=1, chunk_size=3, **QUIET)
    monkeypatch.undo()
    chunks = sorted((out / ".work" / "chunks").glob("*.npz"))
    assert len(chunks) == 6  # 16 clips in chunks of 3 per split (train 14, val 2)
    chunks[0].unlink()
    shutil.copyfile(plain_out / ".work" / "chunks" / chunks[1].name, chunks[1])
    with np.load(chunks[2]) as z:
        arrays = dict(z)
    arrays["n_samples"][0] += cfg.audio.hop_length  # one frame more than its mel has
    np.savez(chunks[2], **arrays)
    result = prepare_store(data, out, cfg, workers=1, **QUIET)
    assert result.resumed_chunks == 3
    assert _manifest(out)["files"] == _manifest(reference)["files"]
    assert verify_store(out) == []
