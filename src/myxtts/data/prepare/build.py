"""``myxtts prepare``: a raw dataset in any layout -> a packed feature store, in parallel,
resumable after a kill at any instant, byte-identical whether interrupted or not.

Stages: ``data.prepare.plan.plan_texts`` (list, clean, tokenize, reject; no audio opened), then
``data.prepare.chunks`` (fixed chunks per split, extracted by worker processes and committed one
file each; complete chunks are skipped on resume), then packing (``_pack`` here,
``data.store.writer``: chunks concatenated in plan order, references drawn, statistics
summed, ``manifest.json`` written last, atomically). Why every step is deterministic
(reader order, sorted vocabulary, seeded references, statistics added in chunk order,
``.npy`` without timestamps): a resumed run must produce exactly the bytes of an
uninterrupted one (same sha256 in the manifest).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from myxtts.config import Config
from myxtts.data.prepare import chunks
from myxtts.data.prepare.plan import Planned, choose_refs, plan_texts
from myxtts.data.prepare.records import SPLITS
from myxtts.data.prepare.report import count_reasons, format_counts, report_blob, summary_lines
from myxtts.data.store.audio import format_size
from myxtts.data.store.format import (
    AUDIO_FILE,
    LOCK_FILE,
    PARTIAL_MARKER,
    REPORT,
    VOCAB,
    WORK_DIR,
    StoreError,
    config_sections,
    diff_sections,
    mel_mean_std,
    read_manifest,
    store_state,
)
from myxtts.data.store.wipe import check_removable, remove_store
from myxtts.data.store.writer import SplitRows, StoreWriter
from myxtts.system import FolderError, atomic_write, available_cpus, folder_lock, writable_folder

PREPARE_DATA_KEYS = ("format", "val_fraction", "min_val_utterances", "split_seed",
                     "min_duration_s", "max_duration_s", "max_text_tokens", "refs_per_utterance",
                     "store_audio")


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


# ---------------------------------------------------------------- keys

def prepare_key(data: Path, cfg: Config) -> dict[str, Any]:
    """Everything that determines the store's bytes: the source, the feature sections and
    the data keys that select/split/reject utterances or add audio. Equal keys -> identical
    store."""
    sections = config_sections(cfg)
    data_keys = {k: getattr(cfg.data, k) for k in PREPARE_DATA_KEYS}
    # store_audio enters the key only when true: a store without audio has one key whether
    # or not its manifest names store_audio, so it stays current (no --force).
    if not data_keys["store_audio"]:
        del data_keys["store_audio"]
    return {"source": str(Path(data).expanduser().resolve()), "feature_hash": cfg.feature_hash(),
            "audio": sections["audio"], "text": sections["text"], "data": data_keys}


def _diff_keys(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    diffs: list[str] = []
    if old.get("source") != new.get("source"):
        diffs.append(f"data: store {old.get('source')!r}, now {new.get('source')!r}")
    old, new = ({k: dict(key.get(k) or {}) for k in ("audio", "text", "data")} for key in (old, new))
    for key in (old, new):  # absent = false (see prepare_key): say so, not '<absent>'
        key["data"].setdefault("store_audio", False)
    diffs += diff_sections(old, new)
    return diffs or ["store written by another myxtts version"]


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
    created = not Path(out).expanduser().exists() and not Path(out).expanduser().is_symlink()
    try:
        return _prepare(data, out, cfg, workers, force, progress, chunk_size, echo)
    except BaseException:
        if created:  # a failed prepare leaves no empty folder of its own behind
            try:
                Path(out).expanduser().rmdir()
            except OSError:
                pass  # not empty (a report, resumable chunks) or never made
        raise


def _prepare(data: str | Path, out: str | Path, cfg: Config, workers: int, force: bool,
             progress: bool, chunk_size: int | None, echo: Any) -> PrepareResult:
    # Absolute data path: audio paths in the plan then do not depend on the working directory.
    data, out = Path(data).expanduser().resolve(), Path(out).expanduser()
    key = prepare_key(data, cfg)
    wipe = check_state(out, data, key, force, _diff_keys, echo)
    if isinstance(wipe, PrepareResult):
        return wipe
    planned, tokenizer, rejections, dataset_report = plan_texts(data, cfg)  # may raise DatasetError
    lock = begin_work(out, wipe)  # noqa: F841  (held until this function returns or the process dies)
    work = out / WORK_DIR
    n_total = sum(len(v) for v in planned.values())
    if n_total == 0:
        atomic_write(out / REPORT, report_blob(rejections, dataset_report, []))
        raise StoreError(f"{data}: every utterance was rejected before audio was read "
                         f"({format_counts(count_reasons(rejections))}); see {out / REPORT}")
    chunk_size = settle_plan(out, key, planned, chunk_size)
    plan_meta = json.loads((work / "plan.json").read_text(encoding="utf-8"))
    tasks = []
    resumed = 0
    for split, k, utts in chunks.split_into_chunks(planned, chunk_size):
        path = chunks.chunk_path(work, split, k)
        if path.exists():
            if chunks.chunk_ok(path, len(utts), cfg.audio.n_mels,
                               cfg.audio if cfg.data.store_audio else None):
                resumed += 1
                continue
            path.unlink()  # damaged (OS crash mid-run): extract it again
        tasks.append({"path": str(path), "split": split, "chunk": k, "audio": key["audio"],
                      "min_duration_s": cfg.data.min_duration_s,
                      "max_duration_s": cfg.data.max_duration_s,
                      "store_audio": cfg.data.store_audio,
                      "utterances": [(u.id, u.audio_path) for u in utts]})
    return extract_and_pack(out, tasks, resumed, workers, progress, n_total, echo, lambda: _pack(
        out, data, cfg, key, planned, tokenizer, rejections, dataset_report, chunk_size,
        plan_meta["created"]))


def extract_and_pack(out: Path, tasks: list[dict[str, Any]], resumed: int, workers: int,
                     progress: bool, n_total: int, echo: Any, pack: Any,
                     extract: Any = None) -> PrepareResult:
    """Extract the chunks still to do (``chunks.run_extraction`` with ``extract``), then
    ``pack()`` them into the store; a failed write keeps the finished chunks for the re-run."""
    if resumed:
        echo(f"resuming: {resumed} of {resumed + len(tasks)} chunks already done")
    try:
        chunks.run_extraction(tasks, workers, progress, n_total, extract)
        result = pack()
    except OSError as e:  # disk full, permissions, ...: finished chunks are kept
        raise StoreError(f"{out}: cannot write the store ({e}); fix the cause and re-run the same "
                         f"command to resume") from e
    result.resumed_chunks = resumed
    echo(result.summary)
    return result


def check_state(out: Path, data: Path, key: dict[str, Any], force: bool, diff_keys: Any,
                echo: Any) -> bool | PrepareResult:
    """What ``--out`` holds decides the run: a complete store of ``key`` is a no-op (the
    PrepareResult), another store or an interrupted one of other settings is refused
    without ``force`` (``diff_keys(old, new)`` names what differs); returns whether the
    store must be wiped once the dataset was read. Shared by every kind of store."""
    if not out.is_file():  # a file there is refused below, by store_state
        try:
            writable_folder(out, "--out")
        except FolderError as e:
            raise StoreError(str(e)) from None
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
        if manifest is not None and manifest.get("prepare") == key and not force:
            shutil.rmtree(out / WORK_DIR, ignore_errors=True)
            msg = (f"{out}: already prepared from {data} with this config; nothing to do "
                   f"(--force rebuilds it)")
            echo(msg)
            return PrepareResult(out, noop=True, summary=msg)
        if not force:
            diffs = diff_keys((manifest or {}).get("prepare") or {}, key)
            raise StoreError(f"{out} was prepared with other settings ({'; '.join(diffs)}); pass "
                             f"--force to rebuild it, or choose another --out")
        check_removable(out)
        return True
    if state == "partial":
        saved = read_plan_file(out)
        if saved is not None and saved.get("key") != key:
            if not force:
                diffs = diff_keys(saved.get("key") or {}, key)
                raise StoreError(f"{out} holds an interrupted prepare with other settings "
                                 f"({'; '.join(diffs)}); re-run that command to finish it, or pass "
                                 f"--force to start over")
            check_removable(out)
            return True
    return False


def begin_work(out: Path, wipe: bool) -> Any:
    """Lock ``out`` (the returned object holds it), wipe the old store where ``check_state``
    said so, mark the store partial and make its work folder."""
    out.mkdir(parents=True, exist_ok=True)
    lock = _lock(out)
    if wipe:
        remove_store(out)
    if not (out / PARTIAL_MARKER).exists():
        atomic_write(out / PARTIAL_MARKER, "a myxtts prepare is writing this store; re-run "
                          "the same command to resume it\n")
    (out / WORK_DIR / "chunks").mkdir(parents=True, exist_ok=True)
    _remove_temp_files(out)
    return lock


def _lock(out: Path) -> Any:
    """Exclusive lock (``system.folder_lock`` on ``STORE/.lock``, removed on success): two
    prepares writing one store would interleave chunks. Held until the returned object is
    dropped (when ``prepare_store`` returns) or the process dies, even by SIGKILL."""
    hold = folder_lock(out, "myxtts prepare")
    try:
        hold.__enter__()
    except FolderError as e:
        raise StoreError(str(e)) from None
    return hold


def _remove_temp_files(out: Path) -> None:
    """Temp files of atomic writes interrupted by a kill (never part of a finished store)."""
    for folder in (out, *(out / s for s in SPLITS), out / WORK_DIR, out / WORK_DIR / "chunks"):
        if folder.is_dir():
            for f in folder.glob(".*.tmp"):
                f.unlink(missing_ok=True)


def read_plan_file(out: Path) -> dict[str, Any] | None:
    try:
        return json.loads((out / WORK_DIR / "plan.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def settle_plan(out: Path, key: dict[str, Any], planned: dict[str, list[Planned]],
                 chunk_size: int | None) -> int:
    """Reuse the interrupted run's chunking, or start a new plan (dropping stale chunks)."""
    work = out / WORK_DIR
    saved = read_plan_file(out)
    if saved is not None:
        size = int(saved["chunk_size"])
        if saved.get("plan_hash") == chunks.plan_hash(key, size, planned):
            return size
        # Same settings but the dataset changed since the interruption: old chunks may hold
        # other clips, so they cannot be trusted.
        shutil.rmtree(work / "chunks", ignore_errors=True)
        (work / "chunks").mkdir(parents=True, exist_ok=True)
    n_total = sum(len(v) for v in planned.values())
    size = int(chunk_size) if chunk_size else chunks.default_chunk_size(n_total)
    meta = {"key": key, "chunk_size": size, "plan_hash": chunks.plan_hash(key, size, planned),
            "created": datetime.now(timezone.utc).replace(microsecond=0).isoformat()}
    atomic_write(work / "plan.json", json.dumps(meta, indent=1, ensure_ascii=False))
    return size


