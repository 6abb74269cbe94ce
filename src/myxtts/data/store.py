"""The prepared feature store: a few large, memory-mapped files per split.

Why this layout (and not one file per utterance, HDF5 or a pickle): training reads
every utterance every epoch, in random order, from several worker processes. With the
whole split's log-mels in ONE raw float16 file, an utterance is a slice of a memmap:
``mel(i)`` is two integer look-ups and a view (O(1), zero-copy, no file open, no
decode), the OS page cache shares the pages between all workers, and nothing needs
unpickling. Raw binaries plus ``.npy``/JSON side files are readable from any language
and never execute code when loaded.

Layout (``FORMAT_VERSION`` 1)::

    STORE/
      manifest.json    written LAST (atomic): format version, feature hash, the audio and
                       text config sections, per-split counts/frames/hours, mel stats,
                       sha256 + size of every other file. Its presence means "complete".
      vocab.json       the Tokenizer (ids are baked into tokens.i32)
      report.json      every rejected utterance with its reason
      train/ val/
        mel.f16        float16 [total_frames, n_mels], utterances back to back
        tokens.i32     int32 [total_tokens], utterances back to back
        index.npy      structured [N] (INDEX_DTYPE): offsets/lengths into the two files,
                       speaker_id, language_id, duration_s
        refs.npy       int32 [N, refs_per_utterance]: indices (same split, same speaker)
                       of reference utterances, -1 = unused slot
        ids.json       {"ids": [N utterance ids], "speakers": [all speaker names]}

While ``myxtts prepare`` runs, ``STORE/.partial`` exists; ``STORE/.work/`` holds its
committed chunks (see ``myxtts.data.prepare``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

if TYPE_CHECKING:
    from myxtts.config import Config
    from myxtts.text.tokenizer import Tokenizer

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
PARTIAL_MARKER = ".partial"
WORK_DIR = ".work"
LOCK_FILE = ".lock"
VOCAB = "vocab.json"
REPORT = "report.json"
SPLITS = ("train", "val")
MEL_FILE, TOKENS_FILE, INDEX_FILE, REFS_FILE, IDS_FILE = (
    "mel.f16", "tokens.i32", "index.npy", "refs.npy", "ids.json")
SPLIT_FILES = (MEL_FILE, TOKENS_FILE, INDEX_FILE, REFS_FILE, IDS_FILE)
MEL_DTYPE = np.dtype("<f2")
TOKEN_DTYPE = np.dtype("<i4")
INDEX_DTYPE = np.dtype([
    ("mel_offset", "<i8"),  # first frame in mel.f16
    ("mel_length", "<i4"),  # frames
    ("token_offset", "<i8"),  # first token in tokens.i32
    ("token_length", "<i4"),  # tokens incl. BOS/<lang>/EOS
    ("speaker_id", "<i4"),  # index into the store's speakers list
    ("language_id", "<i4"),  # index into the tokenizer's languages
    ("duration_s", "<f4"),  # seconds of audio after trimming
])
_HASH_CHUNK = 1 << 22


class StoreError(ValueError):
    """The store is missing, incomplete, damaged, or was built for other features."""


# ---------------------------------------------------------------- writing helpers

@contextmanager
def atomic_stream(path: Path) -> Iterator[tuple[BinaryIO, Any]]:
    """Write a (possibly huge) file through a temp file + fsync + rename, hashing as it goes.

    Yields ``(file, sha256)``; the caller writes bytes and may ``sha256.update`` them (we do
    it for the caller via ``write_hashed``). Why stream: mel.f16 can be tens of GB, so the
    bytes-in-memory ``atomic_write_bytes`` does not fit, and hashing while writing saves a
    second read of the file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh, hashlib.sha256()
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_hashed(fh: BinaryIO, sha: Any, data: bytes | memoryview | np.ndarray) -> int:
    """Write ``data`` and feed it to ``sha``; returns the number of bytes."""
    if isinstance(data, np.ndarray):
        data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)  # also fine when empty
    buf = memoryview(data)
    fh.write(buf)
    sha.update(buf)
    return buf.nbytes


