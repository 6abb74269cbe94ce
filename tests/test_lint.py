"""The suite runs the linter: a lint error fails CI like a failing test."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO


def test_ruff_clean():
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists():
        pytest.skip("ruff not installed (pip install -e '.[dev]')")
    r = subprocess.run([ruff, "check", "src", "tests", "benchmarks", "tools"], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
