"""`myxtts monitor`: GPU table from a fake NVML, the tailed metrics.jsonl, logs and the CLI."""

from __future__ import annotations

import csv
import io
import json
import os
import sys
from types import SimpleNamespace

import pytest

from myxtts.cli.main import main
from myxtts.diagnose import monitor as mon
from myxtts.diagnose.monitor import CLEAR, MetricsTail, Monitor, MonitorError, run_monitor

T0 = 1_763_900_000.0
REASON = "NVML is not available: pip install nvidia-ml-py (test)"


class NVMLError(Exception):
    pass


def fake_nvml(count: int = 2, calls_before_interrupt: int | None = None) -> SimpleNamespace:
    """Two GPUs: GPU 0 reads everything; GPU 1's power counter raises, as on some boards."""
    seen = {"count": 0}

    def get_count():
        seen["count"] += 1
        if calls_before_interrupt is not None and seen["count"] > calls_before_interrupt:
            raise KeyboardInterrupt
        return count

    def power(h):
        if h == 1:
            raise NVMLError("Not Supported")
        return 512_000  # mW

    return SimpleNamespace(
        NVML_CLOCK_SM=1, NVML_TEMPERATURE_GPU=0, NVML_PCIE_UTIL_RX_BYTES=1,
        NVML_PCIE_UTIL_TX_BYTES=0,
        nvmlDeviceGetCount=get_count,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: [b"FakeGPU-A", "FakeGPU-B"][h],
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=[87, 5][h]),
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=[20, 2][h] * 2**30,
                                                          total=80 * 2**30),
        nvmlDeviceGetPowerUsage=power,
        nvmlDeviceGetClockInfo=lambda h, kind: [1980, 210][h] if kind == 1 else 0,
        nvmlDeviceGetTemperature=lambda h, kind: [64, 31][h],
        nvmlDeviceGetPcieThroughput=lambda h, kind: {(0, 1): 1_203_000, (0, 0): 15_000}.get(
            (h, kind), 0),  # KB/s; kind 1 = RX, 0 = TX
    )


def row(step: int, t: float = T0, **values: float) -> str:
    return json.dumps({"step": step, "time": t, **values}) + "\n"


def train_row(step: int, t: float = T0, loss: float = 1.23) -> str:
    return row(step, t, **{"train/loss": loss, "train/steps_per_s": 4.1,
                           "train/data_wait_share": 0.02, "train/gpu_util": 87.0,
                           "train/mfu": 0.31})


def drive(run_dir=None, count: int = 1, nvml=None, redraw: bool = False, **kw) -> str:
    out = io.StringIO()
    n = run_monitor(run_dir, interval=0.5, count=count, nvml=nvml, clock=lambda: T0 + 42,
                    sleep=lambda s: None, out=out, redraw=redraw, **kw)
    assert n == count
    return out.getvalue()


@pytest.fixture
def no_nvml(monkeypatch):
    monkeypatch.setattr(mon, "load_nvml", lambda: (None, REASON))


def test_table_on_two_fake_gpus():
    text = drive(nvml=fake_nvml())
    lines = text.splitlines()
    gpu0 = next(ln for ln in lines if "FakeGPU-A" in ln).split()
    gpu1 = next(ln for ln in lines if "FakeGPU-B" in ln).split()
    assert gpu0 == ["0", "FakeGPU-A", "87%", "20.0", "/", "80.0", "512", "1980", "64",
                    "1203", "/", "15"]
    assert gpu1 == ["1", "FakeGPU-B", "5%", "2.0", "/", "80.0", "-", "210", "31", "0", "/", "0"]
    assert "NVML" not in text and text.endswith("\n\n")  # plain frames end with a blank line


def test_without_nvml_one_line_and_the_run_part_still_shown(tmp_path, no_nvml):
    (tmp_path / "metrics.jsonl").write_text(train_row(50))
    text = drive(tmp_path, count=3)
    assert text.count(REASON) == 1
    assert text.count(f"run {tmp_path}  step 50  (last row 42 s ago)") == 3
    assert "4.10 steps/s | data-wait 2.0% | loss 1.2300 | GPU util 87% | MFU 31.0%" in text
    # redrawn in place: each frame clears the screen and keeps the line visible
    text = drive(tmp_path, count=2, redraw=True)
    assert text.count(CLEAR) == 2 and text.count(REASON) == 2