def npy_bytes(array: np.ndarray) -> bytes:
    """``.npy`` serialisation (no pickle, deterministic bytes for the same array)."""
    import io

    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def config_sections(cfg: Config) -> dict[str, dict[str, Any]]:
    """The config sections that define the features (what ``Config.feature_hash`` covers)."""
    return {"audio": dataclasses.asdict(cfg.audio), "text": dataclasses.asdict(cfg.text)}


def diff_sections(stored: dict[str, dict[str, Any]], wanted: dict[str, dict[str, Any]]) -> list[str]:
    """``["audio.hop_length: store 256, config 200", ...]`` for every differing key."""
    out: list[str] = []
    for section in sorted(set(stored) | set(wanted)):
        a, b = stored.get(section, {}) or {}, wanted.get(section, {}) or {}
        for key in sorted(set(a) | set(b)):
            if a.get(key, "<absent>") != b.get(key, "<absent>"):
                out.append(f"{section}.{key}: store {a.get(key, '<absent>')!r}, "
                           f"config {b.get(key, '<absent>')!r}")
    return out


def store_state(path: Path) -> str:
    """``"missing"``, ``"empty"``, ``"partial"``, ``"complete"`` or ``"foreign"`` (a folder
    with other files that is not a store, which prepare must never delete)."""
    path = Path(path)
    if not path.exists():
        return "missing"
    if not path.is_dir():
        return "foreign"
    if (path / PARTIAL_MARKER).exists() or ((path / WORK_DIR).exists() and not (path / MANIFEST).exists()):
        return "partial"
    if (path / MANIFEST).exists():
        return "complete"
    return "empty" if all(p.name == LOCK_FILE for p in path.iterdir()) else "foreign"


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of a complete store, or a StoreError saying what to do."""
    path = Path(path)
    state = store_state(path)
    if state == "missing":
        raise StoreError(f"{path}: no feature store here; create one with "
                         f"`myxtts prepare DATA --out {path}`")
    if state == "partial":
        raise StoreError(f"{path}: incomplete store (a prepare was interrupted); re-run the same "
                         f"`myxtts prepare ... --out {path}` command to resume it")
    if state != "complete":
        raise StoreError(f"{path}: not a feature store (no {MANIFEST}); create one with "
                         f"`myxtts prepare DATA --out {path}`")
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StoreError(f"{path / MANIFEST}: unreadable ({e}); re-run `myxtts prepare ... "
                         f"--out {path} --force`") from e
    if not isinstance(manifest, dict):
        raise StoreError(f"{path / MANIFEST}: not a JSON object; re-run prepare with --force")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise StoreError(f"{path}: store format version {version} but this myxtts reads version "
                         f"{FORMAT_VERSION}; rebuild it with `myxtts prepare DATA --out {path} --force`")
    return manifest


# ---------------------------------------------------------------- reading

class FeatureStore:
    """Read-only view of one split of a prepared store. Cheap to open, O(1) per utterance.

    Index arrays (lengths, ids, offsets) are loaded into memory (a few bytes per
    utterance); the mel and token files are memory-mapped lazily on first access, and
    a pickled FeatureStore (DataLoader workers with spawn) carries only its path and
    re-maps in the receiving process, so memmaps are never pickled.
    """

    def __init__(self, path: Path, split: str, manifest: dict[str, Any]):
        self.path = Path(path)
        self.split = split
        self.manifest = manifest
        self.n_mels = int(manifest["audio"]["n_mels"])
        self.refs_per_utterance = int(manifest["refs_per_utterance"])
        split_dir = self.path / split
        index_path = split_dir / INDEX_FILE
        try:
            index = np.load(index_path, allow_pickle=False)
            self.ref_table = np.load(split_dir / REFS_FILE, allow_pickle=False)  # [N, R] int32
            ids = json.loads((split_dir / IDS_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise StoreError(f"{split_dir}: cannot read the {split} split ({e}); run "
                             f"`myxtts prepare --verify {self.path}` or rebuild with --force") from e
        if index.dtype != INDEX_DTYPE:
            raise StoreError(f"{index_path}: unexpected index layout {index.dtype}; rebuild the "
                             f"store with `myxtts prepare ... --force`")
        self.index = index
        self.mel_offsets = index["mel_offset"].astype(np.int64)
        self.mel_lengths = index["mel_length"].astype(np.int64)
        self.token_offsets = index["token_offset"].astype(np.int64)
        self.token_lengths = index["token_length"].astype(np.int64)
        self.speaker_ids = index["speaker_id"].astype(np.int64)
        self.language_ids = index["language_id"].astype(np.int64)
        self.durations_s = index["duration_s"].astype(np.float64)
        self.ids: list[str] = list(ids["ids"])
        self.speakers: list[str] = list(ids["speakers"])
        stats = manifest["mel_stats"]
        self.mel_mean = np.asarray(stats["mean"], dtype=np.float32)  # [n_mels]
        self.mel_std = np.asarray(stats["std"], dtype=np.float32)  # [n_mels]
        self.total_frames = int(self.mel_lengths.sum())
        self.total_tokens = int(self.token_lengths.sum())
        if len(self.ids) != len(index) or self.ref_table.shape[0] != len(index):
            raise StoreError(f"{split_dir}: {IDS_FILE}/{REFS_FILE}/{INDEX_FILE} disagree on the "
                             f"number of utterances; rebuild the store with --force")
        self._check_sizes()
        self._mel: np.ndarray | None = None
        self._tokens: np.ndarray | None = None
        self._tokenizer: Tokenizer | None = None

    # -- opening

    @classmethod
    def open(cls, path: str | Path, split: str = "train", cfg: Config | None = None) -> FeatureStore:
        """Open ``split`` of the store at ``path``; with ``cfg``, refuse a store whose features
        differ from what the config asks for (naming the keys and the fix)."""
        path = Path(path)
        if split not in SPLITS:
            raise StoreError(f"unknown split {split!r}; a store has {', '.join(SPLITS)}")
        manifest = read_manifest(path)
        if cfg is not None and manifest.get("feature_hash") != cfg.feature_hash():
            stored = {k: manifest.get(k, {}) for k in ("audio", "text")}
            diffs = diff_sections(stored, config_sections(cfg))
            what = "; ".join(diffs) if diffs else "feature hash differs"
            raise StoreError(
                f"{path} was prepared with other features than this config ({what}); re-run "
                f"`myxtts prepare DATA --out {path} --force` with this config, or use the store's "
                f"values (see the 'audio'/'text' sections of {path / MANIFEST})")
        return cls(path, split, manifest)

    def __getstate__(self) -> dict[str, Any]:
        # Never pickle memmaps (or the arrays): the receiving process re-opens by path.
        return {"path": str(self.path), "split": self.split}

    def __setstate__(self, state: dict[str, Any]) -> None:
        path = Path(state["path"])
        self.__init__(path, state["split"], read_manifest(path))

    def _check_sizes(self) -> None:
        split_dir = self.path / self.split
        for name, expected in ((MEL_FILE, self.total_frames * self.n_mels * MEL_DTYPE.itemsize),
                               (TOKENS_FILE, self.total_tokens * TOKEN_DTYPE.itemsize)):
            f = split_dir / name
            try:
                size = f.stat().st_size
            except FileNotFoundError:
                raise StoreError(f"{f}: missing; the store is damaged, rebuild it with "
                                 f"`myxtts prepare ... --force`") from None
            if size != expected:
                raise StoreError(f"{f}: {size} bytes but the index needs {expected} (truncated or "
                                 f"damaged); rebuild the store with `myxtts prepare ... --force`")

    # -- lazily mapped arrays

    def _map(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        if int(np.prod(shape)) == 0:  # mmap cannot map an empty file
            return np.zeros(shape, dtype=dtype)
        return np.memmap(self.path / self.split / name, dtype=dtype, mode="r", shape=shape)

    @property
    def mel_array(self) -> np.ndarray:
        """The whole split's mels, float16 memmap [total_frames, n_mels]."""
        if self._mel is None:
            self._mel = self._map(MEL_FILE, MEL_DTYPE, (self.total_frames, self.n_mels))
        return self._mel

    @property
    def token_array(self) -> np.ndarray:
        """The whole split's tokens, int32 memmap [total_tokens]."""
        if self._tokens is None:
            self._tokens = self._map(TOKENS_FILE, TOKEN_DTYPE, (self.total_tokens,))
        return self._tokens

    # -- per-utterance access

    def __len__(self) -> int:
        return len(self.ids)

    def mel(self, i: int) -> np.ndarray:
        """float16 [T, n_mels] view into the memmap (zero-copy; do not write to it)."""
        start = int(self.mel_offsets[i])
        return self.mel_array[start:start + int(self.mel_lengths[i])]

    def tokens(self, i: int) -> np.ndarray:
        """int32 [L] view: ``[BOS, <lang>, chars..., EOS]``."""
        start = int(self.token_offsets[i])
        return self.token_array[start:start + int(self.token_lengths[i])]

    def refs(self, i: int) -> np.ndarray:
        """int64 indices (this split) of utterance ``i``'s reference clips, same speaker."""
        row = self.ref_table[i]
        return row[row >= 0].astype(np.int64)

    # -- metadata

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            from myxtts.text.tokenizer import Tokenizer

            self._tokenizer = Tokenizer.load(self.path / VOCAB)
        return self._tokenizer

    @property
    def languages(self) -> list[str]:
        return list(self.manifest["languages"])

    @property
    def feature_hash(self) -> str:
        return str(self.manifest["feature_hash"])

    @property
    def sections(self) -> dict[str, dict[str, Any]]:
        """The ``audio`` and ``text`` config sections the store was prepared with."""
        return {"audio": self.manifest["audio"], "text": self.manifest["text"]}

    def audio_config(self):
        """The store's AudioConfig (to compute features exactly as the store did)."""
        from myxtts.config import AudioConfig

        return AudioConfig(**self.sections["audio"])

    @property
    def hours(self) -> float:
        return float(self.durations_s.sum()) / 3600.0

    def __repr__(self) -> str:
        return (f"FeatureStore({str(self.path)!r}, split={self.split!r}, utterances={len(self)}, "
                f"frames={self.total_frames}, hours={self.hours:.2f})")


