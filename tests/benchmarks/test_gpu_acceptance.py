"""The GPU acceptance script on the CPU: its dry run lists every part with its deadline and
command within the budget, a part that runs past its deadline is stopped (and a planned stop
is not counted as running over), and the figures are read from a run's metrics and log the
way training writes them."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO

BENCH = REPO / "benchmarks"


@pytest.fixture
def acceptance(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import gpu_acceptance

    return gpu_acceptance


def test_the_dry_run_shows_every_part_its_deadline_and_command_within_the_budget():
    out = subprocess.run([sys.executable, str(BENCH / "gpu_acceptance.py"), "--dry-run"],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    parts = [line.split()[0] for line in lines if " deadline " in line]
    assert parts == ["store", "train", "restart", "loader", "save", "demo", "xtts", "tests"]
    deadlines = [int(line.split()[2]) for line in lines if " deadline " in line]
    assert sum(deadlines) <= 480 and lines[-1].startswith(f"deadlines add up to {sum(deadlines)} s")
    text = out.stdout
    assert "train " in text and "--model-size base" in text and "checkpoint_save.py" in text
    tests_at = text.index("-m gpu")
    assert text.index("test_capture_safety.py", tests_at) < text.index("--deselect")
    assert not list(REPO.glob("gpu_acceptance.*"))  # a dry run writes nothing


def test_a_part_past_its_deadline_is_stopped_and_a_planned_stop_is_not_over(acceptance,
                                                                           tmp_path):
    log = open(tmp_path / "log", "w")  # noqa: SIM115 - closed below
    sleeper = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"]
    t0 = time.monotonic()
    ran = acceptance.run(sleeper, deadline=1.0, env={}, log=log, grace=2.0)
    assert ran.over and ran.rc is None and time.monotonic() - t0 < 10
    assert [line for _, line in ran.lines] == ["up"]
    handled = [sys.executable, "-c", "import signal, sys, time\n"
               "signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))\ntime.sleep(60)"]
    ran = acceptance.run(handled, deadline=5.0, env={}, log=log, stop_at=0.5, grace=2.0)
    assert not ran.over and ran.rc == 143 and ran.seconds < 5
    log.close()


def test_the_figures_are_read_as_training_writes_them(acceptance, tmp_path):
    rows = [{"step": 25, "train/steps_per_s": 2.0, "train/gpu_util": 40.0, "train/mfu": 0.1,
             "train/audio_s_per_s": 100.0, "train/data_wait_share": 0.5},  # the first: left out
            {"step": 50, "train/steps_per_s": 4.0, "train/gpu_util": 96.0, "train/mfu": 0.3,
             "train/audio_s_per_s": 200.0, "train/data_wait_share": 0.0},
            {"step": 50, "val/loss": 1.0},
            {"step": 75, "train/steps_per_s": 4.0, "train/gpu_util": 98.0, "train/mfu": 0.4,
             "train/audio_s_per_s": 300.0, "train/data_wait_share": 0.02}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = acceptance.metrics(tmp_path, fps=10.0)
    assert got == {"intervals": 2, "last_step": 75, "gpu_util_pct": 97.0, "mfu": 0.35,
                   "mel_frames_per_s": 2500.0, "steps_per_s": 4.0, "data_wait_share": 0.01}
    ran = acceptance.Ran(0, 9.0, False, [
        (1.0, "model base: 105 M parameters"),
        (42.5, "warm-up: 4 bucket shapes in 30.2 s (8 graphs compiled, 4 shapes captured as "
               "CUDA graphs; 0.10 GiB reserved beyond allocated at the peaks); graphed step")])
    assert acceptance.warm_up_figures(ran) == {
        "to_step_1_s": 42.5, "warmup_s": 30.2, "shapes": 4, "step_mode": "graphed",
        "did": "8 graphs compiled, 4 shapes captured as CUDA graphs; 0.10 GiB reserved "
               "beyond allocated at the peaks"}