def test_the_real_loader_without_pynvml_names_the_package(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    text = drive(tmp_path, count=2)
    assert text.count("pip install nvidia-ml-py") == 1


def test_nvml_that_sees_no_gpu_or_fails_says_so_once(tmp_path):
    assert drive(count=2, nvml=fake_nvml(count=0)).count("NVML sees no GPU") == 1
    def lost():
        raise NVMLError("GPU is lost")

    broken = fake_nvml()
    broken.nvmlDeviceGetCount = lost
    text = drive(count=2, nvml=broken)
    assert text.count("NVML could not read the GPUs (NVMLError: GPU is lost)") == 1


def test_run_without_metrics_then_the_file_appears(tmp_path, no_nvml):
    m = Monitor(tmp_path, None, REASON, clock=lambda: T0 + 3)
    first = "\n".join(m.refresh())
    assert (f"{tmp_path / 'metrics.jsonl'}: none yet (has `myxtts train` started? it writes one "
            "row per train.log_every steps)") in first
    (tmp_path / "metrics.jsonl").write_text('{"step": 1')  # half a row: not a row yet
    assert "no complete row yet" in "\n".join(m.refresh())
    (tmp_path / "metrics.jsonl").write_text(train_row(10) + row(10, **{"val/loss": 1.5}))
    third = "\n".join(m.refresh())
    assert "step 10  (last row 3 s ago)" in third and "val    loss 1.5000 (step 10)" in third


def test_malformed_lines_warn_once_with_file_and_line(tmp_path, no_nvml):
    path = tmp_path / "metrics.jsonl"
    path.write_text(train_row(10) + "not json\n" + "[1, 2]\n" + '{"time": 1}\n'
                    + '{"step": "x"}\n' + "\n" + train_row(20, loss=0.75))
    text = drive(tmp_path, count=3)
    for line, what in [(2, "not JSON"), (3, "not a JSON object (a list)"),
                       (4, 'no numeric "step"'), (5, 'no numeric "step"')]:
        assert text.count(f"warning: {path}:{line}: {what}") == 1
    assert text.count("line skipped") == 4  # the blank line 6 is no problem
    assert text.count("step 20") == 3 and "loss 0.7500" in text


def test_incremental_reading_partial_lines_and_truncation(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(tmp_path)
    assert tail.poll() == [] and tail.status(T0) is None and not tail.exists
    path.write_text(train_row(10))
    tail.poll()
    assert tail.status(T0)["step"] == 10 and tail.offset == len(train_row(10))
    with open(path, "a") as fh:  # one more row and the first half of another
        fh.write(train_row(20, loss=0.9) + train_row(30)[:15])
    assert tail.poll() == []
    assert tail.status(T0)["step"] == 20 and tail.status(T0)["loss"] == 0.9
    assert tail.offset == len(train_row(10)) + len(train_row(20, loss=0.9)) and tail.lines == 2
    with open(path, "a") as fh:  # the row is finished
        fh.write(train_row(30)[15:])
    tail.poll()
    assert tail.status(T0)["step"] == 30 and tail.lines == 3
    assert tail.poll() == [] and tail.lines == 3  # nothing new: nothing read again
    path.write_text(train_row(5, loss=2.0) + "oops\n")  # truncated: a new run from scratch
    assert tail.poll() == [f"warning: {path}:2: not JSON (Expecting value); line skipped"]
    status = tail.status(T0 + 7)
    assert status["step"] == 5 and status["loss"] == 2.0 and status["age_s"] == 7.0
    bigger = tmp_path / "new.jsonl"  # replaced by a longer file (os.replace: a new inode)
    bigger.write_text("".join(train_row(s) for s in (100, 200, 300)))
    os.replace(bigger, path)
    tail.poll()
    assert tail.status(T0)["step"] == 300 and tail.lines == 3


def test_csv_log_header_once_across_two_runs(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(train_row(50))
    log = tmp_path / "logs" / "gpu.csv"
    drive(run, count=2, nvml=fake_nvml(), log_path=log)
    drive(run, count=1, nvml=fake_nvml(), log_path=log)
    rows = list(csv.reader(log.open()))
    assert rows[0] == mon.CSV_COLUMNS and sum(r == mon.CSV_COLUMNS for r in rows) == 1
    assert len(rows) == 1 + 3 * 2  # one row per GPU per refresh
    by = [dict(zip(rows[0], r)) for r in rows[1:]]
    assert [r["gpu"] for r in by] == ["0", "1"] * 3
    assert by[0]["name"] == "FakeGPU-A" and float(by[0]["power_w"]) == 512.0
    assert float(by[0]["pcie_rx_mbs"]) == 1203.0 and float(by[0]["mem_used_gib"]) == 20.0
    assert by[1]["power_w"] == "" and float(by[1]["util_pct"]) == 5.0
    assert all(r["run_step"] == "50" and float(r["run_loss"]) == 1.23 for r in by)
    assert float(by[0]["run_data_wait_share"]) == 0.02 and float(by[0]["time"]) == T0 + 42
    assert float(by[0]["run_mfu"]) == 0.31 and by[0]["run_val_loss"] == ""  # no val row yet


def test_csv_log_without_gpus_and_refusing_other_columns(tmp_path, no_nvml):
    log = tmp_path / "m.csv"
    drive(tmp_path, count=2, log_path=log)  # no GPU readable, no metrics yet
    rows = list(csv.DictReader(log.open()))
    assert len(rows) == 2 and all(r["gpu"] == "" and r["run_step"] == "" for r in rows)
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(MonitorError, match="other columns"):
        drive(tmp_path, log_path=other)
    with pytest.raises(MonitorError, match=r"\.csv or \.jsonl"):
        drive(tmp_path, log_path=tmp_path / "m.txt")


def test_jsonl_log_one_object_per_refresh(tmp_path, monkeypatch):
    (tmp_path / "metrics.jsonl").write_text(train_row(50) + row(50, **{"val/loss": 1.1}))
    log = tmp_path / "m.jsonl"
    drive(tmp_path, count=3, nvml=fake_nvml(), log_path=log)
    objs = [json.loads(ln) for ln in log.read_text().splitlines()]
    assert len(objs) == 3 and all(o["time"] == T0 + 42 for o in objs)
    gpus = objs[0]["gpus"]
    assert [g["index"] for g in gpus] == [0, 1] and gpus[1]["power_w"] is None
    assert gpus[0]["temp_c"] == 64.0 and gpus[0]["pcie_tx_mbs"] == 15.0
    run = objs[-1]["run"]
    assert run["step"] == 50 and run["loss"] == 1.23 and run["mfu"] == 0.31
    assert run["val_loss"] == 1.1 and run["val_step"] == 50 and run["age_s"] == 42.0
    monkeypatch.setattr(mon, "load_nvml", lambda: (None, REASON))
    drive(None, count=1, log_path=log)  # appended, GPUs only: no run
    last = json.loads(log.read_text().splitlines()[-1])
    assert last["gpus"] == [] and last["run"] is None


def test_ctrl_c_stops_cleanly_and_the_log_keeps_what_was_written(tmp_path, no_nvml):
    def interrupt(seconds):
        raise KeyboardInterrupt

    out, log = io.StringIO(), tmp_path / "m.jsonl"
    n = run_monitor(tmp_path, interval=1, count=0, log_path=log, nvml=fake_nvml(),
                    sleep=interrupt, out=out, redraw=False)
    assert n == 1 and len(log.read_text().splitlines()) == 1


def _cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["monitor", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_on_a_run_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(train_row(50))
    log = tmp_path / "m.csv"  # beside the run: the monitor never writes into it
    rc, out, err = _cli(capsys, run, "--count", "2", "--interval", "0.01", "--log", log)
    assert rc == 0 and err == "" and "Traceback" not in out
    assert out.count("myxtts monitor  ") == 2 and out.count(f"run {run}  step 50") == 2
    assert out.count("pip install nvidia-ml-py") == 1
    assert len(log.read_text().splitlines()) == 3  # header + one row per refresh, no GPU


def test_cli_ctrl_c_exits_zero(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(mon, "load_nvml", lambda: (fake_nvml(calls_before_interrupt=2), None))
    rc, out, err = _cli(capsys, tmp_path, "--interval", "0.01")
    assert rc == 0 and err == "" and out.count("FakeGPU-A") == 2


@pytest.mark.parametrize("argv, message", [
    (["{missing}"], "does not exist"),
    (["{file}"], "is not a folder"),
    (["{run}", "--log", "{run}/m.txt"], ".csv or .jsonl"),
    (["{run}", "--interval", "0"], "--interval must be"),
    (["{run}", "--count", "-1"], "--count must be >= 0"),
])
def test_cli_errors_are_one_line(tmp_path, capsys, argv, message):
    (tmp_path / "file.txt").write_text("x")
    paths = {"missing": tmp_path / "nope", "file": tmp_path / "file.txt", "run": tmp_path}
    rc, out, err = _cli(capsys, *[a.format(**paths) for a in argv])
    assert rc == 2 and message in err and err.startswith("myxtts monitor: error: ")
    assert err.count("\n") == 1 and out == ""
