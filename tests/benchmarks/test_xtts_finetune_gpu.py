"""The XTTS-v2 fine-tuning device benchmark (gpu_acceptance.py's xtts-finetune part) runs on
the CPU end to end with no file but the code: it writes its own random XTTS-v2 folder
(no coqui-tts), prepares a store, and its loader windows meet exactly the shapes it
planned and staged for the pre-staged windows."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO


@pytest.mark.slow
def test_the_benchmark_plans_the_loaders_shapes_and_reports_both_arms(tmp_path):
    from myxtts.synthetic import make_demo_data

    data = make_demo_data(tmp_path / "data", speakers=1, utterances=9, seed=0)
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "xtts_finetune_gpu.py"),
                          "--data", str(data), "--size", "reduced", "--steps", "2", "--rounds",
                          "1", "--warmup", "1", "--json", str(tmp_path / "r.json")],
                         capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["mismatches"] == 0  # every loader batch had the shape and codes planned for it
    assert r["clips"] == 9 and r["batches"] == 3 and r["batch_sizes"] == [3] * len(r["batch_sizes"])
    for arm in ("loader", "pre-staged"):
        assert r[arm]["steps_per_s"] > 0 and r[arm]["utt_per_s"] == pytest.approx(r[arm]["steps_per_s"] * 3)
    assert len(r["ratios"]) == 1 and r["ratios"][0] > 0
    rows = {line.split("  ")[0]: line for line in out.stdout.splitlines()}
    assert "RATIO loader / pre-staged, median [min-max]" in rows
    assert "GPU utilisation (NVML) %: loader / pre-staged" in rows  # "-" without a GPU
