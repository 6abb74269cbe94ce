"""One XTTS-v2 folder of seeded random weights at the reduced size, written once per test
session (about 7 s) for the tests that speak from it."""

from __future__ import annotations

import pytest

from tests.xtts_v2.reference import write_folder


@pytest.fixture(scope="session")
def reduced_folder(tmp_path_factory):
    return write_folder(tmp_path_factory.mktemp("xtts") / "XTTS-v2")
