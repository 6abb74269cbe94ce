"""``myxtts prepare``: a raw dataset in any layout -> a packed feature store, in parallel,
resumable after a kill at any instant, byte-identical whether interrupted or not.

Pipeline (main process unless noted):

1. ``read_dataset`` lists utterances (no audio opened); ``clean_text`` each transcript;
   the vocabulary is built from the cleaned train+val texts; texts that end up empty,
   in an unknown language or longer than ``data.max_text_tokens`` are rejected.
2. Planning: the surviving utterances, in reader order, are cut into fixed chunks per
   split (``chunk_size`` depends only on the dataset size, so the assignment is the same
   on every run). The plan's hash goes to ``STORE/.work/plan.json``.
3. Extraction (worker processes, ``--workers``): a chunk's clips are loaded, trimmed,
   checked against ``data.min/max_duration_s`` (rejected, never truncated) and turned
   into float16 log-mels by ``MelSpectrogram`` (the one feature definition). Each chunk
   is committed as ONE file with an atomic rename into ``STORE/.work/chunks/``; complete
   chunks already there are skipped, which is the whole resume mechanism (chunks are not
   fsync'd: see ``_write_chunk``).
4. Packing: chunks are concatenated in plan order into the split files, reference clips
   are drawn (seeded), mel statistics are summed (float64, fixed order), and
   ``manifest.json`` is written LAST, atomically; then ``.partial`` and ``.work`` go.

Why chunks and not one file per clip: a million tiny files is slow on every file
system, and why not one running file: appending is not atomic. A chunk is either fully
there or absent, so a SIGKILL loses at most the chunks in flight.

Why every step is deterministic (reader order, sorted vocabulary, seeded references,
per-chunk statistics added in chunk order, ``.npy`` without timestamps): a resumed run
must produce exactly the bytes of an uninterrupted one (same sha256 in the manifest).
"""

from __future__ import annotations

import ctypes
import hashlib
import io
import json
import multiprocessing as mp
import os
import shutil
import signal
import sys
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from myxtts.config import Config
from myxtts.data.store import (
    FORMAT_VERSION,
    IDS_FILE,
    INDEX_DTYPE,
    INDEX_FILE,
    LOCK_FILE,
    MANIFEST,
    MEL_DTYPE,
    MEL_FILE,
    PARTIAL_MARKER,
    REFS_FILE,
    REPORT,
    SPLITS,
    TOKEN_DTYPE,
    TOKENS_FILE,
    VOCAB,
    WORK_DIR,
    StoreError,
    atomic_stream,
    config_sections,
    diff_sections,
    npy_bytes,
    read_manifest,
    sha256_file,
    store_state,
    write_hashed,
)
from myxtts.utils import atomic_write_bytes, atomic_write_text, available_cpus

# Testing hooks (environment, so a `python -m myxtts ...` subprocess picks them up):
# a fixed chunk size lets a test land a kill mid-run; the delay (seconds, after every
# committed chunk and every packed file) makes the kill's timing deterministic.
CHUNK_SIZE_ENV = "MYXTTS_PREPARE_CHUNK_SIZE"
TEST_DELAY_ENV = "MYXTTS_PREPARE_TEST_DELAY_S"

MAX_CHUNK_SIZE = 256  # utterances per chunk on big datasets (~2.5 min of work per 256 x 6 s)
MIN_CHUNK_SIZE = 8
TARGET_CHUNKS = 64  # small datasets still get enough chunks to keep every worker busy
MIN_MEL_STD = 1e-2  # floor of the per-band std (log-mel units): a constant band must not divide by 0

# Rejection reasons (short, stable; counted in report.json). Shared ones come from records.
SILENT_AUDIO = "silent audio"
TOO_MANY_TOKENS = "too many tokens"
PREPARE_DATA_KEYS = ("format", "val_fraction", "min_val_utterances", "split_seed",
                     "min_duration_s", "max_duration_s", "max_text_tokens", "refs_per_utterance")


@dataclass
class PrepareResult:
    """What ``prepare_store`` did. ``noop``: the store was already complete and current."""

    path: Path
    noop: bool = False
    kept: dict[str, int] = field(default_factory=dict)
    rejected: dict[str, int] = field(default_factory=dict)  # reason -> count
    hours: dict[str, float] = field(default_factory=dict)
    resumed_chunks: int = 0
    summary: str = ""


