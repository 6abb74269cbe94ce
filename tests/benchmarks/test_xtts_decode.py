"""The XTTS-v2 decoding benchmark (gpu_acceptance.py's xtts part) runs on the CPU with no
files and prints the rows the acceptance script reads."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import REPO


@pytest.mark.slow
def test_the_decode_benchmark_prints_the_rows_the_acceptance_script_reads():
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "xtts_decode.py"), "--size",
                          "reduced", "--device", "cpu", "--codes", "4", "--threads", "1"],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr
    rows = {line.strip().split("  ")[0]: line.strip() for line in out.stdout.splitlines()}
    for label in ("GPT step, eager, float32 (ms per code)", "GPT step, eager, bfloat16 (ms per code)",
                  "its projections alone, one row (ms per code)",
                  "HiFi-GAN decoder (s per s of audio)"):
        assert label in rows, out.stdout
        assert float(rows[label][len(label):].split()[0]) > 0
    assert "CUDA graph" not in out.stdout  # on a CPU the step always runs eagerly
