"""prepare: kill-and-resume gives the identical store, rejections are reported, re-runs
are no-ops or refused, and the CLI's user errors are one line."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from myxtts.cli.main import main
from myxtts.config import Config, ConfigError, load_config
from myxtts.data.feed.loader import build_loader
from myxtts.data.prepare.build import prepare_store
from myxtts.data.prepare.records import DatasetError
from myxtts.data.store import FeatureStore, StoreError, verify_store
from myxtts.synthetic import make_demo_data

QUIET = {"progress": False, "echo": lambda s: None}
AUDIO = ["data.store_audio=true"]

# prepare in a subprocess, in chunks of 2, pausing 0.3 s after every committed chunk and
# every written split: a kill then lands deterministically mid-extraction or mid-pack.
# The pauses are patched in here (workers are forked: they inherit the patch), so the
# package carries no test hooks. Arguments after DATA and STORE are config overrides.
SLOW_PREPARE = """
import sys, time
from myxtts.config import load_config
from myxtts.data.prepare import build as prepare
from myxtts.data.prepare import chunks
from myxtts.data.store import writer

_extract, _write_split = chunks.extract_chunk, writer.StoreWriter.write_split
_finish = writer.StoreWriter.finish

def slow_extract(task):
    out = _extract(task)
    time.sleep(0.3)
    return out

def slow_write_split(self, *args):
    out = _write_split(self, *args)
    time.sleep(0.3)
    return out

def slow_finish(self, *args):  # the kill lands before the manifest, however loaded the host
    time.sleep(60)
    return _finish(self, *args)

chunks.extract_chunk = slow_extract
writer.StoreWriter.write_split = slow_write_split
writer.StoreWriter.finish = slow_finish
prepare.prepare_store(sys.argv[1], sys.argv[2], load_config(overrides=sys.argv[3:]), workers=2,
                      chunk_size=2, progress=False)
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_demo_data(tmp_path_factory.mktemp("prep") / "demo", speakers=2, utterances=10, seed=3)


@pytest.fixture(scope="module")
def reference_store(data, tmp_path_factory):
    """An uninterrupted run, one worker, default chunking."""
    out = tmp_path_factory.mktemp("ref") / "store"
    prepare_store(data, out, Config(), workers=1, **QUIET)
    return out


@pytest.fixture(scope="module")
def reference_audio_store(data, tmp_path_factory):
    """As ``reference_store``, keeping the audio (``--audio``)."""
    out = tmp_path_factory.mktemp("ref-audio") / "store"
    prepare_store(data, out, load_config(overrides=AUDIO), workers=1, **QUIET)
    return out


def _checksums(store: Path) -> dict:
    return json.loads((store / "manifest.json").read_text())["files"]


