"""The finite check of a store's mels: made where prepare writes them, recorded in the
manifest under the store's checksum, trusted by train without reading the mels, made once
and recorded for a store without the record, never trusted when it names other files."""

import json
import logging
import shutil

import numpy as np
import pytest

from myxtts.data.store import (
    FeatureStore,
    StoreError,
    ensure_finite,
    finite,
    read_manifest,
    verify_store,
)
from myxtts.data.store.format import FINITE_CHECK, store_checksum
from myxtts.data.store.writer import SplitRows, StoreWriter
from tests.data.store_damage import poison_mel


@pytest.fixture()
def store(micro_store, tmp_path):
    dst = tmp_path / "store"
    shutil.copytree(micro_store, dst)
    return dst


@pytest.fixture()
def scans(monkeypatch):
    """Counts the full passes over a split's mels (what a trusted record spares)."""
    calls = []
    real = finite.scan_split

    def counted(store):
        calls.append(store.split)
        return real(store)

    monkeypatch.setattr(finite, "scan_split", counted)
    return calls


def _edit_manifest(store, edit):
    manifest = json.loads((store / "manifest.json").read_text())
    edit(manifest)
    (store / "manifest.json").write_text(json.dumps(manifest))


def test_has_nonfinite_known_answers():
    for n in (1, 3, 4, 5, 80, 83):  # every uint64 lane and the tail past the last whole lane
        clean = np.linspace(-65504, 65504, n).astype(np.float16)
        clean[0] = np.float16(6e-8)  # a subnormal is finite
        assert not finite.has_nonfinite(clean)
        for value in (np.nan, np.inf, -np.inf):
            for at in {0, n // 2, n - 1}:
                bad = clean.copy()
                bad[at] = value
                assert finite.has_nonfinite(bad), (n, value, at)
    mel = np.zeros((7, 80), np.float16)
    mel[4, 79] = np.inf
    assert finite.has_nonfinite(mel) and finite.nonfinite_rows(mel).tolist() == [4]


def test_prepare_records_the_check_and_train_trusts_it_unread(store, scans):
    manifest = read_manifest(store)
    assert manifest[FINITE_CHECK] == {"store_checksum": store_checksum(manifest),
                                      "nonfinite_frames": 0, "checked_by": "prepare"}
    assert ensure_finite(store, manifest, record_as="train") is None
    assert scans == []  # not one mel read
    assert read_manifest(store) == manifest  # nor the manifest rewritten


def test_old_store_is_checked_once_and_the_result_recorded(store, scans):
    _edit_manifest(store, lambda m: m.pop(FINITE_CHECK))  # prepared before the check existed
    (store / "manifest.json").chmod(0o644)
    before = read_manifest(store)
    assert ensure_finite(store, before, record_as="train") is None
    assert scans == ["train", "val"]
    after = read_manifest(store)
    assert after[FINITE_CHECK]["checked_by"] == "train"
    assert {k: v for k, v in after.items() if k != FINITE_CHECK} == before  # nothing else
    assert (store / "manifest.json").stat().st_mode & 0o777 == 0o644
    assert not list(store.glob(".*.tmp"))
    assert ensure_finite(store, after) is None and scans == ["train", "val"]  # trusted now
    assert verify_store(store) == []


def test_without_record_as_nothing_is_written(store, scans):
    _edit_manifest(store, lambda m: m.pop(FINITE_CHECK))
    manifest = read_manifest(store)
    assert ensure_finite(store, manifest) is None and scans == ["train", "val"]
    assert FINITE_CHECK not in read_manifest(store)  # another rank's start records nothing


@pytest.mark.parametrize("damage", [
    "other checksum", "frames not zero", "frames a bool", "not an object", "another file re-hashed"])
def test_a_record_that_does_not_match_is_not_trusted(store, scans, damage):
    edits = {
        "other checksum": lambda m: m[FINITE_CHECK].update(store_checksum="0" * 64),
        "frames not zero": lambda m: m[FINITE_CHECK].update(nonfinite_frames=3),
        "frames a bool": lambda m: m[FINITE_CHECK].update(nonfinite_frames=False),
        "not an object": lambda m: m.update({FINITE_CHECK: "ok"}),
        "another file re-hashed": lambda m: m["files"]["report.json"].update(sha256="0" * 64),
    }
    _edit_manifest(store, edits[damage])
    manifest = read_manifest(store)
    assert not finite.is_recorded(manifest)
    assert ensure_finite(store, manifest) is None and scans == ["train", "val"]


def test_a_manifest_cut_short_is_refused_not_trusted(store):
    blob = (store / "manifest.json").read_bytes()
    (store / "manifest.json").write_bytes(blob[: len(blob) // 2])  # a copy that lost its tail
    with pytest.raises(StoreError, match=r"manifest\.json: unreadable .*--force"):
        FeatureStore.open(store)
    assert "unreadable" in verify_store(store)[0]


def test_nan_behind_a_stale_record_is_refused_and_not_recorded(store, scans):
    uid = poison_mel(store, "val", utterance=1)  # re-hashed: the record names other files now
    manifest = read_manifest(store)
    problem = ensure_finite(store, manifest, record_as="train")
    assert problem == f"1 mel frames of the val split hold NaN or infinity (first in utterance 1, {uid})"
    assert read_manifest(store) == manifest  # a failing store is not recorded: checked again
    assert ensure_finite(store, manifest, record_as="train") == problem
    assert scans == ["train", "val", "train", "val"]


def test_a_store_that_cannot_be_written_is_checked_every_start(store, scans, monkeypatch, caplog):
    _edit_manifest(store, lambda m: m.pop(FINITE_CHECK))

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Read-only file system")

    monkeypatch.setattr(finite, "atomic_write", read_only)
    manifest = read_manifest(store)
    with caplog.at_level(logging.WARNING, logger=finite.__name__):
        assert ensure_finite(store, manifest, record_as="train") is None
        assert ensure_finite(store, manifest, record_as="train") is None
    assert scans == ["train", "val"] * 2
    assert "cannot record the check" in caplog.text and "Read-only" in caplog.text


def test_scan_and_verify_read_in_blocks_without_a_memmap(store, monkeypatch):
    monkeypatch.setattr(finite, "BLOCK_BYTES", 4096)  # ~25 frames a block: many block edges
    monkeypatch.setattr(FeatureStore, "mel_array", property(lambda self: pytest.fail("memmap")))
    st = FeatureStore.open(store)
    last = len(st) - 1
    uid = poison_mel(store, "train", utterance=last, frame=int(st.mel_lengths[last]) - 1,
                  value=-np.inf)
    assert finite.scan_split(FeatureStore.open(store)) == (1, last)
    problems = verify_store(store)
    assert problems == [f"{store / 'train'}: 1 mel frames hold NaN or infinity (first in "
                        f"utterance {last}, {uid})"]


def test_verify_says_when_the_record_claims_otherwise(store):
    uid = poison_mel(store, "train", utterance=2)
    manifest = read_manifest(store)
    _edit_manifest(store, lambda m: m.update({FINITE_CHECK: finite.finite_record(manifest, "x")}))
    problems = verify_store(store)
    assert len(problems) == 1 and uid in problems[0] and "records them as checked finite" in problems[0]


def test_read_rows_names_a_short_file(store):
    f = store / "train" / "tokens.i32"
    n = f.stat().st_size // 4
    with pytest.raises(StoreError, match=r"tokens\.i32: ends after .* bytes"):
        list(finite.read_rows(f, np.dtype("<i4"), 1, n + 1))
    blocks = list(finite.read_rows(f, np.dtype("<i4"), 1, n, block_bytes=64))
    assert [start for start, _ in blocks] == list(range(0, n, 16))


def test_the_writer_refuses_nan_naming_the_utterance(tmp_path):
    writer = StoreWriter(tmp_path, ["a"], n_mels=4)
    rows = SplitRows(ids=["u0", "u1"], speakers=["a", "a"], language_ids=np.zeros(2, np.int64),
                     tokens=[(1, 2), (1, 3)], mel_lengths=np.array([3, 2]),
                     durations_s=[0.1, 0.1], refs=np.array([[1], [0]], np.int32))
    blocks = [np.zeros((3, 4), np.float16), np.zeros((2, 4), np.float16)]
    blocks[1][1, 2] = np.nan
    with pytest.raises(StoreError, match=r"train/mel\.f16: utterance u1 has NaN"):
        writer.write_split("train", rows, blocks)
    assert "train" not in writer.finite_splits and not (tmp_path / "train" / "mel.f16").exists()


def test_train_records_the_check_of_an_older_store_on_each_nodes_first_rank(store, scans, tmp_path):
    from myxtts.train.data import open_train_data
    from myxtts.train.distributed import DistInfo
    from tests.helpers import micro_config

    _edit_manifest(store, lambda m: m.pop(FINITE_CHECK))
    cfg = micro_config(tmp_path / "run")
    open_train_data(cfg, store, "cpu", DistInfo(rank=1, world_size=4, local_rank=1), None)
    assert FINITE_CHECK not in read_manifest(store) and scans == ["train", "val"]
    open_train_data(cfg, store, "cpu", DistInfo(rank=2, world_size=4, local_rank=0), None)
    assert read_manifest(store)[FINITE_CHECK]["checked_by"] == "train"
    open_train_data(cfg, store, "cpu", DistInfo(), None)
    assert scans == ["train", "val"] * 2  # the third start trusted the record