@dataclass(frozen=True)
class Planned:
    """An utterance that survived reading and the text checks."""

    id: str
    audio_path: str
    speaker: str
    language: str
    tokens: tuple[int, ...]


# ---------------------------------------------------------------- keys and plans

def prepare_key(data: Path, cfg: Config) -> dict[str, Any]:
    """Everything that determines the store's bytes: the source, the feature sections and
    the data keys that select/split/reject utterances. Equal keys -> identical store."""
    sections = config_sections(cfg)
    return {"source": str(Path(data).expanduser().resolve()), "feature_hash": cfg.feature_hash(),
            "audio": sections["audio"], "text": sections["text"],
            "data": {k: getattr(cfg.data, k) for k in PREPARE_DATA_KEYS}}


def _diff_keys(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    diffs: list[str] = []
    if old.get("source") != new.get("source"):
        diffs.append(f"data: store {old.get('source')!r}, now {new.get('source')!r}")
    diffs += diff_sections({k: old.get(k) or {} for k in ("audio", "text", "data")},
                           {k: new.get(k) or {} for k in ("audio", "text", "data")})
    return diffs or ["store written by another myxtts version"]


def default_chunk_size(n_utterances: int) -> int:
    """Chunk size from the dataset size only (never from --workers): a resumed run with
    another worker count must find the same chunks."""
    env = os.environ.get(CHUNK_SIZE_ENV)
    if env:
        return max(1, int(env))
    return int(min(MAX_CHUNK_SIZE, max(MIN_CHUNK_SIZE, -(-n_utterances // TARGET_CHUNKS))))


def _plan_hash(key: dict[str, Any], chunk_size: int, planned: dict[str, list[Planned]]) -> str:
    # The same dicts ``dataclasses.asdict`` gives, built directly: asdict deep-copies every
    # token tuple and was a measurable share of a small prepare.
    splits = {s: [{"id": u.id, "audio_path": u.audio_path, "speaker": u.speaker,
                   "language": u.language, "tokens": list(u.tokens)} for u in planned[s]]
              for s in SPLITS}
    blob = json.dumps({"key": key, "chunk_size": chunk_size, "splits": splits},
                      sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def _chunks(planned: dict[str, list[Planned]], chunk_size: int) -> list[tuple[str, int, list[Planned]]]:
    out = []
    for split in SPLITS:
        utts = planned[split]
        for k in range(0, len(utts), chunk_size):
            out.append((split, k // chunk_size, utts[k:k + chunk_size]))
    return out


def _chunk_path(work: Path, split: str, k: int) -> Path:
    return work / "chunks" / f"{split}-{k:06d}.npz"


def _write_chunk(path: str | Path, data: bytes) -> None:
    """Commit a chunk: temp file + rename, WITHOUT fsync.

    The rename alone makes it all-or-nothing against a kill at any instant (the page
    cache outlives the process), which is what resume is for. fsync only adds safety
    against an OS crash or power loss, and chunks do not need it: they are a cache that
    ``_pack`` turns into fsync'd store files, and ``_chunk_ok`` sends a chunk damaged by
    such a crash (typically renamed but empty) back to extraction. The fsync, plus the
    slower unlink of fsync'd files when ``.work`` goes, was measured at ~1/6 of a small
    prepare's wall time.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _chunk_ok(path: Path, n_utterances: int, n_mels: int) -> bool:
    """True when a chunk left by an earlier run is complete: every array reads back (zip
    CRCs checked) and its shapes fit the plan. Anything else is extracted again."""
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {name: z[name] for name in z.files}
        n_frames, mel = arrays["n_frames"], arrays["mel"]
        return (len(n_frames) == n_utterances and mel.dtype == MEL_DTYPE
                and mel.shape == (int(n_frames.sum()), n_mels)
                and all(k in arrays for k in ("duration_s", "mel_sum", "mel_sq_sum", "rejections")))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return False


def _test_delay() -> None:
    delay = float(os.environ.get(TEST_DELAY_ENV) or 0)
    if delay > 0:
        time.sleep(delay)


# ---------------------------------------------------------------- worker side

_WORKER_STATE: dict[str, Any] = {}


def _limit_threads() -> None:
    """One BLAS/OpenMP thread per process: N workers on N cores, not N x N threads."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS"):
        os.environ[var] = "1"
    import torch

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
    _limit_threads()


def _classify_audio_error(message: str) -> str:
    from myxtts.data.records import UNREADABLE_AUDIO, WRONG_SAMPLE_RATE

    low = message.lower()
    if "silent" in low or "nothing left after silence trimming" in low:
        return SILENT_AUDIO
    if "resampling is off" in low:
        return WRONG_SAMPLE_RATE
    return UNREADABLE_AUDIO


def extract_chunk(task: dict[str, Any]) -> dict[str, Any]:
    """Worker: load + check + featurise one chunk, commit it atomically, return counts.

    The chunk file (``.npz``, no pickle) holds ``mel`` float16 [frames of kept clips,
    n_mels], ``n_frames`` int32 [n] (0 = rejected), ``duration_s`` float32 [n],
    ``mel_sum`` / ``mel_sq_sum`` float64 [n_mels] over the kept frames (as stored, i.e.
    after float16 rounding) and ``rejections`` (UTF-8 JSON as uint8).
    """
    import torch

    from myxtts.audio.io import AudioError, load_audio
    from myxtts.audio.mel import MelSpectrogram
    from myxtts.config import AudioConfig
    from myxtts.data.records import TOO_LONG, TOO_SHORT

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
    rejections: list[dict[str, str]] = []
    mel_sum = np.zeros(audio_cfg.n_mels, np.float64)
    mel_sq_sum = np.zeros(audio_cfg.n_mels, np.float64)
    audio_s = 0.0
    for j, (uid, path) in enumerate(task["utterances"]):
        try:
            wav = load_audio(path, audio_cfg)  # float32 [samples]
        except AudioError as e:
            rejections.append({"id": uid, "audio_path": path, "reason": _classify_audio_error(str(e)),
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
        # gives the same features but was measured 1.3-4x slower on CPU (the per-clip
        # reflect padding copies and the bigger working set cost more than the calls saved).
        wav = np.require(wav, np.float32, ["C", "W"])
        with torch.no_grad():
            log_mel, _ = module(torch.from_numpy(wav))  # [T, n_mels] float32
        # Casts in torch (vectorised; numpy's float16 casts are not). float16 -> float64 is
        # exact, so the statistics are those of the stored values.
        mel16 = log_mel.to(torch.float16)  # [T, n_mels]
        mel64 = mel16.to(torch.float64).numpy()  # [T, n_mels]
        n_frames[j] = mel64.shape[0]
        mel_sum += mel64.sum(axis=0)
        mel_sq_sum += np.square(mel64).sum(axis=0)
        mels.append(mel16.numpy())
    mel = np.concatenate(mels) if mels else np.zeros((0, audio_cfg.n_mels), np.float16)
    buf = io.BytesIO()
    np.savez(buf, mel=mel, n_frames=n_frames, duration_s=durations, mel_sum=mel_sum,
             mel_sq_sum=mel_sq_sum,
             rejections=np.frombuffer(json.dumps(rejections, ensure_ascii=False).encode(), np.uint8))
    _write_chunk(task["path"], buf.getvalue())
    _test_delay()
    return {"n": n, "audio_s": audio_s, "rejected": len(rejections)}


# ---------------------------------------------------------------- main entry

def prepare_store(data: str | Path, out: str | Path, cfg: Config, *, workers: int | None = None,
                  force: bool = False, progress: bool = True, chunk_size: int | None = None,
                  echo: Any = print) -> PrepareResult:
    """Build (or resume, or confirm) the feature store for ``data`` at ``out``.

    ``workers``: extraction processes (default: the CPUs this process may use; 1 runs in
    this process). ``force``: rebuild a store made with other settings. Raises StoreError
    for user-fixable problems (other settings without --force, every clip rejected, a
    non-store folder as --out), DatasetError for unreadable datasets.
    """
    workers = available_cpus() if workers is None else int(workers)
    if workers < 1:
        raise ValueError(f"workers must be >= 1 (got {workers}); use --workers N with N >= 1 "
                         f"(default: {available_cpus()}, the CPUs available)")
    # Absolute data path: audio paths in the plan then do not depend on the working directory.
    data, out = Path(data).expanduser().resolve(), Path(out).expanduser()
    key = prepare_key(data, cfg)
    wipe = False  # decided here, done only after the dataset was read successfully
    state = store_state(out)
    if state == "foreign":
        raise StoreError(f"--out {out} exists and is not a myxtts store; choose a new or empty "
                         f"folder (prepare never deletes files it did not write)")
    if state == "complete":
        try:
            manifest: dict[str, Any] | None = read_manifest(out)
        except StoreError:
            if not force:
                raise
            manifest = None
        if manifest is not None and manifest.get("prepare") == key:
            shutil.rmtree(out / WORK_DIR, ignore_errors=True)
            msg = (f"{out}: already prepared from {data} with this config; nothing to do "
                   f"(--force rebuilds it)")
            echo(msg)
            return PrepareResult(out, noop=True, summary=msg)
        if not force:
            diffs = _diff_keys((manifest or {}).get("prepare") or {}, key)
            raise StoreError(f"{out} was prepared with other settings ({'; '.join(diffs)}); pass "
                             f"--force to rebuild it, or choose another --out")
        wipe = True
    elif state == "partial":
        saved = _read_plan_file(out)
        if saved is not None and saved.get("key") != key:
            if not force:
                diffs = _diff_keys(saved.get("key") or {}, key)
                raise StoreError(f"{out} holds an interrupted prepare with other settings "
                                 f"({'; '.join(diffs)}); re-run that command to finish it, or pass "
                                 f"--force to start over")
            wipe = True

    planned, tokenizer, rejections, dataset_report = plan_texts(data, cfg)  # may raise DatasetError
    out.mkdir(parents=True, exist_ok=True)
    lock = _lock(out)  # noqa: F841  (held until this function returns or the process dies)
    if wipe:
        _remove_store(out)
    if not (out / PARTIAL_MARKER).exists():
        atomic_write_text(out / PARTIAL_MARKER, "a myxtts prepare is writing this store; re-run "
                          "the same command to resume it\n")
    work = out / WORK_DIR
    (work / "chunks").mkdir(parents=True, exist_ok=True)
    _remove_temp_files(out)
    n_total = sum(len(v) for v in planned.values())
    if n_total == 0:
        _write_report(out, rejections, dataset_report)
        raise StoreError(f"{data}: every utterance was rejected before audio was read "
                         f"({_format_counts(_count(rejections))}); see {out / REPORT}")
    chunk_size = _settle_plan(out, key, planned, chunk_size)
    plan_meta = json.loads((work / "plan.json").read_text(encoding="utf-8"))
    tasks = []
    resumed = 0
    for split, k, utts in _chunks(planned, chunk_size):
        path = _chunk_path(work, split, k)
        if path.exists():
            if _chunk_ok(path, len(utts), cfg.audio.n_mels):
                resumed += 1
                continue
            path.unlink()  # damaged (OS crash mid-run): extract it again
        tasks.append({"path": str(path), "split": split, "chunk": k, "audio": key["audio"],
                      "min_duration_s": cfg.data.min_duration_s,
                      "max_duration_s": cfg.data.max_duration_s,
                      "utterances": [(u.id, u.audio_path) for u in utts]})
    if resumed:
        echo(f"resuming: {resumed} of {resumed + len(tasks)} chunks already done")
    try:
        _run_extraction(tasks, workers, progress, n_total)
        result = _pack(out, data, cfg, key, planned, tokenizer, rejections, dataset_report,
                       chunk_size, plan_meta["created"])
    except OSError as e:  # disk full, permissions, ...: finished chunks are kept
        raise StoreError(f"{out}: cannot write the store ({e}); fix the cause and re-run the same "
                         f"command to resume") from e
    result.resumed_chunks = resumed
    echo(result.summary)
    return result


def _lock(out: Path) -> Any:
    """Exclusive lock (``STORE/.lock``, removed on success): two prepares writing one store
    would interleave chunks. The kernel drops it when the process dies, even by SIGKILL."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: no lock
        return None
    fh = open(out / LOCK_FILE, "a+")  # noqa: SIM115 - must stay open while we work
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        raise StoreError(f"{out}: another `myxtts prepare` is writing this store right "
                         f"now; wait for it to finish (or stop it) and re-run") from None
    return fh


def _remove_store(out: Path) -> None:
    """Delete what prepare writes (and nothing else: --out may hold the user's other files)."""
    for name in (MANIFEST, VOCAB, REPORT, PARTIAL_MARKER):
        (out / name).unlink(missing_ok=True)
    for name in (WORK_DIR, *SPLITS):
        shutil.rmtree(out / name, ignore_errors=True)


def _remove_temp_files(out: Path) -> None:
    """Temp files of atomic writes interrupted by a kill (never part of a finished store)."""
    for folder in (out, *(out / s for s in SPLITS), out / WORK_DIR, out / WORK_DIR / "chunks"):
        if folder.is_dir():
            for f in folder.glob(".*.tmp"):
                f.unlink(missing_ok=True)


def _read_plan_file(out: Path) -> dict[str, Any] | None:
    try:
        return json.loads((out / WORK_DIR / "plan.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _settle_plan(out: Path, key: dict[str, Any], planned: dict[str, list[Planned]],
                 chunk_size: int | None) -> int:
    """Reuse the interrupted run's chunking, or start a new plan (dropping stale chunks)."""
    work = out / WORK_DIR
    saved = _read_plan_file(out)
    if saved is not None:
        size = int(saved["chunk_size"])
        if saved.get("plan_hash") == _plan_hash(key, size, planned):
            return size
        # Same settings but the dataset changed since the interruption: old chunks may hold
        # other clips, so they cannot be trusted.
        shutil.rmtree(work / "chunks", ignore_errors=True)
        (work / "chunks").mkdir(parents=True, exist_ok=True)
    n_total = sum(len(v) for v in planned.values())
    size = int(chunk_size) if chunk_size else default_chunk_size(n_total)
    meta = {"key": key, "chunk_size": size, "plan_hash": _plan_hash(key, size, planned),
            "created": datetime.now(timezone.utc).replace(microsecond=0).isoformat()}
    atomic_write_text(work / "plan.json", json.dumps(meta, indent=1, ensure_ascii=False))
    return size


def plan_texts(data: Path, cfg: Config, tokenizer: Any = None):
    """Read the dataset, clean and tokenize every transcript; reject bad texts.

    Returns ``(planned {split: [Planned]}, tokenizer, rejections, reader report)``. The
    vocabulary is built from the cleaned train+val texts unless ``tokenizer`` is given.
    """
    from myxtts.data.readers import read_dataset
    from myxtts.data.records import EMPTY_TEXT, UNKNOWN_LANGUAGE
    from myxtts.text import Tokenizer, clean_text

    splits = read_dataset(data, cfg)
    rejections: list[dict[str, str]] = []
    cleaned: dict[str, list[tuple[Any, str]]] = {s: [] for s in SPLITS}
    languages = tokenizer.languages if tokenizer is not None else cfg.text.languages
    for split, utts in (("train", splits.train), ("val", splits.val)):
        for u in utts:
            base = {"split": split, "id": u.id, "audio_path": str(u.audio_path)}
            if u.language not in languages:
                rejections.append({**base, "reason": UNKNOWN_LANGUAGE,
                                   "detail": f"language {u.language!r} is not in text.languages "
                                             f"{languages}; add it with --set "
                                             f"text.languages=[...]"})
                continue
            text = clean_text(u.text, u.language, cfg.text)
            if not text.strip():
                rejections.append({**base, "reason": EMPTY_TEXT,
                                   "detail": f"transcript {u.text!r} is empty after cleaning"})
                continue
            cleaned[split].append((u, text))
    if tokenizer is None:
        tokenizer = Tokenizer.build([t for s in SPLITS for _, t in cleaned[s]], cfg.text.languages)
    planned: dict[str, list[Planned]] = {s: [] for s in SPLITS}
    for split in SPLITS:
        for u, text in cleaned[split]:
            ids = tokenizer.encode(text, u.language)
            if len(ids) > cfg.data.max_text_tokens:
                rejections.append({"split": split, "id": u.id, "audio_path": str(u.audio_path),
                                   "reason": TOO_MANY_TOKENS,
                                   "detail": f"{len(ids)} tokens > data.max_text_tokens "
                                             f"{cfg.data.max_text_tokens}"})
                continue
            planned[split].append(Planned(u.id, str(u.audio_path), u.speaker, u.language,
                                           tuple(ids)))
    return planned, tokenizer, rejections, splits.report


def _mp_context() -> mp.context.BaseContext:
    # fork: workers start instantly and inherit the imported modules. Safe because the
    # parent runs no torch ops before forking here and each worker caps torch at one
    # thread first thing (the same recipe torch's DataLoader relies on).
    return mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")


def _run_extraction(tasks: list[dict[str, Any]], workers: int, progress: bool, n_total: int) -> None:
    from tqdm import tqdm

    n_todo = sum(len(t["utterances"]) for t in tasks)
    if not tasks:
        return
    workers = min(workers, len(tasks))
    pool = None
    if workers > 1:
        import myxtts.audio.mel  # noqa: F401  (import torch once, before forking)

        pool = _mp_context().Pool(workers, initializer=_worker_init, initargs=(os.getpid(),))
        results = pool.imap_unordered(extract_chunk, tasks)
    else:
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # "1 worker" means one core, here too
        results = map(extract_chunk, tasks)
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


# ---------------------------------------------------------------- packing

def choose_refs(speaker_ids: np.ndarray, refs_per_utterance: int, seed: list[int]) -> np.ndarray:
    """int32 [N, refs_per_utterance] reference indices, -1 = unused slot.

    Up to ``refs_per_utterance`` OTHER utterances of the same speaker, drawn without
    replacement from ``default_rng(seed)``; a speaker with a single clip references itself
    (cloning from the target itself is better than no reference at all).
    """
    n = len(speaker_ids)
    refs = np.full((n, refs_per_utterance), -1, np.int32)
    rng = np.random.default_rng(seed)
    order = np.argsort(speaker_ids, kind="stable")
    bounds = np.flatnonzero(np.diff(speaker_ids[order])) + 1
    for members in np.split(order, bounds):
        m = len(members)
        if m == 0:
            continue
        if m == 1:
            refs[members[0], 0] = members[0]
            continue
        k = min(refs_per_utterance, m - 1)
        for j, i in enumerate(members):
            pick = rng.choice(m - 1, size=k, replace=False)  # positions among the others
            refs[i, :k] = members[pick + (pick >= j)]  # skip position j (the utterance itself)
    return refs


def _count(rejections: list[dict[str, str]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in rejections:
        counts[r["reason"]] = counts.get(r["reason"], 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _format_counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{reason}: {n}" for reason, n in counts.items()) or "none"


def _write_report(out: Path, rejections: list[dict[str, str]], dataset_report: Any) -> bytes:
    report = {"rejected": rejections, "counts_by_reason": _count(rejections),
              "dataset_problems": [asdict(p) for p in dataset_report.problems],
              "dataset_problem_counts": dataset_report.counts_by_reason()}
    blob = (json.dumps(report, indent=1, ensure_ascii=False) + "\n").encode()
    atomic_write_bytes(out / REPORT, blob)
    return blob


def _pack(out: Path, data: Path, cfg: Config, key: dict[str, Any],
          planned: dict[str, list[Planned]], tokenizer: Any, text_rejections: list[dict[str, str]],
          dataset_report: Any, chunk_size: int, created: str) -> PrepareResult:
    work = out / WORK_DIR
    n_mels = cfg.audio.n_mels
    chunks = _chunks(planned, chunk_size)
    # Pass 1 (metadata only; NpzFile loads arrays lazily): which clips were kept, lengths,
    # durations, statistics, audio rejections.
    meta: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    rejections = list(text_rejections)
    for split, k, utts in chunks:
        path = _chunk_path(work, split, k)
        with np.load(path, allow_pickle=False) as z:
            info = {"path": path, "n_frames": z["n_frames"], "duration_s": z["duration_s"],
                    "mel_sum": z["mel_sum"], "mel_sq_sum": z["mel_sq_sum"]}
            for r in json.loads(z["rejections"].tobytes().decode()):
                rejections.append({"split": split, **r})
        if len(info["n_frames"]) != len(utts):
            raise StoreError(f"{path}: holds {len(info['n_frames'])} clips, the plan {len(utts)}; "
                             f"delete {work} and re-run prepare")
        info["utts"] = utts
        meta[split].append(info)
    kept = {s: [(u, int(f), float(d)) for info in meta[s]
                for u, f, d in zip(info["utts"], info["n_frames"], info["duration_s"]) if f > 0]
            for s in SPLITS}
    if not kept["train"]:
        _write_report(out, rejections, dataset_report)
        n_all = sum(len(v) for v in planned.values()) + len(text_rejections)
        what = "every utterance was" if not kept["val"] else "every training utterance was"
        raise StoreError(f"{data}: {what} rejected ({n_all} in total; "
                         f"{_format_counts(_count(rejections))}); see {out / REPORT} and check "
                         f"data.min_duration_s/max_duration_s and the audio files")

    speakers = sorted({u.speaker for s in SPLITS for u, _, _ in kept[s]})
    speaker_index = {s: i for i, s in enumerate(speakers)}
    files: dict[str, dict[str, Any]] = {}

    def record(rel: str, size: int, sha: str) -> None:
        files[rel] = {"size": size, "sha256": sha}

    split_stats: dict[str, Any] = {}
    mel_sum = np.zeros(n_mels, np.float64)
    mel_sq_sum = np.zeros(n_mels, np.float64)
    for split_no, split in enumerate(SPLITS):
        rows = kept[split]
        n = len(rows)
        split_dir = out / split
        split_dir.mkdir(parents=True, exist_ok=True)
        index = np.zeros(n, INDEX_DTYPE)
        mel_lengths = np.array([f for _, f, _ in rows], np.int64)
        tok_lengths = np.array([len(u.tokens) for u, _, _ in rows], np.int64)
        index["mel_length"] = mel_lengths
        index["mel_offset"] = np.concatenate([[0], np.cumsum(mel_lengths)[:-1]]) if n else []
        index["token_length"] = tok_lengths
        index["token_offset"] = np.concatenate([[0], np.cumsum(tok_lengths)[:-1]]) if n else []
        index["speaker_id"] = [speaker_index[u.speaker] for u, _, _ in rows]
        index["language_id"] = [tokenizer.language_id(u.language) for u, _, _ in rows]
        index["duration_s"] = [d for _, _, d in rows]

        with atomic_stream(split_dir / MEL_FILE) as (fh, sha):
            size = 0
            for info in meta[split]:
                with np.load(info["path"], allow_pickle=False) as z:
                    mel = z["mel"]
                if mel.dtype != MEL_DTYPE or mel.ndim != 2 or mel.shape[1] != n_mels \
                        or mel.shape[0] != int(info["n_frames"].sum()):
                    raise StoreError(f"{info['path']}: damaged chunk; delete {work} and re-run prepare")
                size += write_hashed(fh, sha, mel)
                if split == "train":
                    mel_sum += info["mel_sum"]
                    mel_sq_sum += info["mel_sq_sum"]
        record(f"{split}/{MEL_FILE}", size, sha.hexdigest())
        _test_delay()
        with atomic_stream(split_dir / TOKENS_FILE) as (fh, sha):
            tokens = np.fromiter((t for u, _, _ in rows for t in u.tokens), TOKEN_DTYPE,
                                 int(tok_lengths.sum()))
            record(f"{split}/{TOKENS_FILE}", write_hashed(fh, sha, tokens), sha.hexdigest())
        refs = choose_refs(index["speaker_id"].astype(np.int64), cfg.data.refs_per_utterance,
                           [cfg.data.split_seed, split_no])
        ids_blob = json.dumps({"ids": [u.id for u, _, _ in rows], "speakers": speakers},
                              ensure_ascii=False, indent=0).encode()
        for name, blob in ((INDEX_FILE, npy_bytes(index)), (REFS_FILE, npy_bytes(refs)),
                           (IDS_FILE, ids_blob)):
            atomic_write_bytes(split_dir / name, blob)
            record(f"{split}/{name}", len(blob), hashlib.sha256(blob).hexdigest())
        per_speaker: dict[str, dict[str, float]] = {}
        for u, _, d in rows:
            entry = per_speaker.setdefault(u.speaker, {"utterances": 0, "hours": 0.0})
            entry["utterances"] += 1
            entry["hours"] += d / 3600.0
        split_stats[split] = {
            "utterances": n, "frames": int(mel_lengths.sum()), "tokens": int(tok_lengths.sum()),
            "hours": float(sum(d for _, _, d in rows) / 3600.0),
            "speakers": {s: {"utterances": int(v["utterances"]), "hours": round(v["hours"], 6)}
                         for s, v in sorted(per_speaker.items())}}
        _test_delay()

    tokenizer.save(out / VOCAB)
    record(VOCAB, (out / VOCAB).stat().st_size, sha256_file(out / VOCAB))
    blob = _write_report(out, rejections, dataset_report)
    record(REPORT, len(blob), hashlib.sha256(blob).hexdigest())

    n_frames_train = split_stats["train"]["frames"]
    mean = mel_sum / n_frames_train
    std = np.sqrt(np.maximum(mel_sq_sum / n_frames_train - mean**2, 0.0))
    std = np.maximum(std, MIN_MEL_STD)
    rejected_counts = _count(rejections)
    manifest = {
        "format_version": FORMAT_VERSION,
        "feature_hash": cfg.feature_hash(),
        "audio": key["audio"],
        "text": key["text"],
        "prepare": key,
        "created": created,
        "languages": tokenizer.languages,
        "vocab_size": tokenizer.vocab_size,
        "speakers": speakers,
        "refs_per_utterance": cfg.data.refs_per_utterance,
        "splits": split_stats,
        "rejected": {"total": len(rejections), "by_reason": rejected_counts},
        "mel_stats": {"frames": n_frames_train, "mean": [float(x) for x in mean],
                      "std": [float(x) for x in std]},
        "files": dict(sorted(files.items())),
    }
    atomic_write_text(out / MANIFEST, json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    _make_readable(out, [MANIFEST, *files])
    (out / PARTIAL_MARKER).unlink(missing_ok=True)
    shutil.rmtree(work, ignore_errors=True)
    (out / LOCK_FILE).unlink(missing_ok=True)

    result = PrepareResult(out, kept={s: split_stats[s]["utterances"] for s in SPLITS},
                           rejected=rejected_counts,
                           hours={s: split_stats[s]["hours"] for s in SPLITS})
    result.summary = _summary(out, split_stats, rejected_counts, dataset_report, speakers)
    return result


def _make_readable(out: Path, names: list[str]) -> None:
    """Atomic writes go through ``mkstemp`` (mode 0600); a store is shared data, so give its
    files the usual mode (0666 minus the umask), like a plainly created file."""
    umask = os.umask(0)
    os.umask(umask)
    for name in names:
        os.chmod(out / name, 0o666 & ~umask)


def _summary(out: Path, split_stats: dict[str, Any], rejected: dict[str, int],
             dataset_report: Any, speakers: list[str], max_speakers: int = 20) -> str:
    kept = sum(split_stats[s]["utterances"] for s in SPLITS)
    n_rej = sum(rejected.values())
    lines = [f"prepared {out}: kept {kept} of {kept + n_rej} utterances, rejected {n_rej}"
             + (f" ({_format_counts(rejected)})" if n_rej else "")]
    if len(dataset_report):
        lines.append(f"  dataset rows skipped by the reader: {len(dataset_report)} "
                     f"({_format_counts(dataset_report.counts_by_reason())})")
    for s in SPLITS:
        st = split_stats[s]
        lines.append(f"  {s:<5} {st['utterances']:>7} utterances  {st['hours']:8.3f} h  "
                     f"{st['frames']:>10} frames  {len(st['speakers'])} speakers")
    lines.append(f"  hours per speaker (train + val), {len(speakers)} speakers:")
    totals = {sp: sum(split_stats[s]["speakers"].get(sp, {}).get("hours", 0.0) for s in SPLITS)
              for sp in speakers}
    ranked = sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))
    for sp, h in ranked[:max_speakers]:
        lines.append(f"    {sp:<24} {h:8.3f} h")
    if len(ranked) > max_speakers:
        lines.append(f"    ... and {len(ranked) - max_speakers} more (see {out / MANIFEST})")
    if n_rej:
        lines.append(f"  rejected utterances and reasons: {out / REPORT}")
    return "\n".join(lines)