def _group_alive(pgid: int) -> bool:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _kill_when(cmd: list[str], env: dict, ready, timeout_s: float = 60.0) -> None:
    """Start ``cmd`` in its own process group, SIGKILL the main process once ``ready()``,
    then check its worker processes died with it (PR_SET_PDEATHSIG)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while not ready():
            assert proc.poll() is None, f"prepare ended before the kill: {proc.stderr.read()}"
            assert time.monotonic() < deadline, "prepare never reached the kill point"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        if sys.platform.startswith("linux"):
            deadline = time.monotonic() + 10
            while _group_alive(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not _group_alive(proc.pid), "worker processes outlived the killed prepare"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.stderr.close()


@pytest.mark.parametrize("stage", ["extract", "pack", "extract-audio", "pack-audio"])
@pytest.mark.slow
def test_sigkill_then_resume_gives_identical_store(data, request, tmp_path, stage):
    # With audio, the pack-stage kill lands after train/audio.i16 is written: the resumed
    # run must rewrite the audio files too, to the same bytes.
    overrides = AUDIO if stage.endswith("-audio") else []
    reference = request.getfixturevalue("reference_audio_store" if overrides else "reference_store")
    out = tmp_path / "store"
    cmd = [sys.executable, "-c", SLOW_PREPARE, str(data), str(out), *overrides]
    chunks = out / ".work" / "chunks"
    if stage.startswith("extract"):
        ready = lambda: chunks.is_dir() and len(list(chunks.glob("*.npz"))) >= 2  # noqa: E731
    else:
        last = out / "train" / ("audio.i16" if overrides else "mel.f16")
        ready = lambda: last.exists()  # noqa: E731
    _kill_when(cmd, dict(os.environ), ready)

    assert not (out / "manifest.json").exists()
    with pytest.raises(StoreError, match="incomplete store"):
        FeatureStore.open(out)
    done_before = len(list(chunks.glob("*.npz")))
    assert done_before >= 2
    if stage.startswith("extract"):
        assert done_before < 10  # 20 clips in chunks of 2: the kill landed mid-run

    messages: list[str] = []  # no chunk_size: the resumed run reuses the plan's chunking
    result = prepare_store(data, out, load_config(overrides=overrides), workers=2, progress=False,
                           echo=messages.append)
    assert result.resumed_chunks == done_before
    assert any(m.startswith("resuming") for m in messages)
    assert _checksums(out) == _checksums(reference)
    assert ("train/audio.i16" in _checksums(out)) == bool(overrides)
    assert not (out / ".work").exists() and not (out / ".partial").exists()
    assert verify_store(out) == []


def test_worker_count_and_chunking_do_not_change_the_bytes(data, reference_store, tmp_path):
    prepare_store(data, tmp_path / "s", Config(), workers=2, chunk_size=3, **QUIET)
    assert _checksums(tmp_path / "s") == _checksums(reference_store)


def test_rerun_is_a_noop_and_other_settings_need_force(data, reference_store):
    messages: list[str] = []
    result = prepare_store(data, reference_store, Config(), workers=1, progress=False,
                           echo=messages.append)
    assert result.noop and "nothing to do" in messages[0] and "--force rebuilds it" in messages[0]
    other = load_config(overrides=["data.max_duration_s=3.0"])
    with pytest.raises(StoreError, match=r"data\.max_duration_s: store 20\.0, config 3\.0.*--force"):
        prepare_store(data, reference_store, other, workers=1, **QUIET)


def test_force_rebuilds_with_new_settings(data, reference_store, tmp_path):
    out = tmp_path / "s"
    shutil.copytree(reference_store, out)
    (out / "notes.txt").write_text("mine")  # not ours: must survive --force
    cfg = load_config(overrides=["audio.n_mels=40"])
    with pytest.raises(DatasetError):  # a dataset that cannot be read destroys nothing
        prepare_store(tmp_path / "no-such-data", out, cfg, workers=1, force=True, **QUIET)
    assert verify_store(out) == []
    prepare_store(data, out, cfg, workers=1, force=True, **QUIET)
    store = FeatureStore.open(out, "train", cfg)
    assert store.mel(0).shape[1] == 40 and (out / "notes.txt").read_text() == "mine"


def test_force_rebuilds_a_current_store_too(data, reference_store, tmp_path):
    out = tmp_path / "s"
    shutil.copytree(reference_store, out)
    (out / "train" / "mel.f16").write_bytes(b"damaged")  # what a user would --force away
    result = prepare_store(data, out, Config(), workers=1, force=True, **QUIET)
    assert not result.noop and verify_store(out) == []
    assert (out / "train" / "mel.f16").read_bytes() == (reference_store / "train" / "mel.f16").read_bytes()


def test_foreign_folder_is_never_used(data, tmp_path):
    (tmp_path / "mine.txt").write_text("x")
    with pytest.raises(StoreError, match="not a myxtts store"):
        prepare_store(data, tmp_path, Config(), workers=1, force=True, **QUIET)
    assert (tmp_path / "mine.txt").exists()


def test_rejections_are_reported_with_reasons(data, tmp_path):
    src = tmp_path / "data"
    shutil.copytree(data, src)
    wavs = sorted((src / "wavs").glob("*.wav"))
    wavs[0].write_bytes(b"RIFF....not audio at all")
    sf.write(wavs[1], np.zeros(22050, np.float32), 22050)  # silent
    cfg = load_config(overrides=["data.max_duration_s=2.5", "data.max_text_tokens=44"])
    out = tmp_path / "store"
    result = prepare_store(src, out, cfg, workers=1, **QUIET)
    report = json.loads((out / "report.json").read_text())
    reasons = {r["id"]: r["reason"] for r in report["rejected"]}
    assert reasons[wavs[0].stem] == "unreadable audio"
    assert reasons[wavs[1].stem] == "silent audio"
    assert "too long" in reasons.values() and "too many tokens" in reasons.values()
    assert all(r["detail"] for r in report["rejected"])
    kept = sum(result.kept.values())
    assert kept + len(reasons) == 20 and result.rejected == report["counts_by_reason"]
    store = FeatureStore.open(out)
    assert store.durations_s.max() <= 2.5 and wavs[0].stem not in store.ids
    assert store.token_lengths.max() <= 44
    assert "too long" in result.summary


def test_a_clip_with_nonfinite_features_is_left_out_and_reported(data, tmp_path, monkeypatch):
    # The finite check starts in the worker: a clip whose mels come out NaN (here a sample
    # turned NaN after decoding, which the decoder's own check cannot see) is reported with
    # its file like any bad clip, and the store's manifest records its mels as checked.
    from myxtts.data.prepare import chunks

    real_load = chunks.load_audio  # what a worker reads a clip with
    target = sorted((data / "wavs").glob("*.wav"))[4]

    def load(path, cfg, notes=None):
        wav = real_load(path, cfg, notes)
        if Path(path).name == target.name:
            wav = wav.copy()
            wav[len(wav) // 2] = np.nan
        return wav

    monkeypatch.setattr(chunks, "load_audio", load)
    out = tmp_path / "store"
    result = prepare_store(data, out, Config(), workers=1, **QUIET)
    report = json.loads((out / "report.json").read_text())
    assert [(r["id"], r["reason"], Path(r["audio_path"]).name) for r in report["rejected"]] == \
        [(target.stem, "non-finite features", target.name)]
    assert "mel frames are NaN or infinite" in report["rejected"][0]["detail"]
    assert result.rejected == {"non-finite features": 1} and sum(result.kept.values()) == 19
    assert f"non-finite features: {target}" in result.summary
    assert all(target.stem not in FeatureStore.open(out, s).ids for s in ("train", "val"))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["finite_check"]["checked_by"] == "prepare" and verify_store(out) == []


def test_every_clip_rejected_is_a_clear_error(data, tmp_path):
    cfg = load_config(overrides=["data.min_duration_s=10", "data.max_duration_s=20"])
    with pytest.raises(StoreError, match=r"every utterance was rejected.*too short: 20.*report\.json"):
        prepare_store(data, tmp_path / "s", cfg, workers=1, **QUIET)
    report = json.loads((tmp_path / "s" / "report.json").read_text())
    assert report["counts_by_reason"] == {"too short": 20}


def test_cli_workers_zero_and_verify(data, reference_store, capsys):
    assert main(["prepare", str(data), "--out", "unused", "--workers", "0"]) == 2
    err = capsys.readouterr().err
    assert "--workers 0" in err and "N >= 1" in err and err.count("\n") == 1
    assert main(["prepare", "--verify", str(reference_store)]) == 0
    assert "ok" in capsys.readouterr().out


def test_cli_prepare_other_config_is_one_line(data, reference_store, capsys):
    code = main(["prepare", str(data), "--out", str(reference_store), "--quiet",
                 "--set", "audio.fmax=7000"])
    err = capsys.readouterr().err
    assert code == 2 and "audio.fmax" in err and "--force" in err and err.count("\n") == 1


def test_store_without_validation_split(data, tmp_path):
    cfg = load_config(overrides=["data.val_fraction=0", "data.min_val_utterances=0"])
    prepare_store(data, tmp_path / "s", cfg, workers=1, **QUIET)
    val = FeatureStore.open(tmp_path / "s", "val", cfg)
    assert len(val) == 0 and val.mel_array.shape == (0, 80) and len(FeatureStore.open(tmp_path / "s")) == 20
    assert verify_store(tmp_path / "s") == []
    with pytest.raises(ConfigError, match="val split is empty"):
        build_loader(val, cfg)


def test_a_second_concurrent_prepare_is_refused(data, tmp_path):
    fcntl = pytest.importorskip("fcntl")

    out = tmp_path / "s"
    out.mkdir()
    with open(out / ".lock", "a+") as held:  # what a running prepare holds
        held.write("pid 4242 (`myxtts prepare`)")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(StoreError, match=r"is being written by pid 4242 \(`myxtts prepare`\)"):
            prepare_store(data, out, Config(), workers=1, **QUIET)
    prepare_store(data, out, Config(), workers=1, **QUIET)  # lock released: fine
    assert not (out / ".lock").exists() and verify_store(out) == []


def test_damaged_chunk_is_extracted_again(data, reference_store, tmp_path, monkeypatch):
    # Chunks are committed by rename without fsync; an OS crash can leave one renamed but
    # empty or cut short. Resume must redo such a chunk, not trust it or crash on it.
    from myxtts.data.prepare import build as prep

    out = tmp_path / "store"
    real_pack = prep._pack

    def crash(*args, **kwargs):
        raise RuntimeError("crash after extraction")

    monkeypatch.setattr(prep, "_pack", crash)
    with pytest.raises(RuntimeError, match="crash after extraction"):
        prepare_store(data, out, Config(), workers=1, chunk_size=4, **QUIET)
    monkeypatch.setattr(prep, "_pack", real_pack)
    chunks = sorted((out / ".work" / "chunks").glob("*.npz"))
    assert len(chunks) == 6  # 20 clips in chunks of 4 per split (train 18, val 2)
    chunks[0].write_bytes(b"")  # renamed but never flushed
    chunks[1].write_bytes(chunks[1].read_bytes()[:-100])  # cut short
    with np.load(chunks[2]) as z:  # whole, but holding a NaN mel: never packed
        arrays = {k: z[k] for k in z.files}
    arrays["mel"][3, 7] = np.nan
    np.savez(chunks[2], **arrays)
    result = prepare_store(data, out, Config(), workers=1, **QUIET)
    assert result.resumed_chunks == 3
    assert _checksums(out) == _checksums(reference_store)
    assert verify_store(out) == []
