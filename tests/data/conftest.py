"""Fixtures of the data tests."""

from __future__ import annotations

import pytest

from myxtts.config import Config
from myxtts.data.prepare.build import prepare_store
from myxtts.synthetic import make_demo_data


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    """A prepared store of a small generated corpus (3 voices x 12 clips), one per module."""
    root = tmp_path_factory.mktemp("store")
    data = make_demo_data(root / "demo", speakers=3, utterances=12, seed=2)
    prepare_store(data, root / "store", Config(), workers=1, progress=False, echo=lambda s: None)
    return root / "store"
