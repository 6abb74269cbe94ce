"""``myxtts prepare --verify``: check a store against its manifest and its own invariants.

Why beyond checksums: a store can be byte-for-byte what its manifest says and still be
wrong for training (an index that overlaps, a reference to another speaker, a token
outside the vocabulary, NaN features, a manifest whose feature hash was edited) if a
writer bug or a hand slipped through; these checks catch those before a run trains on them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from myxtts.audio.frames import frames_for_samples
from myxtts.config import ConfigError, config_from_dict
from myxtts.data.store.audio import audio_index, stores_audio
from myxtts.data.store.finite import is_recorded, read_rows, scan_split
from myxtts.data.store.format import (
    AUDIO_FILE,
    AUDIO_FILES,
    AUDIO_INDEX_FILE,
    INDEX_FILE,
    MANIFEST,
    MEL_DTYPE,
    MEL_FILE,
    REFS_FILE,
    SPLIT_FILES,
    SPLITS,
    TOKEN_DTYPE,
    TOKENS_FILE,
    VOCAB,
    StoreError,
    mel_mean_std,
    read_manifest,
    sha256_file,
)
from myxtts.data.store.reader import FeatureStore


def verify_store(path: str | Path, check_hashes: bool = True) -> list[str]:
    """Every problem found in the store at ``path`` (empty list = healthy).

    Checks: manifest readable and current; every listed file present with the recorded
    size and sha256 (skipped with ``check_hashes=False``); no unlisted data files; per
    split, offsets contiguous from 0 and within the files, lengths positive, speaker and
    language ids in range, tokens within the vocabulary, references in range, of the same
    speaker, and not the utterance itself unless its speaker has a single clip; every mel
    finite (a full pass, whatever the manifest records: ``store.finite``). With audio
    (manifest ``store_audio``): its files listed, its index contiguous, and every
    utterance's mel length the one its samples give (``_check_audio``). Every file is read
    in blocks: memory stays flat whatever the store's size.
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
    if manifest.get("kind") is not None:  # an XTTS store: its own invariants
        from myxtts.data.xtts_store.verify import xtts_problems  # circle: it reads data.store

        return problems or xtts_problems(path)
    with_audio = stores_audio(manifest)
    for split in SPLITS:
        for name in SPLIT_FILES + (AUDIO_FILES if with_audio else ()):
            if f"{split}/{name}" not in files:
                problems.append(f"{path / split / name}: not listed in the manifest")
        if not with_audio:
            problems += [f"{path / split / name}: listed in the manifest, but its store_audio is "
                         f"not true" for name in AUDIO_FILES if f"{split}/{name}" in files]
    problems += _check_feature_hash(path, manifest)
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
        bad, first = scan_split(store)
        if bad:
            recorded = (f"; {MANIFEST} records them as checked finite" if is_recorded(manifest)
                        else "")
            problems.append(f"{path / split}: {bad} mel frames hold NaN or infinity (first in "
                            f"utterance {first}, {store.ids[first]}){recorded}")
        if split == "train":
            try:
                store.check_statistics()
                problems += _check_statistics_match(store)
            except StoreError as e:
                problems.append(str(e))
        if store.has_audio:
            problems += _check_audio(store)
    return problems


def _check_statistics_match(store: FeatureStore) -> list[str]:
    """The manifest's mel_stats against the statistics of the train split's mels as stored
    (a second pass in bounded memory; prepare computed them from the same float16 frames,
    so they agree to rounding): an edited or damaged manifest is named, field and band."""
    total = np.zeros(store.n_mels, np.float64)
    total_sq = np.zeros(store.n_mels, np.float64)
    for _, block in read_rows(store.path / store.split / MEL_FILE, MEL_DTYPE, store.n_mels,
                              store.total_frames):
        rows = block.astype(np.float64)
        total += rows.sum(axis=0)
        total_sq += (rows * rows).sum(axis=0)
    mean, std = mel_mean_std(total, total_sq, store.total_frames)
    out = []
    for key, recorded, measured in (("mean", store.mel_mean, mean), ("std", store.mel_std, std)):
        off = np.abs(recorded - measured) > 1e-3 * (1 + np.abs(measured))
        if off.any():
            k = int(np.flatnonzero(off)[0])
            out.append(f"{store.path / MANIFEST}: mel_stats.{key} does not match the train "
                       f"mels (band {k}: {float(recorded[k]):g} recorded, {measured[k]:g} "
                       f"measured; {int(off.sum())} band(s) differ): the manifest was edited or "
                       f"damaged; rebuild the store with `myxtts prepare ... --force`")
    return out


def _check_audio(store: FeatureStore) -> list[str]:
    """The audio checks for one split of a store with audio: lengths positive, offsets
    contiguous from 0, the manifest's sample count, and every utterance's mel length equal
    to the frames its samples give (the contract between ``audio(i)`` and ``mel(i)``)."""
    where = f"{store.path / store.split}"
    out: list[str] = []
    offsets, lengths = store.audio_offsets, store.audio_lengths
    if len(lengths) == 0:
        return out
    if (lengths <= 0).any():
        out.append(f"{where}/{AUDIO_INDEX_FILE}: {int((lengths <= 0).sum())} utterances have "
                   f"no samples")
    bad = np.flatnonzero(offsets != audio_index(lengths)[:, 0])
    if len(bad):
        out.append(f"{where}/{AUDIO_INDEX_FILE}: offsets not contiguous/monotone from 0 (first "
                   f"bad utterance {int(bad[0])})")
    stats = store.manifest.get("splits", {}).get(store.split, {})
    if int(lengths.sum()) != stats.get("audio_samples"):
        out.append(f"{where}/{AUDIO_FILE}: {int(lengths.sum())} samples but the manifest says "
                   f"{stats.get('audio_samples')}")
    audio_cfg = store.manifest["audio"]
    expected = frames_for_samples(lengths.astype(np.int64), int(audio_cfg["n_fft"]),
                                  int(audio_cfg["hop_length"]))
    bad = np.flatnonzero(expected != store.mel_lengths)
    if len(bad):
        i = int(bad[0])
        out.append(f"{where}: {len(bad)} utterances whose audio and mel lengths disagree (first: "
                   f"{store.ids[i]}, {int(lengths[i])} samples give {int(expected[i])} frames, "
                   f"{INDEX_FILE} says {int(store.mel_lengths[i])})")
    return out


def _check_feature_hash(path: Path, manifest: dict[str, Any]) -> list[str]:
    """The recorded feature hash must be the hash of the recorded audio/text sections: an
    edited hash (or section) would let a store pass as prepared with other features."""
    try:
        cfg = config_from_dict({"audio": manifest.get("audio", {}), "text": manifest.get("text", {})})
    except (ConfigError, TypeError, ValueError) as e:
        return [f"{path / MANIFEST}: its audio/text sections are not a valid config ({e})"]
    if cfg.feature_hash() != manifest.get("feature_hash"):
        return [f"{path / MANIFEST}: feature_hash {manifest.get('feature_hash')!r} is not the hash "
                f"of its audio/text sections ({cfg.feature_hash()!r}): the manifest was edited"]
    return []


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
    if vocab_size is not None:
        for _, tokens in read_rows(store.path / store.split / TOKENS_FILE, TOKEN_DTYPE, 1,
                                   store.total_tokens):  # in blocks: memory stays flat
            if int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size:
                out.append(f"{where}/{TOKENS_FILE}: token ids outside the vocabulary "
                           f"[0, {vocab_size})")
                break
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
