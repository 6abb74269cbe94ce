"""``myxtts prepare DATA --out STORE --xtts XTTS_DIR``: a dataset -> what XTTS-v2's GPT trains
on (``format``), once, in parallel, resumable after a kill and byte-identical either way.

The machinery is ``data.prepare``'s: the dataset readers and their split, the state of
``--out`` (complete, interrupted, another store: ``check_state``), the lock, the plan file
and fixed chunks (``settle_plan``, ``chunks``), worker processes (``run_extraction``) and
``data.store``'s atomic, hashed writer. What is XTTS's: the vocabulary and tokens
(``plan``), the chunk (``extract``: codes and 22050 Hz audio) and the files packed here.
The codec (the DVAE) comes from a higher layer as ``factory(source)``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from myxtts.config import Config
from myxtts.data.prepare import chunks
from myxtts.data.prepare.build import (
    PrepareResult,
    begin_work,
    check_state,
    extract_and_pack,
    settle_plan,
)
from myxtts.data.prepare.plan import Planned
from myxtts.data.prepare.readers import read_dataset
from myxtts.data.prepare.records import SPLITS, first_per_reason
from myxtts.data.prepare.report import count_reasons, format_counts, report_blob
from myxtts.data.store.format import (
    AUDIO_FILE,
    CODES_FILE,
    FORMAT_VERSION,
    IDS_FILE,
    INDEX_FILE,
    LOCK_FILE,
    MANIFEST,
    PARTIAL_MARKER,
    REPORT,
    TOKEN_DTYPE,
    TOKENS_FILE,
    VOCAB,
    WORK_DIR,
    StoreError,
    diff_sections,
    sha256_file,
)
from myxtts.data.store.writer import StoreWriter, npy_bytes
from myxtts.data.xtts_store.extract import extract_xtts_chunk, read_xtts_chunk, xtts_chunk_ok
from myxtts.data.xtts_store.format import (
    DVAE_FILE,
    INDEX_DTYPE,
    KIND,
    MAX_SAMPLES,
    MAX_TEXT_TOKENS,
    MEL_STATS_FILE,
    MIN_SAMPLES,
    SAMPLE_RATE,
)
from myxtts.data.xtts_store.plan import plan_tokens, store_vocab
from myxtts.system import atomic_open, atomic_write, available_cpus
from myxtts.text.xtts_v2 import XttsTokenizer

_DATA_KEYS = ("format", "val_fraction", "min_val_utterances", "split_seed")


def prepare_xtts_store(data: str | Path, out: str | Path, cfg: Config, source: str | Path,
                       factory: Callable[[str], Any], *, tensors: dict[str, str] | None = None,
                       workers: int | None = None, force: bool = False, progress: bool = True,
                       chunk_size: int | None = None, echo: Any = print) -> PrepareResult:
    """Build (or resume, or confirm) the XTTS store of ``data`` at ``out`` for the XTTS-v2
    folder ``source``. ``factory(str(source))`` -> codec: ``codec(audio [S] float32 tensor
    at 22050 Hz) -> codes [C]``, built once per worker process (a module-level function:
    workers receive it by name). ``tensors``: ``{"dvae": sha256, "mel_stats": sha256}`` of
    the loaded tensors (``format.tensor_sha256``), recorded for ``check_model`` of a model
    held in memory. Errors as ``data.prepare.build.prepare_store``'s."""
    workers = available_cpus() if workers is None else int(workers)
    if workers < 1:
        raise ValueError(f"workers must be >= 1 (got {workers}); use --workers N with N >= 1")
    data, out, source = (Path(data).expanduser().resolve(), Path(out).expanduser(),
                         Path(source).expanduser().resolve())
    model = {"base_vocab_sha256": sha256_file(source / VOCAB),
             "dvae_sha256": sha256_file(source / DVAE_FILE),
             "mel_stats_sha256": sha256_file(source / MEL_STATS_FILE)}
    key = {"source": str(data), "xtts": model, "text": dataclasses.asdict(cfg.text),
           "data": {k: getattr(cfg.data, k) for k in _DATA_KEYS},
           "limits": {"min_samples": MIN_SAMPLES, "max_samples": MAX_SAMPLES,
                      "max_text_tokens": MAX_TEXT_TOKENS}}
    wipe = check_state(out, data, key, force, _diff_keys, echo)
    if isinstance(wipe, PrepareResult):  # complete and current: nothing to do
        return wipe
    splits = read_dataset(data, cfg)  # may raise DatasetError
    base_text = (source / VOCAB).read_text(encoding="utf-8")
    languages = list(cfg.text.languages)
    vocab_text, added = store_vocab(base_text, source / VOCAB, languages, splits)
    vocab_blob = (source / VOCAB).read_bytes() if not added and vocab_text == base_text \
        else vocab_text.encode("utf-8")
    tokenizer = XttsTokenizer(source / VOCAB, vocab_blob.decode("utf-8"))
    planned, rejections = plan_tokens(splits, tokenizer, vocab_blob.decode("utf-8"), languages,
                                      MAX_TEXT_TOKENS)
    lock = begin_work(out, wipe)  # noqa: F841  (held until this function returns)
    work = out / WORK_DIR
    if not any(planned[s] for s in SPLITS):
        atomic_write(out / REPORT, report_blob(rejections, splits.report, []))
        raise StoreError(f"{data}: every utterance was rejected before audio was read "
                         f"({format_counts(count_reasons(rejections))}); see {out / REPORT}")
    chunk_size = settle_plan(out, key, planned, chunk_size)
    created = json.loads((work / "plan.json").read_text(encoding="utf-8"))["created"]
    tasks, resumed = [], 0
    for split, k, utts in chunks.split_into_chunks(planned, chunk_size):
        path = chunks.chunk_path(work, split, k)
        if path.exists():
            if xtts_chunk_ok(path, len(utts)):
                resumed += 1
                continue
            path.unlink()  # damaged (OS crash mid-run): extract it again
        tasks.append({"path": str(path), "factory": factory, "source": str(source),
                      "utterances": [(u.id, u.audio_path) for u in utts]})
    n_total = sum(len(v) for v in planned.values())
    identity = {**{k: model[k] for k in ("base_vocab_sha256", "dvae_sha256", "mel_stats_sha256")},
                "vocab_sha256": hashlib.sha256(vocab_blob).hexdigest(),
                "languages": languages, "number_text_tokens": tokenizer.n_tokens}
    manifest = {"kind": KIND, "identity": identity, "tensors": dict(tensors or {}),
                "added_languages": added, "prepare": key, "created": created,
                "sample_rate": SAMPLE_RATE, "limits": key["limits"]}
    return extract_and_pack(out, tasks, resumed, workers, progress, n_total, echo, lambda: _pack(
        out, planned, chunk_size, rejections, splits.report, vocab_blob, manifest),
        extract=extract_xtts_chunk)


