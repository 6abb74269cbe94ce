"""Damage a copy of a store the way a disk or a copy can, and check that the damage is named:
what the store tests for mels and tokens and the store-audio tests share."""

from __future__ import annotations

import re
from pathlib import Path

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
