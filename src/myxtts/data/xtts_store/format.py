"""The XTTS store's on-disk format: what XTTS-v2's GPT trains on, computed once.

Per split (``train/``, ``val/``): ``tokens.i32`` (XTTS text ids, no [START]/[STOP]: the GPT
adds them), ``codes.i16`` (the DVAE's codes of each clip), ``audio.i16`` (the clip at
22050 Hz, from which the recipe cuts a fresh conditioning segment every epoch, as the
reference does), ``index.npy`` (offsets and lengths into the three, speaker and language
ids) and ``ids.json``. At the top: ``vocab.json`` (the vocabulary the tokens were made with:
the model's own, or grown by a language it lacks), ``report.json`` and ``manifest.json``,
written last and atomically, with the store's identity and every file's size and sha256.

Why an identity: codes are only meaningful to the DVAE that made them and tokens to their
vocabulary; ``check_model`` refuses to train a model whose DVAE, mel statistics or
vocabulary differ, naming both hashes. The file table and the manifest's reading are those
of ``data.store`` (same ``format_version``, ``kind`` tells the stores apart).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from myxtts.data.store.format import (
    AUDIO_FILE,
    CODES_FILE,
    IDS_FILE,
    INDEX_FILE,
    MANIFEST,
    TOKENS_FILE,
    VOCAB,
    StoreError,
    read_manifest,
    sha256_file,
)

KIND = "xtts_v2"  # manifest "kind" of an XTTS store (a FeatureStore's has none)
SAMPLE_RATE = 22050  # what XTTS-v2's DVAE and conditioning hear
CODE_DTYPE = np.dtype("<i2")  # DVAE codes are < 1024
SPLIT_FILES = (TOKENS_FILE, CODES_FILE, AUDIO_FILE, INDEX_FILE, IDS_FILE)
INDEX_DTYPE = np.dtype([
    ("token_offset", "<i8"), ("token_length", "<i4"),  # into tokens.i32
    ("code_offset", "<i8"), ("code_length", "<i4"),  # into codes.i16
    ("audio_offset", "<i8"), ("audio_length", "<i4"),  # into audio.i16, samples at 22050 Hz
    ("speaker_id", "<i4"),  # into the store's speakers
    ("language_id", "<i4"),  # into the store's languages
])
# The reference trainer's limits (coqui's XTTSDataset and recipe): a clip under 0.5 s or
# over max_wav_length samples, or a text over max_text_length tokens, never trains.
MIN_SAMPLES = SAMPLE_RATE // 2
MAX_SAMPLES = 255995
MAX_TEXT_TOKENS = 200
IDENTITY_KEYS = ("base_vocab_sha256", "vocab_sha256", "dvae_sha256", "mel_stats_sha256",
                 "languages", "number_text_tokens")
DVAE_FILE, MEL_STATS_FILE = "dvae.pth", "mel_stats.pth"  # in the XTTS-v2 folder


def is_xtts_store(path: str | Path) -> bool:
    """``path`` holds a complete store's manifest that says it is an XTTS store (what
    ``myxtts train`` dispatches on; an unreadable manifest is left to the reader to name)."""
    manifest = Path(path) / MANIFEST
    if not manifest.is_file():
        return False
    try:
        return json.loads(manifest.read_text(encoding="utf-8")).get("kind") == KIND
    except (OSError, ValueError, AttributeError):
        return False


def read_xtts_manifest(root: str | Path) -> dict[str, Any]:
    """The manifest of the complete XTTS store at ``root`` (``data.store``'s checks: missing,
    interrupted, damaged, another version), and that it is an XTTS store."""
    root = Path(root)
    manifest = read_manifest(root)
    if manifest.get("kind") != KIND:
        raise StoreError(f"{root} is a feature store for myxtts's own model, not an XTTS-v2 "
                         f"store; prepare one with `myxtts prepare DATA --out NEW_STORE --xtts "
                         f"XTTS_DIR`")
    identity = manifest.get("identity")
    if not isinstance(identity, dict) or any(k not in identity for k in IDENTITY_KEYS):
        raise StoreError(f"{root / 'manifest.json'}: no complete identity (needs "
                         f"{', '.join(IDENTITY_KEYS)}); rebuild it with `myxtts prepare ... "
                         f"--xtts XTTS_DIR --force`")
    return manifest


def tensor_sha256(tensors: dict[str, Any]) -> str:
    """sha256 over tensors by name (name, dtype, shape, bytes): the identity of a DVAE or of
    mel statistics held in memory (a bundle, no folder to hash the file of)."""
    import torch  # deferred: only a model's tensors are hashed, and they come with torch

    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def check_model(root: str | Path, files: Any) -> None:
    """Refuse to train the XTTS-v2 model ``files`` (``artifacts.xtts_v2.XttsV2Files``, or its
    folder) on the store at ``root`` unless it is the model the store was made for: the
    same ``dvae.pth`` and ``mel_stats.pth`` (the codes are that DVAE's), and a vocabulary
    that is the store's (grown) one or the one it was grown from. One StoreError line
    naming the file and both hashes."""
    root = Path(root)
    manifest = read_xtts_manifest(root)
    identity, tensors = manifest["identity"], manifest.get("tensors", {})
    folder = Path(files) if isinstance(files, (str, Path)) else getattr(files, "source", None)
    fix = (f"prepare a store for this model (`myxtts prepare DATA --out NEW_STORE --xtts "
           f"{folder if folder is not None else 'XTTS_DIR'}`) or train the model {root} was made "
           f"for")
    for name, key, attr in ((DVAE_FILE, "dvae_sha256", "dvae"),
                            (MEL_STATS_FILE, "mel_stats_sha256", "mel_stats")):
        if folder is not None and (Path(folder) / name).is_file():
            have, want = sha256_file(Path(folder) / name), identity[key]
        else:
            value = getattr(files, attr, None)
            if value is None:
                raise StoreError(f"{root}: the model to train has no {name}, and the store's "
                                 f"codes are its DVAE's; train from the XTTS-v2 folder the store "
                                 f"was prepared with")
            have = tensor_sha256(value if isinstance(value, dict) else {attr: value})
            want = tensors.get(attr)
        if have != want:
            raise StoreError(f"{root} was prepared with {name} sha256 {want}, the model to train "
                             f"has {have}; {fix}")
    allowed = (identity["vocab_sha256"], identity["base_vocab_sha256"])
    have = _vocab_hashes(folder, files)
    if not set(have) & set(allowed):
        raise StoreError(f"{root} was prepared with {VOCAB} sha256 {identity['vocab_sha256']} "
                         f"(grown from {identity['base_vocab_sha256']}), the model to train has "
                         f"{have[0]}; {fix}")


def _vocab_hashes(folder: Path | None, files: Any) -> list[str]:
    """sha256 of the model's vocabulary: of the text it holds (a grown one lives in memory)
    and of its folder's file (the bytes, whatever their line ends)."""
    out = []
    text = getattr(files, "vocab", None)
    if isinstance(text, str):
        out.append(hashlib.sha256(text.encode("utf-8")).hexdigest())
    if folder is not None and (Path(folder) / VOCAB).is_file():
        out.append(sha256_file(Path(folder) / VOCAB))
    return out or ["none"]