# ---------------------------------------------------------------- verification

def verify_store(path: str | Path, check_hashes: bool = True) -> list[str]:
    """Every problem found in the store at ``path`` (empty list = healthy).

    Checks: manifest readable and current; every listed file present with the recorded
    size and sha256 (skipped with ``check_hashes=False``); no unlisted data files; per
    split, offsets contiguous from 0 and within the files, lengths positive, speaker and
    language ids in range, tokens within the vocabulary, references in range, of the same
    speaker, and not the utterance itself unless its speaker has a single clip.
    """
    path = Path(path)
    try:
        manifest = read_manifest(path)
    except StoreError as e:
        return [str(e)]
    problems: list[str] = []
    files: dict[str, dict[str, Any]] = manifest.get("files", {})
    for rel, meta in sorted(files.items()):
        f = path / rel
        if not f.is_file():
            problems.append(f"{f}: missing")
            continue
        size = f.stat().st_size
        if size != meta.get("size"):
            problems.append(f"{f}: {size} bytes, manifest says {meta.get('size')} (truncated or changed)")
            continue
        if check_hashes and sha256_file(f) != meta.get("sha256"):
            problems.append(f"{f}: sha256 differs from the manifest (file corrupted or edited)")
    for split in SPLITS:
        for name in SPLIT_FILES:
            if f"{split}/{name}" not in files:
                problems.append(f"{path / split / name}: not listed in the manifest")
    if problems:
        return problems  # index checks on damaged files would only repeat the cause
    vocab_size = None
    try:
        vocab_size = FeatureStore(path, "train", manifest).tokenizer.vocab_size
    except Exception as e:  # noqa: BLE001 - report, do not crash the verifier
        problems.append(f"{path / VOCAB}: cannot load the vocabulary ({e})")
    for split in SPLITS:
        try:
            store = FeatureStore(path, split, manifest)
        except StoreError as e:
            problems.append(str(e))
            continue
        problems += _check_index(store, vocab_size)
    return problems