def _diff_keys(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    diffs = []
    if old.get("source") != new.get("source"):
        diffs.append(f"data: store {old.get('source')!r}, now {new.get('source')!r}")
    sections = ("xtts", "text", "data", "limits")
    diffs += diff_sections({k: old.get(k) or {} for k in sections},
                           {k: new.get(k) or {} for k in sections})
    return diffs or ["store written by another myxtts version"]


class XttsStoreWriter(StoreWriter):
    """``data.store``'s writer (atomic, hashed files) with an XTTS store's splits and
    manifest (no mels, so no finite check of them)."""

    def write_xtts_split(self, split: str, rows: list[tuple[Planned, np.ndarray, np.ndarray]],
                         languages: list[str]) -> dict[str, Any]:
        """``rows``: (utterance, int16 codes, int16 audio) in store order."""
        index = np.zeros(len(rows), INDEX_DTYPE)
        speaker_index = {s: i for i, s in enumerate(self.speakers)}
        for name, lengths in (("token", [len(u.tokens) for u, _, _ in rows]),
                              ("code", [len(c) for _, c, _ in rows]),
                              ("audio", [len(a) for _, _, a in rows])):
            lengths = np.asarray(lengths, np.int64)
            index[f"{name}_length"] = lengths
            index[f"{name}_offset"] = np.concatenate([[0], np.cumsum(lengths)[:-1]]) if len(rows) else []
        index["speaker_id"] = [speaker_index[u.speaker] for u, _, _ in rows]
        index["language_id"] = [languages.index(u.language) for u, _, _ in rows]
        tokens = np.fromiter((t for u, _, _ in rows for t in u.tokens), TOKEN_DTYPE)
        self._hashed_file(f"{split}/{TOKENS_FILE}", [tokens])
        self._hashed_file(f"{split}/{CODES_FILE}", (c for _, c, _ in rows))
        self._hashed_file(f"{split}/{AUDIO_FILE}", (a for _, _, a in rows))
        self.write_file(f"{split}/{INDEX_FILE}", npy_bytes(index))
        ids = {"ids": [u.id for u, _, _ in rows], "speakers": self.speakers}
        self.write_file(f"{split}/{IDS_FILE}", json.dumps(ids, ensure_ascii=False, indent=0).encode())
        per_speaker: dict[str, dict[str, float]] = {}
        for (u, _, audio) in rows:
            entry = per_speaker.setdefault(u.speaker, {"utterances": 0, "hours": 0.0})
            entry["utterances"] += 1
            entry["hours"] += len(audio) / SAMPLE_RATE / 3600.0
        return {"utterances": len(rows), "tokens": int(index["token_length"].sum()),
                "codes": int(index["code_length"].sum()),
                "audio_samples": int(index["audio_length"].sum()),
                "hours": float(index["audio_length"].sum()) / SAMPLE_RATE / 3600.0,
                "speakers": {s: {"utterances": int(v["utterances"]), "hours": round(v["hours"], 6)}
                             for s, v in sorted(per_speaker.items())}}

    def finish(self, manifest: dict[str, Any]) -> None:
        """``manifest.json``, last and atomically: from now on the store is complete."""
        full = {"format_version": FORMAT_VERSION, **manifest, "files": dict(sorted(self.files.items()))}
        with atomic_open(self.out / MANIFEST) as fh:
            fh.write((json.dumps(full, indent=1, ensure_ascii=False) + "\n").encode())


def _pack(out: Path, planned: dict[str, list[Planned]], chunk_size: int,
          text_rejections: list[dict[str, Any]], dataset_report: Any, vocab_blob: bytes,
          manifest: dict[str, Any]) -> PrepareResult:
    """Committed chunks -> the store's files, manifest last; the work folder goes."""
    work = out / WORK_DIR
    kept: dict[str, list[tuple[Planned, np.ndarray, np.ndarray]]] = {s: [] for s in SPLITS}
    rejections = list(text_rejections)
    for split, k, utts in chunks.split_into_chunks(planned, chunk_size):
        chunk = read_xtts_chunk(chunks.chunk_path(work, split, k), len(utts))
        rejections += [{"split": split, **r} for r in chunk["rejections"]]
        code_at = np.concatenate([[0], np.cumsum(chunk["n_codes"])]).astype(np.int64)
        audio_at = np.concatenate([[0], np.cumsum(chunk["n_samples"])]).astype(np.int64)
        for j, u in enumerate(utts):
            if chunk["n_codes"][j] > 0:
                kept[split].append((u, chunk["codes"][code_at[j]:code_at[j + 1]],
                                    chunk["audio"][audio_at[j]:audio_at[j + 1]]))
    if not kept["train"]:
        atomic_write(out / REPORT, report_blob(rejections, dataset_report, []))
        raise StoreError(f"{out}: every training utterance was rejected "
                         f"({format_counts(count_reasons(rejections))}); see {out / REPORT}")
    speakers = sorted({u.speaker for s in SPLITS for u, _, _ in kept[s]})
    writer = XttsStoreWriter(out, speakers, 0)
    languages = manifest["identity"]["languages"]
    stats = {s: writer.write_xtts_split(s, kept[s], languages) for s in SPLITS}
    writer.write_file(VOCAB, vocab_blob)
    writer.write_file(REPORT, report_blob(rejections, dataset_report, []))
    counts = count_reasons(rejections)
    writer.finish({**manifest, "speakers": speakers, "splits": stats,
                   "rejected": {"total": len(rejections), "by_reason": counts}})
    (out / PARTIAL_MARKER).unlink(missing_ok=True)
    shutil.rmtree(work, ignore_errors=True)
    (out / LOCK_FILE).unlink(missing_ok=True)
    result = PrepareResult(out, kept={s: stats[s]["utterances"] for s in SPLITS},
                           rejected=counts, hours={s: stats[s]["hours"] for s in SPLITS})
    n_kept = sum(result.kept.values())
    lines = [f"prepared {out} for XTTS-v2: kept {n_kept} of {n_kept + len(rejections)} "
             f"utterances, rejected {len(rejections)}"
             + (f" ({format_counts(counts)})" if rejections else "")]
    lines += [f"    {r['reason']}: {r['audio_path']} [{r['id']}] {r.get('detail', '')}".rstrip()
              for r in first_per_reason(rejections)]
    lines += [f"  {s:<5} {stats[s]['utterances']:>7} utterances  {stats[s]['hours']:8.3f} h  "
              f"{stats[s]['codes']:>9} codes  {len(stats[s]['speakers'])} speakers" for s in SPLITS]
    if manifest["added_languages"]:
        lines.append(f"  vocabulary grown by {', '.join(manifest['added_languages'])} "
                     f"({manifest['identity']['number_text_tokens']} text tokens): "
                     f"{out / VOCAB}")
    if rejections:
        lines.append(f"  rejected utterances, with reasons: {out / REPORT}")
    result.summary = "\n".join(lines)
    return result
