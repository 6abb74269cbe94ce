"""Writing a complete store: the split files, vocabulary and report, then the manifest.

Why one writer object: every file's size and sha256 go into the manifest, which is
written last and atomically -- its presence is what makes a store complete (see
``store.format``). The writer records each file as it writes it, so nothing is hashed
twice and no file can be forgotten in the manifest. Every file goes through
``system.atomic_open`` (temp file + fsync + rename): a kill at any instant leaves whole
files or none, and prepare's resume rewrites whatever is missing.

Why bytes are deterministic: the same rows give the same bytes (``.npy`` without
timestamps, JSON with sorted keys where order is free), so an interrupted and resumed
prepare produces the exact store of an uninterrupted one (same sha256 in the manifest).
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from myxtts.data.store import format as fmt
from myxtts.data.store.audio import audio_index
from myxtts.data.store.finite import finite_record, has_nonfinite, nonfinite_rows
from myxtts.data.store.format import StoreError
from myxtts.system import atomic_open


@dataclass
class SplitRows:
    """One split's utterances, in store order (what ``index.npy`` and ``ids.json`` hold)."""

    ids: list[str]
    speakers: list[str]  # speaker name per utterance
    language_ids: np.ndarray  # int [N]
    tokens: list[Sequence[int]]  # [N] token id sequences
    mel_lengths: np.ndarray  # int [N] frames
    durations_s: list[float]  # [N] seconds after trimming
    refs: np.ndarray  # int32 [N, refs_per_utterance], -1 = unused slot

    def __len__(self) -> int:
        return len(self.ids)