def _check_index(store: FeatureStore, vocab_size: int | None) -> list[str]:
    where = f"{store.path / store.split}"
    out: list[str] = []
    n = len(store)
    stats = store.manifest.get("splits", {}).get(store.split, {})
    if stats.get("utterances") != n:
        out.append(f"{where}: {n} utterances but the manifest says {stats.get('utterances')}")
    if n == 0:
        return out
    for name, offsets, lengths in (("mel", store.mel_offsets, store.mel_lengths),
                                   ("token", store.token_offsets, store.token_lengths)):
        if (lengths <= 0).any():
            out.append(f"{where}/{INDEX_FILE}: {int((lengths <= 0).sum())} utterances have "
                       f"{name}_length <= 0")
        expected = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        bad = np.flatnonzero(offsets != expected)
        if len(bad):
            out.append(f"{where}/{INDEX_FILE}: {name}_offset not contiguous/monotone from 0 "
                       f"(first bad utterance {int(bad[0])})")
    if int(store.mel_lengths.sum()) != stats.get("frames"):
        out.append(f"{where}: {int(store.mel_lengths.sum())} frames but the manifest says "
                   f"{stats.get('frames')}")
    n_speakers, n_languages = len(store.speakers), len(store.languages)
    for name, ids, limit in (("speaker_id", store.speaker_ids, n_speakers),
                             ("language_id", store.language_ids, n_languages)):
        if ((ids < 0) | (ids >= limit)).any():
            out.append(f"{where}/{INDEX_FILE}: {name} outside [0, {limit})")
    if vocab_size is not None and store.total_tokens:
        tokens = store.token_array
        if int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size:
            out.append(f"{where}/{TOKENS_FILE}: token ids outside the vocabulary [0, {vocab_size})")
    refs = store.ref_table.astype(np.int64)  # [N, R]
    if refs.ndim != 2 or refs.shape[1] != store.refs_per_utterance:
        out.append(f"{where}/{REFS_FILE}: shape {refs.shape}, expected [{n}, "
                   f"{store.refs_per_utterance}]")
        return out
    valid = refs >= 0
    if ((refs >= n) | (refs < -1)).any():
        return out + [f"{where}/{REFS_FILE}: reference indices outside [0, {n})"]
    if not valid[:, 0].all():
        out.append(f"{where}/{REFS_FILE}: {int((~valid[:, 0]).sum())} utterances have no reference")
    rows = np.broadcast_to(np.arange(n)[:, None], refs.shape)
    safe = np.where(valid, refs, rows)
    spk = store.speaker_ids
    if (spk[safe] != spk[rows]).any():
        out.append(f"{where}/{REFS_FILE}: references to another speaker's utterance")
    clips_per_speaker = np.bincount(spk, minlength=n_speakers)
    self_ref = (valid & (safe == rows)).any(axis=1) & (clips_per_speaker[spk] > 1)
    if self_ref.any():
        out.append(f"{where}/{REFS_FILE}: {int(self_ref.sum())} utterances reference themselves "
                   f"although their speaker has other clips")
    return out