# ---------------------------------------------------------------- packing

def _pack(out: Path, data: Path, cfg: Config, key: dict[str, Any],
          planned: dict[str, list[Planned]], tokenizer: Any, text_rejections: list[dict[str, str]],
          dataset_report: Any, chunk_size: int, created: str) -> PrepareResult:
    """Committed chunks -> the store's files (``data.store.writer``), manifest last."""
    work = out / WORK_DIR
    n_mels = cfg.audio.n_mels
    # Pass 1 over the chunk summaries (no mels): which clips were kept, lengths, durations,
    # audio rejections, and the training split's mel statistics in chunk order.
    summaries: dict[str, list[tuple[Path, dict[str, Any], list[Planned]]]] = {s: [] for s in SPLITS}
    rejections, fixes = list(text_rejections), []
    mel_sum, mel_sq_sum = np.zeros(n_mels, np.float64), np.zeros(n_mels, np.float64)
    for split, k, utts in chunks.split_into_chunks(planned, chunk_size):
        path = chunks.chunk_path(work, split, k)
        summary = chunks.read_chunk_summary(path, len(utts))
        rejections += [{"split": split, **r} for r in summary["rejections"]]
        fixes += [{"split": split, **f} for f in summary["fixes"]]
        if split == "train":
            mel_sum += summary["mel_sum"]
            mel_sq_sum += summary["mel_sq_sum"]
        summaries[split].append((path, summary, utts))
    kept = {s: [(u, int(f), float(d)) for _, summary, utts in summaries[s]
                for u, f, d in zip(utts, summary["n_frames"], summary["duration_s"]) if f > 0]
            for s in SPLITS}
    if not kept["train"]:
        atomic_write(out / REPORT, report_blob(rejections, dataset_report, fixes))
        n_all = sum(len(v) for v in planned.values()) + len(text_rejections)
        what = "every utterance was" if not kept["val"] else "every training utterance was"
        raise StoreError(f"{data}: {what} rejected ({n_all} in total; "
                         f"{format_counts(count_reasons(rejections))}); see {out / REPORT} and check "
                         f"data.min_duration_s/max_duration_s and the audio files")

    speakers = sorted({u.speaker for s in SPLITS for u, _, _ in kept[s]})
    speaker_index = {s: i for i, s in enumerate(speakers)}
    writer = StoreWriter(out, speakers, n_mels)
    split_stats: dict[str, Any] = {}
    for split_no, split in enumerate(SPLITS):
        rows = kept[split]
        speaker_ids = np.array([speaker_index[u.speaker] for u, _, _ in rows], np.int64)
        content = SplitRows(
            ids=[u.id for u, _, _ in rows], speakers=[u.speaker for u, _, _ in rows],
            language_ids=np.array([tokenizer.language_id(u.language) for u, _, _ in rows], np.int64),
            tokens=[u.tokens for u, _, _ in rows],
            mel_lengths=np.array([f for _, f, _ in rows], np.int64),
            durations_s=[d for _, _, d in rows],
            refs=choose_refs(speaker_ids, cfg.data.refs_per_utterance, [cfg.data.split_seed, split_no]))
        mels = (chunks.read_chunk_mels(path, int(summary["n_frames"].sum()), n_mels)
                for path, summary, _ in summaries[split])
        split_stats[split] = writer.write_split(split, content, mels)
        if cfg.data.store_audio:
            split_stats[split].update(_write_audio(writer, split, summaries[split]))
    writer.write_file(VOCAB, tokenizer.to_json().encode())
    writer.write_file(REPORT, report_blob(rejections, dataset_report, fixes))

    n_frames_train = split_stats["train"]["frames"]
    mean, std = mel_mean_std(mel_sum, mel_sq_sum, n_frames_train)
    rejected_counts = count_reasons(rejections)
    writer.finish({
        "feature_hash": cfg.feature_hash(),
        "audio": key["audio"],
        "text": key["text"],
        "prepare": key,
        "created": created,
        "languages": tokenizer.languages,
        "vocab_size": tokenizer.vocab_size,
        "speakers": speakers,
        "refs_per_utterance": cfg.data.refs_per_utterance,
        "store_audio": cfg.data.store_audio,
        "splits": split_stats,
        "rejected": {"total": len(rejections), "by_reason": rejected_counts},
        "mel_stats": {"frames": n_frames_train, "mean": [float(x) for x in mean],
                      "std": [float(x) for x in std]},
    })
    (out / PARTIAL_MARKER).unlink(missing_ok=True)
    shutil.rmtree(work, ignore_errors=True)
    (out / LOCK_FILE).unlink(missing_ok=True)

    result = PrepareResult(out, kept={s: split_stats[s]["utterances"] for s in SPLITS},
                           rejected=rejected_counts,
                           hours={s: split_stats[s]["hours"] for s in SPLITS})
    result.summary = summary_lines(out, split_stats, rejected_counts, dataset_report, speakers,
                                   rejections, fixes)
    if cfg.data.store_audio:
        n_bytes = sum(writer.files[f"{s}/{AUDIO_FILE}"]["size"] for s in SPLITS)
        result.summary += f"\n  audio: {format_size(n_bytes)} int16 kept for vocoder training"
    return result


def _write_audio(writer: StoreWriter, split: str,
                 summaries: list[tuple[Path, dict[str, Any], list[Planned]]]) -> dict[str, Any]:
    """The split's audio files from its chunks, one chunk's clips in memory at a time."""
    n_samples = [summary["n_samples"][summary["n_frames"] > 0] for _, summary, _ in summaries]
    blocks = (chunks.read_chunk_audio(path, int(summary["n_samples"].sum()))
              for path, summary, _ in summaries)
    return writer.write_audio(split, np.concatenate([np.zeros(0, np.int64), *n_samples]), blocks)