def npy_bytes(array: np.ndarray) -> bytes:
    """``.npy`` serialisation (no pickle, deterministic bytes for the same array)."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def _offsets(lengths: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)[:-1]]) if len(lengths) else lengths


class StoreWriter:
    """Writes one store into ``out``: ``write_split`` per split, ``write_file`` for the
    vocabulary and report, ``finish`` last. ``speakers``: every speaker name of the store,
    sorted; an utterance's speaker id is its position in this list."""

    def __init__(self, out: Path, speakers: list[str], n_mels: int) -> None:
        self.out = Path(out)
        self.speakers = list(speakers)
        self.n_mels = int(n_mels)
        self.files: dict[str, dict[str, Any]] = {}  # relative path -> size, sha256
        self.finite_splits: set[str] = set()  # splits whose every mel block was checked finite

    def _hashed_file(self, rel: str, chunks: Iterable[bytes | np.ndarray]) -> int:
        """Write ``chunks`` to ``rel`` atomically, hashing them on the way; returns bytes.
        Streaming matters for ``mel.f16`` and ``audio.i16``: tens of GB never sit in
        memory at once."""
        sha, size = hashlib.sha256(), 0
        with atomic_open(self.out / rel) as fh:
            for chunk in chunks:
                size += _write_hashed(fh, sha, chunk)
        self.files[rel] = {"size": size, "sha256": sha.hexdigest()}
        return size

    def write_file(self, rel: str, blob: bytes) -> None:
        """A small file of the store (``vocab.json``, ``report.json``), recorded for the manifest."""
        self._hashed_file(rel, [blob])

    def write_split(self, split: str, rows: SplitRows, mels: Iterable[np.ndarray]) -> dict[str, Any]:
        """All files of ``split``. ``mels``: the rows' float16 [frames, n_mels] features, in
        row order, in blocks of any size (prepare passes one chunk's clips at a time).
        Returns the split's manifest entry (counts, frames, hours, per-speaker totals)."""
        n = len(rows)
        speaker_index = {s: i for i, s in enumerate(self.speakers)}
        mel_lengths = np.asarray(rows.mel_lengths, np.int64)
        tok_lengths = np.array([len(t) for t in rows.tokens], np.int64)
        index = np.zeros(n, fmt.INDEX_DTYPE)
        index["mel_length"], index["mel_offset"] = mel_lengths, _offsets(mel_lengths)
        index["token_length"], index["token_offset"] = tok_lengths, _offsets(tok_lengths)
        index["speaker_id"] = [speaker_index[s] for s in rows.speakers]
        index["language_id"] = rows.language_ids
        index["duration_s"] = rows.durations_s

        frames = int(mel_lengths.sum())
        written = self._hashed_file(f"{split}/{fmt.MEL_FILE}",
                                    self._checked_mels(split, mels, rows.ids, index["mel_offset"]))
        if written != frames * self.n_mels * fmt.MEL_DTYPE.itemsize:
            raise StoreError(f"{self.out / split / fmt.MEL_FILE}: {written} bytes of features for "
                             f"{frames} indexed frames; delete {self.out} and re-run prepare")
        tokens = np.fromiter((t for seq in rows.tokens for t in seq), fmt.TOKEN_DTYPE,
                             int(tok_lengths.sum()))
        self._hashed_file(f"{split}/{fmt.TOKENS_FILE}", [tokens])
        ids = {"ids": list(rows.ids), "speakers": self.speakers}
        for name, blob in ((fmt.INDEX_FILE, npy_bytes(index)),
                           (fmt.REFS_FILE, npy_bytes(np.asarray(rows.refs, np.int32))),
                           (fmt.IDS_FILE, json.dumps(ids, ensure_ascii=False, indent=0).encode())):
            self.write_file(f"{split}/{name}", blob)

        per_speaker: dict[str, dict[str, float]] = {}
        for speaker, d in zip(rows.speakers, rows.durations_s):
            entry = per_speaker.setdefault(speaker, {"utterances": 0, "hours": 0.0})
            entry["utterances"] += 1
            entry["hours"] += d / 3600.0
        return {"utterances": n, "frames": frames, "tokens": int(tok_lengths.sum()),
                "hours": float(sum(rows.durations_s) / 3600.0),
                "speakers": {s: {"utterances": int(v["utterances"]), "hours": round(v["hours"], 6)}
                             for s, v in sorted(per_speaker.items())}}

    def write_audio(self, split: str, n_samples: np.ndarray, blocks: Iterable[np.ndarray]
                    ) -> dict[str, Any]:
        """``audio.i16`` and ``audio_index.npy`` of ``split`` (stores with audio only).
        ``n_samples``: samples per utterance in store order; ``blocks``: their int16
        waveforms in the same order, in blocks of any size (prepare passes one chunk's
        clips at a time, so the split's audio -- ~3x its mels -- is never in memory at
        once). Returns the split's manifest additions."""
        n_samples = np.asarray(n_samples, np.int64)
        total = int(n_samples.sum())
        rel = f"{split}/{fmt.AUDIO_FILE}"
        written = self._hashed_file(rel, self._checked_audio(split, blocks))
        if written != total * fmt.AUDIO_DTYPE.itemsize:
            raise StoreError(f"{self.out / rel}: {written} bytes of audio for {total} indexed "
                             f"samples; delete {self.out} and re-run prepare")
        self.write_file(f"{split}/{fmt.AUDIO_INDEX_FILE}",
                        npy_bytes(audio_index(n_samples).astype(fmt.AUDIO_INDEX_DTYPE)))
        return {"audio_samples": total}

    def _checked_audio(self, split: str, blocks: Iterable[np.ndarray]) -> Iterable[np.ndarray]:
        for block in blocks:
            if block.dtype != fmt.AUDIO_DTYPE or block.ndim != 1:
                raise StoreError(f"{split}: audio of dtype {block.dtype} and shape "
                                 f"{tuple(block.shape)}, the store holds {fmt.AUDIO_DTYPE} [samples]")
            yield block

    def _checked_mels(self, split: str, mels: Iterable[np.ndarray], ids: list[str],
                      offsets: np.ndarray) -> Iterable[np.ndarray]:
        """``mels`` as they are written, each block checked for its layout and for NaN or
        infinity (a few ms per 10 MB, beside hashing it): the check ``finish`` records."""
        frame = 0
        for mel in mels:
            if mel.dtype != fmt.MEL_DTYPE or mel.ndim != 2 or mel.shape[1] != self.n_mels:
                raise StoreError(f"{split}: features of dtype {mel.dtype} and shape "
                                 f"{tuple(mel.shape)}, the store holds {fmt.MEL_DTYPE} [frames, "
                                 f"{self.n_mels}]")
            if has_nonfinite(mel):
                first = frame + int(nonfinite_rows(mel)[0])
                i = int(np.searchsorted(offsets, first, side="right") - 1)
                raise StoreError(f"{self.out / split / fmt.MEL_FILE}: utterance {ids[i]} has NaN or "
                                 f"infinite features as they are packed (a damaged prepare work "
                                 f"chunk); re-run the same prepare command, which extracts that "
                                 f"chunk again")
            frame += len(mel)
            yield mel
        self.finite_splits.add(split)

    def finish(self, manifest: dict[str, Any]) -> None:
        """Write ``manifest.json`` (``manifest`` plus the format version, the table of every
        file written and the finite check of its mels, ``store.finite``), atomically and
        last: from now on the store is complete."""
        full = {"format_version": fmt.FORMAT_VERSION, **manifest, "files": dict(sorted(self.files.items()))}
        mel_splits = {rel.split("/")[0] for rel in self.files if rel.endswith(f"/{fmt.MEL_FILE}")}
        if mel_splits <= self.finite_splits:  # every mel byte written was checked: train trusts it
            full[fmt.FINITE_CHECK] = finite_record(full, "prepare")
        with atomic_open(self.out / fmt.MANIFEST) as fh:
            fh.write((json.dumps(full, indent=1, ensure_ascii=False) + "\n").encode())


def _write_hashed(fh: BinaryIO, sha: Any, data: bytes | np.ndarray) -> int:
    """Write ``data`` and feed it to ``sha``; returns the number of bytes."""
    if isinstance(data, np.ndarray):
        data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)  # also fine when empty
    buf = memoryview(data)
    fh.write(buf)
    sha.update(buf)
    return buf.nbytes
