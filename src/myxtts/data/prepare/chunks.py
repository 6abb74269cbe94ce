"""Prepare's unit of work: the chunk. Planning chunks, extracting them in worker
processes, and the chunk file that commits the work.

A chunk is a fixed run of planned utterances of one split (``chunk_size`` depends only on
the dataset size, so every run, whatever its ``--workers``, cuts the same chunks). A worker
turns its clips into float16 log-mels with ``MelSpectrogram`` and commits the chunk as ONE
``.npz`` with an atomic rename into ``STORE/.work/chunks/``; complete chunks are skipped,
which is the whole resume mechanism. Why chunks: a million tiny files is slow on every file
system, and appending to one file is not atomic. A SIGKILL loses at most the chunks in flight.

torch is imported inside the extraction functions, not with the module: a spawned worker
(macOS, Windows) caps its BLAS/OpenMP threads (``_limit_threads``) before torch reads
them, and a prepare with nothing left to extract never loads it.
"""

from __future__ import annotations

import ctypes
import hashlib
import io
import json
import multiprocessing as mp
import os
import signal
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from myxtts.audio.io import AudioError, load_audio
from myxtts.config import AudioConfig
from myxtts.data.prepare.plan import Planned
from myxtts.data.prepare.records import NONFINITE_FEATURES, SPLITS, TOO_LONG, TOO_SHORT
from myxtts.data.store.audio import chunk_audio_ok, quantize
from myxtts.data.store.finite import has_nonfinite, nonfinite_rows
from myxtts.data.store.format import AUDIO_DTYPE, MEL_DTYPE, StoreError
from myxtts.system import atomic_write

MAX_CHUNK_SIZE = 256  # utterances per chunk on big datasets (~2.5 min of work per 256 x 6 s)
MIN_CHUNK_SIZE = 8
TARGET_CHUNKS = 64  # small datasets still get enough chunks to keep every worker busy
_SUMMARY_KEYS = ("n_frames", "duration_s", "mel_sum", "mel_sq_sum", "rejections", "fixes")
_JSON_KEYS = ("rejections", "fixes")


# ---------------------------------------------------------------- planning

