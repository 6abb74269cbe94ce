"""`myxtts profile` on the CPU: the real training setup, timed phase by phase, with a verdict,
a trace and JSON, and no checkpoint written."""

from __future__ import annotations

import json

import pytest

from myxtts.cli.main import main
from myxtts.diagnose.profile.report import format_report
from myxtts.diagnose.profile.run import profile
from myxtts.diagnose.profile.verdict import COMPUTE, HOST, INPUT, MEMORY
from tests.helpers import micro_config


@pytest.fixture(scope="module")
def profiled(micro_store, tmp_path_factory):
    out = tmp_path_factory.mktemp("profile")
    cfg = micro_config(out / "run", "train.grad_accum_steps=2", "train.peak_tflops=1.0")
    return profile(cfg, micro_store, steps=4, trace_dir=out / "trace", echo=lambda s: None), out


@pytest.mark.slow
def test_phases_add_up_and_every_step_phase_is_there(profiled):
    p, _ = profiled
    phases = p["phases"]
    for name in ("data wait", "forward", "backward", "optimizer", "other", "step"):
        assert name in phases and phases[name]["mean_s"] >= 0
    assert phases["forward"]["mean_s"] > 0 and phases["backward"]["mean_s"] > 0
    parts = sum(v["mean_s"] for k, v in phases.items() if k != "step")
    assert parts == pytest.approx(phases["step"]["mean_s"], rel=1e-9)
    assert "host->device copy" not in phases  # nothing is copied on a CPU
    assert p["timing"].startswith("wall clock")


def test_the_window_is_what_training_runs(profiled):
    p, out = profiled
    assert p["steps"] == 4 and sum(s["batches"] for s in p["shapes"]) == 4 * 2  # 2 micro each
    assert p["throughput"]["steps_per_s"] == pytest.approx(4 / p["seconds"])
    assert p["setup"]["batch_frames"] == 1200 and p["setup"]["step_mode"] == "eager"
    assert p["setup"]["grad_accum_steps"] == 2 and p["setup"]["num_workers"] == 0
    for s in p["shapes"]:
        assert s["batch"] * s["frames"] <= 1200
    assert 0 < p["padding_efficiency"] <= 1
    assert p["recompiles"] == 0 and p["gpu_util"] is None
    assert p["mfu"] == pytest.approx(p["tflops"] / 1.0) and p["tflops"] > 0
    assert not (out / "run" / "checkpoints").exists()  # a profile writes no checkpoint


def test_verdict_trace_and_report(profiled):
    p, _ = profiled
    assert p["verdict"]["kind"] in (INPUT, MEMORY, HOST, COMPUTE)
    assert p["verdict"]["kind"] != HOST  # never on a CPU
    assert p["verdict"]["advice"] and p["verdict"]["evidence"]
    trace = json.loads(open(p["trace"]).read())
    assert trace["traceEvents"]
    text = format_report(p)
    assert "verdict: " + p["verdict"]["kind"].upper() in text
    assert "  try: " + p["verdict"]["advice"][0] in text
    assert "step (sum of the above)" in text and "MFU" in text
    json.dumps(p)  # all of it is machine-readable


@pytest.mark.slow
def test_cli_json_and_bad_input(micro_store, tmp_path, capsys):
    run = f"train.output_dir={tmp_path / 'run'}"
    base = ["--set", "model.d_model=32", "--set", "model.decoder_layers=1", "--set",
            "data.num_workers=0", "--set", run, "--device", "cpu", "--batch-frames", "1200"]
    assert main(["profile", str(micro_store), "--steps", "2", "--json", *base]) == 0
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert data["steps"] == 2 and data["setup"]["precision"] == "fp32"
    assert "2 measured" in err
    (tmp_path / "a_file").write_text("a file where the trace folder's parent should be")
    for argv, words in [
        (["--steps", "0"], "--steps must be at least 1"),
        (["--steps", "1", "--trace", str(tmp_path / "a_file" / "trace")], "cannot write"),
        (["--steps", "1", "--trace", str(micro_store / "trace")], "lies inside the data"),
        ([str(tmp_path / "missing"), "--steps", "1"], "does not exist"),
    ]:
        target = [] if argv[0].startswith("/") else [str(micro_store)]
        rc = main(["profile", *target, *argv, *base])
        out, err = capsys.readouterr()
        assert rc == 2 and words in err and err.count("\n") == 1 and "Traceback" not in err
