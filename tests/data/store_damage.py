"""Damage a copy of a store the way a disk, a copy or a writer bug can, and check that the
damage is named: what the store tests for mels and tokens, the store-audio tests and the
finite-check tests share."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

from myxtts.data.store import FeatureStore, StoreError, verify_store


def flip_a_byte_is_found(store: Path, rel: str, bit: int) -> None:
    """Flip ``bit`` of the middle byte of ``store/rel``: verify names that one file's sha256."""
    f = store / rel
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= bit
    f.write_bytes(bytes(data))
    problems = verify_store(store)
    assert len(problems) == 1 and rel in problems[0] and "sha256" in problems[0], problems


def truncation_is_named(store: Path, rel: str, n_bytes: int) -> None:
    """Cut ``n_bytes`` off ``store/rel``: verify and opening the store name the file."""
    f = store / rel
    f.write_bytes(f.read_bytes()[:-n_bytes])
    problems = verify_store(store)
    assert any(rel in p and "bytes" in p and "truncated" in p for p in problems), problems
    split, name = rel.split("/")
    with pytest.raises(StoreError, match=rf"{re.escape(name)}.*truncated"):
        FeatureStore.open(store, split)


def rehash(store: Path, rel: str) -> None:
    """Update the manifest's size/sha256 of ``rel`` (a store wrong in a way checksums miss)."""
    blob = (store / rel).read_bytes()
    manifest = json.loads((store / "manifest.json").read_text())
    manifest["files"][rel] = {"size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
    (store / "manifest.json").write_text(json.dumps(manifest))


def poison_mel(store: Path, split: str = "train", utterance: int = 3, frame: int = 2,
               value: float = np.nan) -> str:
    """Write ``value`` into band 5 of one frame of ``utterance``'s mel, then re-hash the file
    (a writer bug: the checksums were recorded after the damage, so only a finite check sees
    it). Returns the utterance's id."""
    st = FeatureStore.open(store, split)
    mel = np.memmap(store / split / "mel.f16", dtype=np.float16, mode="r+",
                    shape=(st.total_frames, st.n_mels))
    mel[int(st.mel_offsets[utterance]) + frame, 5] = value
    mel.flush()
    del mel
    rehash(store, f"{split}/mel.f16")
    return st.ids[utterance]