def default_chunk_size(n_utterances: int) -> int:
    """Chunk size from the dataset size only (never from --workers): a resumed run with
    another worker count must find the same chunks."""
    return int(min(MAX_CHUNK_SIZE, max(MIN_CHUNK_SIZE, -(-n_utterances // TARGET_CHUNKS))))


def plan_hash(key: dict[str, Any], chunk_size: int, planned: dict[str, list[Planned]]) -> str:
    """Hash of everything the chunks' contents depend on: equal hashes, reusable chunks."""
    # The same dicts ``dataclasses.asdict`` gives, built directly: asdict deep-copies every
    # token tuple and was a measurable share of a small prepare.
    splits = {s: [{"id": u.id, "audio_path": u.audio_path, "speaker": u.speaker,
                   "language": u.language, "tokens": list(u.tokens)} for u in planned[s]]
              for s in SPLITS}
    blob = json.dumps({"key": key, "chunk_size": chunk_size, "splits": splits},
                      sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def split_into_chunks(planned: dict[str, list[Planned]], chunk_size: int
                      ) -> list[tuple[str, int, list[Planned]]]:
    """``(split, chunk number, utterances)`` for every chunk, train first, in plan order."""
    out = []
    for split in SPLITS:
        utts = planned[split]
        for k in range(0, len(utts), chunk_size):
            out.append((split, k // chunk_size, utts[k:k + chunk_size]))
    return out


def chunk_path(work: Path, split: str, k: int) -> Path:
    return work / "chunks" / f"{split}-{k:06d}.npz"


# ---------------------------------------------------------------- the chunk file

def write_chunk(path: str | Path, data: bytes) -> None:
    """Commit a chunk: temp file + rename, WITHOUT fsync.

    The rename alone makes it all-or-nothing against a kill at any instant (the page
    cache outlives the process), which is what resume is for. fsync only adds safety
    against an OS crash or power loss, and chunks do not need it: they are a cache that
    the store writer turns into fsync'd store files, and ``chunk_ok`` sends a chunk damaged
    by such a crash (typically renamed but empty) back to extraction. The fsync, plus the
    slower unlink of fsync'd files when ``.work`` goes, measures ~1/6 of a small
    prepare's wall time.
    """
    atomic_write(path, data, fsync=False)


def chunk_ok(path: Path, n_utterances: int, n_mels: int,
             audio_cfg: AudioConfig | None = None) -> bool:
    """True when a chunk left by an earlier run is complete: every array reads back (zip
    CRCs checked), its shapes fit the plan and its mels are finite (extraction leaves out a
    clip whose are not). ``audio_cfg``: the run keeps audio, so the chunk must carry it,
    consistent with its mels. Anything else is extracted again."""
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {name: z[name] for name in z.files}
        n_frames, mel = arrays["n_frames"], arrays["mel"]
        return (len(n_frames) == n_utterances and mel.dtype == MEL_DTYPE
                and mel.shape == (int(n_frames.sum()), n_mels) and not has_nonfinite(mel)
                and all(k in arrays for k in _SUMMARY_KEYS)
                and (audio_cfg is None or chunk_audio_ok(arrays, n_frames.astype(np.int64),
                                                         audio_cfg.n_fft, audio_cfg.hop_length)))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return False


def read_chunk_summary(path: Path, n_utterances: int) -> dict[str, Any]:
    """Everything of a chunk but its mels and audio (``NpzFile`` loads arrays lazily):
    ``n_frames``, ``duration_s``, ``mel_sum``, ``mel_sq_sum``, ``rejections`` and ``fixes``
    (lists of dicts), and ``n_samples`` in a chunk with audio."""
    with np.load(path, allow_pickle=False) as z:
        out = {k: z[k] for k in _SUMMARY_KEYS + (("n_samples",) if "n_samples" in z.files else ())}
    for k in _JSON_KEYS:
        out[k] = json.loads(out[k].tobytes().decode())
    if len(out["n_frames"]) != n_utterances:
        raise StoreError(f"{path}: holds {len(out['n_frames'])} clips, the plan {n_utterances}; "
                         f"delete {path.parent.parent} and re-run prepare")
    return out


def read_chunk_mels(path: Path, n_frames: int, n_mels: int) -> np.ndarray:
    """The chunk's float16 mels [n_frames, n_mels], checked against its summary."""
    with np.load(path, allow_pickle=False) as z:
        mel = z["mel"]
    if mel.dtype != MEL_DTYPE or mel.shape != (n_frames, n_mels):
        raise StoreError(f"{path}: damaged chunk; delete {path.parent.parent} and re-run prepare")
    return mel


def read_chunk_audio(path: Path, n_samples: int) -> np.ndarray:
    """The chunk's int16 audio [n_samples] (kept clips back to back), checked against its
    summary."""
    with np.load(path, allow_pickle=False) as z:
        audio = z["audio"] if "audio" in z.files else None
    if audio is None or audio.dtype != AUDIO_DTYPE or audio.shape != (n_samples,):
        raise StoreError(f"{path}: damaged chunk or one without audio; delete "
                         f"{path.parent.parent} and re-run prepare")
    return audio


# ---------------------------------------------------------------- worker side

_WORKER_STATE: dict[str, Any] = {}


def _limit_threads() -> None:
    """One BLAS/OpenMP thread per process: N workers on N cores, not N x N threads."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS"):
        os.environ[var] = "1"
    import torch  # deferred: after the thread variables (module doc)

    torch.set_num_threads(1)


def _worker_init(parent_pid: int) -> None:
    """Runs first in every worker process."""
    # Die with the parent: if prepare is SIGKILLed, orphaned workers must not keep running
    # (and writing chunks) forever. Linux only; elsewhere they exit at their next task.
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # pragma: no cover - exotic libc
            pass
    if os.getppid() != parent_pid:  # parent died before prctl took effect
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    # a forked worker inherits the CLI's handlers, which turn SIGTERM and SIGHUP into an
    # exception: the pool's terminate() at the end would print each idle worker's traceback
    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    _limit_threads()


def extract_chunk(task: dict[str, Any]) -> dict[str, Any]:
    """Worker: load + check + featurise one chunk (and, with ``task["store_audio"]``, keep
    each kept clip's int16 waveform), commit it atomically, return counts. The ``.npz``
    (no pickle): ``mel`` float16, ``n_frames`` int32 (0 = rejected), ``duration_s``,
    ``mel_sum`` / ``mel_sq_sum`` float64 over kept frames as stored, ``rejections`` and
    ``fixes`` (what was done to kept clips, ``audio.io``'s notes; JSON as uint8); with
    audio also ``audio`` int16 and ``n_samples`` (a chunk without them
    never satisfies a run that wants audio, so it is extracted again)."""
    # deferred: torch, after _limit_threads in a spawned worker (module doc)
    import torch

    from myxtts.audio.mel import MelSpectrogram

    audio_cfg = AudioConfig(**task["audio"])
    key = json.dumps(task["audio"], sort_keys=True)
    if _WORKER_STATE.get("key") != key:
        _WORKER_STATE.update(key=key, mel=MelSpectrogram(audio_cfg))
    module = _WORKER_STATE["mel"]
    min_s, max_s = task["min_duration_s"], task["max_duration_s"]
    n = len(task["utterances"])
    n_frames = np.zeros(n, np.int32)
    durations = np.zeros(n, np.float32)
    mels: list[np.ndarray] = []
    keep_audio = bool(task.get("store_audio", False))
    n_samples = np.zeros(n, np.int32)
    waves: list[np.ndarray] = []
    rejections: list[dict[str, str]] = []
    fixes: list[dict[str, str]] = []
    mel_sum = np.zeros(audio_cfg.n_mels, np.float64)
    mel_sq_sum = np.zeros(audio_cfg.n_mels, np.float64)
    audio_s = 0.0
    for j, (uid, path) in enumerate(task["utterances"]):
        notes: list[dict[str, str]] = []
        try:
            wav = load_audio(path, audio_cfg, notes)  # float32 [samples]
        except AudioError as e:
            rejections.append({"id": uid, "audio_path": path, "reason": e.reason,
                               "detail": str(e)})
            continue
        duration_s = len(wav) / audio_cfg.sample_rate
        durations[j] = duration_s
        audio_s += duration_s
        if duration_s < min_s or duration_s > max_s:
            too_short = duration_s < min_s
            rejections.append({
                "id": uid, "audio_path": path, "reason": TOO_SHORT if too_short else TOO_LONG,
                "detail": (f"{duration_s:.2f} s after trimming, data."
                           f"{'min' if too_short else 'max'}_duration_s is "
                           f"{min_s if too_short else max_s} s")})
            continue
        # One clip per call: grouping a chunk's clips into length-sorted padded batches
        # gives the same features but measures 1.3-4x slower on CPU (the per-clip
        # reflect padding copies and the bigger working set cost more than the calls saved).
        wav = np.require(wav, np.float32, ["C", "W"])
        with torch.no_grad():
            log_mel, _ = module(torch.from_numpy(wav))  # [T, n_mels] float32
        # Casts in torch (vectorised; numpy's float16 casts are not). float16 -> float64 is
        # exact, so the statistics are those of the stored values.
        mel16 = log_mel.to(torch.float16)  # [T, n_mels]
        if has_nonfinite(mel16.numpy()):  # the check the store's manifest records starts here
            rejections.append({
                "id": uid, "audio_path": path, "reason": NONFINITE_FEATURES,
                "detail": f"{len(nonfinite_rows(mel16.numpy()))} of {len(mel16)} mel frames are "
                          f"NaN or infinite as stored (float16); the clip is left out"})
            continue
        fixes += [{"id": uid, "audio_path": path, **note} for note in notes]
        mel64 = mel16.to(torch.float64).numpy()  # [T, n_mels]
        n_frames[j] = mel64.shape[0]
        mel_sum += mel64.sum(axis=0)
        mel_sq_sum += np.square(mel64).sum(axis=0)
        mels.append(mel16.numpy())
        if keep_audio:  # the same array the mel came from: store.audio(i) <-> store.mel(i)
            n_samples[j] = len(wav)
            waves.append(quantize(wav))
    mel = np.concatenate(mels) if mels else np.zeros((0, audio_cfg.n_mels), np.float16)
    buf = io.BytesIO()
    extra = {}
    if keep_audio:  # a chunk without audio keeps exactly the arrays (and bytes) it had before
        extra = {"audio": np.concatenate(waves) if waves else np.zeros(0, AUDIO_DTYPE),
                 "n_samples": n_samples}
    np.savez(buf, mel=mel, n_frames=n_frames, duration_s=durations, mel_sum=mel_sum,
             mel_sq_sum=mel_sq_sum,
             rejections=_json_array(rejections), fixes=_json_array(fixes), **extra)
    write_chunk(task["path"], buf.getvalue())
    return {"n": n, "audio_s": audio_s, "rejected": len(rejections)}


def _json_array(items: list[dict[str, str]]) -> np.ndarray:
    return np.frombuffer(json.dumps(items, ensure_ascii=False).encode(), np.uint8)


# ---------------------------------------------------------------- running the workers

def _mp_context() -> mp.context.BaseContext:
    # fork: workers start instantly and inherit the imported modules. Safe because the
    # parent runs no torch ops before forking here and each worker caps torch at one
    # thread first thing (the same recipe torch's DataLoader relies on).
    return mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")


def run_extraction(tasks: list[dict[str, Any]], workers: int, progress: bool, n_total: int,
                   extract: Any = None) -> None:
    """Extract every task (a chunk: see ``extract_chunk``) on ``workers`` processes (1: in
    this process, on one thread), with a progress bar over all ``n_total`` utterances.
    ``extract``: the module-level function that does one task (default ``extract_chunk``;
    another kind of store passes its own), returning ``{"n", "audio_s", ...}``."""
    extract = extract_chunk if extract is None else extract
    n_todo = sum(len(t["utterances"]) for t in tasks)
    if not tasks:
        return
    workers = min(workers, len(tasks))
    pool = None
    if workers > 1:
        import myxtts.audio.mel  # noqa: F401  (deferred: torch, once, before forking)

        pool = _mp_context().Pool(workers, initializer=_worker_init, initargs=(os.getpid(),))
        results = pool.imap_unordered(extract, tasks)
    else:
        import torch  # deferred: only when there is work (module doc)

        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # "1 worker" means one core, here too
        results = map(extract, tasks)
    bar = tqdm(total=n_total, initial=n_total - n_todo, unit="clip", desc="prepare",
               disable=not progress, dynamic_ncols=True, smoothing=0.1)
    start, audio_s = time.perf_counter(), 0.0
    try:
        for r in results:
            audio_s += r["audio_s"]
            bar.update(r["n"])
            elapsed = max(time.perf_counter() - start, 1e-9)
            bar.set_postfix_str(f"{audio_s / 3600 / elapsed:.3f} audio-h/s", refresh=False)
    finally:
        bar.close()
        if pool is not None:
            pool.terminate()
            pool.join()
        else:
            torch.set_num_threads(threads)

