"""The prepared feature store's on-disk format: file names, dtypes, the manifest.

The store is one concern in five modules: this one defines the format, ``writer`` writes
it, ``reader`` maps it for training, ``verify`` checks it, ``audio`` holds the rules of the
optional waveforms. A format change edits here, the writer and the reader together and
raises ``FORMAT_VERSION``, unless it only adds optional files a reader can tell are absent
(the audio files, outside ``INDEX_DTYPE``: older stores stay readable). The layout is in
docs/data-and-store.md. Why one raw float16 file of log-mels per split: an utterance is a
slice of a memmap (two look-ups and a view, no decode), the page cache is shared by all
loader workers, and nothing is unpickled. Waveforms are int16: half of float32, and the
resolution vocoders train at.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from myxtts.audio.io import PCM16_SCALE
from myxtts.system import LOCK_FILE as LOCK_FILE  # prepare holds it (system.folder_lock)

if TYPE_CHECKING:
    from myxtts.config import Config

FORMAT_VERSION = 1
SPLITS = ("train", "val")  # every dataset, plan and store has these two splits, in this order
MANIFEST = "manifest.json"
PARTIAL_MARKER = ".partial"
WORK_DIR = ".work"
VOCAB = "vocab.json"
REPORT = "report.json"
FINITE_CHECK = "finite_check"  # manifest key: the non-finite check's result (store.finite)
MEL_FILE, TOKENS_FILE, INDEX_FILE, REFS_FILE, IDS_FILE = (
    "mel.f16", "tokens.i32", "index.npy", "refs.npy", "ids.json")
SPLIT_FILES = (MEL_FILE, TOKENS_FILE, INDEX_FILE, REFS_FILE, IDS_FILE)
AUDIO_FILE, AUDIO_INDEX_FILE = "audio.i16", "audio_index.npy"
AUDIO_FILES = (AUDIO_FILE, AUDIO_INDEX_FILE)  # per split, only in stores with store_audio
CODES_FILE = "codes.i16"  # an XTTS store's DVAE codes per split (``data.xtts_store``)
AUDIO_DTYPE = np.dtype("<i2")
AUDIO_INDEX_DTYPE = np.dtype("<i8")  # audio_index.npy: [N, 2] = (offset, length) in samples
AUDIO_SCALE = PCM16_SCALE  # float sample x is stored as clip(round(x * AUDIO_SCALE))
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


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def store_checksum(manifest: dict[str, Any]) -> str:
    """The sha256 of the manifest's file table (every file's path, size and sha256): one
    value that changes whenever any file of the store is rewritten and re-hashed, so a
    result recorded under it belongs to exactly these files (``store.finite``)."""
    files = manifest.get("files", {})
    blob = json.dumps(files, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


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
    files = manifest.get("files", {})
    if not isinstance(files, dict):
        raise StoreError(f"{path / MANIFEST}: 'files' is not a JSON object; re-run prepare with "
                         f"--force")
    for rel in files:
        if not inside(path, rel):
            raise StoreError(f"{path / MANIFEST}: lists {rel!r}, a path outside the store; "
                             f"a manifest names only the store's own files (re-run prepare "
                             f"with --force)")
    return manifest


def inside(store: Path, rel: str) -> bool:
    """Whether the manifest path ``rel`` names a file inside ``store`` (relative, no ``..``,
    and not led out by a symlink)."""
    if not isinstance(rel, str) or not rel or Path(rel).is_absolute() or ".." in Path(rel).parts:
        return False
    root = Path(store).resolve()
    return (root / rel).resolve().is_relative_to(root)


MIN_MEL_STD = 1e-2  # floor of the per-band std (log-mel units): a constant band must not divide by 0


def mel_mean_std(mel_sum: np.ndarray, mel_sq_sum: np.ndarray, n_frames: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Per-band mean and std (float64 [n_mels]) from sums over ``n_frames`` frames, the std
    floored at ``MIN_MEL_STD``. Sums in float64: over millions of frames float32 would lose
    the small variance of quiet bands."""
    n = max(int(n_frames), 1)
    mean = np.asarray(mel_sum, np.float64) / n
    var = np.maximum(np.asarray(mel_sq_sum, np.float64) / n - mean**2, 0.0)
    return mean, np.maximum(np.sqrt(var), MIN_MEL_STD)
