"""Live GPU and training-run figures for a second terminal: ``myxtts monitor``.

Why: a trainer's progress bar says how fast it goes, not why. Beside it, this shows what
NVML sees on every GPU (busy, full, hot, throttled, fed over PCIe?) and the run's own latest
figures from ``RUN_DIR/metrics.jsonl`` (steps/s, data-wait share, loss, MFU) with their
age, so a starving or stalled run is visible at a glance. The metrics file is tailed: only
bytes appended since the last refresh are read, a half-written last line waits for the
next refresh, and a truncated or replaced file is read again from the start. NVML, the
clock, sleep and the output stream are parameters, so tests drive the loop without a GPU
and without waiting.
"""

from __future__ import annotations

import csv
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from myxtts.observe.gpu import GpuReading, load_nvml, read_gpus
from myxtts.outputs import FileKind
from myxtts.system import write_failed

GPU_FIELDS = ("util_pct", "mem_used_gib", "mem_total_gib", "power_w", "sm_clock_mhz", "temp_c",
              "pcie_rx_mbs", "pcie_tx_mbs")
RUN_FIELDS = ("step", "steps_per_s", "data_wait_share", "loss", "gpu_util", "mfu", "val_loss")
CSV_COLUMNS = ["time", "gpu", "name", *GPU_FIELDS, *(f"run_{k}" for k in RUN_FIELDS)]
LOG_SUFFIXES = (".csv", ".jsonl")
NO_METRICS_YET = ("none yet (has `myxtts train` started? it writes one row per "
                  "train.log_every steps)")
CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen
MAX_SHOWN_WARNINGS = 10  # a redrawn screen keeps the newest ones


class MonitorError(ValueError):
    """A user error in the monitor's arguments (such as ``--log``): one line, with the fix."""


def _number(value: Any) -> float | None:
    """``value`` as a finite float, or None (missing, text, bool, NaN, inf)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


class MetricsTail:
    """Incremental reader of ``RUN_DIR/metrics.jsonl``: latest train/val rows and warnings."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.error: str | None = None  # why the file could not be read, if it could not
        self._restart()

    def _restart(self) -> None:
        self.offset = 0  # bytes consumed: always just after a newline
        self.lines = 0  # complete lines consumed
        self._identity: tuple[int, int] | None = None
        self.train: dict[str, Any] | None = None
        self.val: dict[str, Any] | None = None
        self.last_step: int | None = None
        self.last_time: float | None = None

    @property
    def exists(self) -> bool:
        return self.path.is_file()

    def poll(self) -> list[str]:
        """Read what was appended since the last call; one ``file:line`` warning per bad line."""
        self.error = None
        try:
            st = self.path.stat()
            identity = (st.st_dev, st.st_ino)
            if st.st_size < self.offset or identity != (self._identity or identity):
                self._restart()  # truncated or replaced: a new file, read it all
            self._identity = identity
            if st.st_size == self.offset:
                return []
            with open(self.path, "rb") as fh:
                fh.seek(max(self.offset - 1, 0))
                if self.offset and fh.read(1) != b"\n":  # rewritten in place, then grown
                    self._restart()
                    fh.seek(0)
                data = fh.read()
        except FileNotFoundError:
            self._restart()
            return []
        except OSError as e:
            self.error = f"cannot read ({type(e).__name__}: {e})"
            return []
        end = data.rfind(b"\n") + 1  # a last line without its newline waits for the next poll
        self.offset += end
        warnings = []
        for raw in data[:end].split(b"\n")[:-1]:
            self.lines += 1
            problem = self._take(raw)
            if problem:
                warnings.append(f"warning: {self.path}:{self.lines}: {problem}; line skipped")
        return warnings

    def _take(self, raw: bytes) -> str | None:
        """Use one line; what is wrong with it, or None."""
        text = raw.decode("utf-8", errors="replace").strip()
        if not text:
            return None
        try:
            row = json.loads(text)
        except ValueError as e:
            return f"not JSON ({getattr(e, 'msg', e)})"
        if not isinstance(row, dict):
            return f"not a JSON object (a {type(row).__name__})"
        step = _number(row.get("step"))
        if step is None:
            return 'no numeric "step"'
        self.last_step = int(step)
        t = _number(row.get("time"))
        if t is not None:
            self.last_time = t if self.last_time is None else max(self.last_time, t)
        if any(k.startswith("train/") for k in row):
            self.train = row
        if any(k.startswith("val/") for k in row):
            self.val = row
        return None

    def status(self, now: float) -> dict[str, Any] | None:
        """The run's latest figures (None before its first good row); ``now``: epoch seconds."""
        if self.last_step is None:
            return None
        train, val = self.train or {}, self.val or {}
        return {
            "step": self.last_step, "time": self.last_time,
            "age_s": None if self.last_time is None else max(0.0, now - self.last_time),
            **{k: _number(train.get(f"train/{k}"))
               for k in ("steps_per_s", "data_wait_share", "loss", "gpu_util", "mfu")},
            "train_step": int(train["step"]) if train else None,
            "val_step": int(val["step"]) if val else None,
            "val_loss": _number(val.get("val/loss")),
        }


def _f(value: float | None, spec: str, unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


def format_gpus(gpus: list[GpuReading]) -> list[str]:
    """The GPU table: one row per GPU; a counter NVML could not read shows as ``-``."""
    lines = [f"{'GPU':>3}  {'NAME':<24} {'UTIL':>5} {'MEM USED/TOTAL GiB':>19} {'POWER W':>8} "
             f"{'SM MHz':>7} {'TEMP C':>7} {'PCIe RX/TX MB/s':>16}"]
    for g in gpus:
        mem = f"{_f(g.mem_used_gib, '.1f')} / {_f(g.mem_total_gib, '.1f')}"
        pcie = f"{_f(g.pcie_rx_mbs, '.0f')} / {_f(g.pcie_tx_mbs, '.0f')}"
        lines.append(f"{g.index:>3}  {g.name[:24]:<24} {_f(g.util_pct, '.0f', '%'):>5} "
                     f"{mem:>19} {_f(g.power_w, '.0f'):>8} {_f(g.sm_clock_mhz, '.0f'):>7} "
                     f"{_f(g.temp_c, '.0f'):>7} {pcie:>16}")
    return lines


def _age(seconds: float) -> str:
    s = int(seconds)
    if s < 120:
        return f"{s} s"
    return f"{s // 60} min {s % 60} s" if s < 7200 else f"{s // 3600} h {s % 3600 // 60} min"


def format_run(tail: MetricsTail, status: dict[str, Any] | None) -> list[str]:
    """The run section: latest step and train/val figures, or why there are none."""
    if tail.error:
        return [f"{tail.path}: {tail.error}"]
    if not tail.path.parent.is_dir():
        return [f"{tail.path.parent}: the run folder no longer exists (deleted or moved while "
                f"the monitor watched it); start the monitor on the run's folder"]
    if status is None:
        return [f"{tail.path}: {NO_METRICS_YET if not tail.exists else 'no complete row yet'}"]
    age = "" if status["age_s"] is None else f"  (last row {_age(status['age_s'])} ago)"
    wait = status["data_wait_share"]
    parts = [f"{_f(status['steps_per_s'], '.2f')} steps/s",
             f"data-wait {_f(None if wait is None else 100 * wait, '.1f', '%')}",
             f"loss {_f(status['loss'], '.4f')}"]
    if status["gpu_util"] is not None:
        parts.append(f"GPU util {status['gpu_util']:.0f}%")
    if status["mfu"] is not None:
        parts.append(f"MFU {100 * status['mfu']:.1f}%")
    if status["train_step"] is not None and status["train_step"] != status["step"]:
        parts.append(f"(step {status['train_step']})")
    lines = [f"run {tail.path.parent}  step {status['step']}{age}", "  train  " + " | ".join(parts)]
    if status["val_loss"] is not None:
        lines.append(f"  val    loss {status['val_loss']:.4f} (step {status['val_step']})")
    return lines


def _rounded(value: Any) -> Any:
    return round(value, 3) if isinstance(value, float) else value


def is_monitor_log(path: str | Path) -> bool:
    """``path`` is a log this monitor wrote (what ``--log`` may append to): a CSV whose first
    line is :data:`CSV_COLUMNS`, or JSON lines whose first is a refresh object."""
    try:
        with open(path, "rb") as fh:
            first = fh.readline(1 << 16).strip()
    except OSError:
        return False
    if Path(path).suffix.lower() == ".csv":
        return first == ",".join(CSV_COLUMNS).encode()
    try:
        row = json.loads(first)
    except ValueError:
        return False
    return isinstance(row, dict) and set(row) == {"time", "gpus", "run"}


MONITOR_LOG = FileKind("a log of `myxtts monitor`", is_monitor_log)


class MonitorLog:
    """Appends every refresh to FILE.jsonl (one object) or FILE.csv (one row per GPU)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.kind = self.path.suffix.lower()
        if self.kind not in LOG_SUFFIXES:
            raise MonitorError(f"--log {path}: the file must end in .csv or .jsonl "
                               f"(got {self.kind or 'no suffix'})")
        header = ",".join(CSV_COLUMNS)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            old = self.path.read_bytes() if self.path.is_file() else b""
            if self.kind == ".csv" and old and old.split(b"\n", 1)[0].strip() != header.encode():
                raise MonitorError(f"--log {path}: an existing CSV with other columns; choose a "
                                   "new file (appending would mix two layouts)")
            self._fh = open(self.path, "a", encoding="utf-8", newline="")  # noqa: SIM115
        except OSError as e:
            raise MonitorError(f"--log {path}: cannot write ({type(e).__name__}: {e})") from e
        if old and not old.endswith(b"\n"):  # a monitor killed mid-line: start a fresh line
            self._fh.write("\n")
        self._csv = csv.writer(self._fh, lineterminator="\n") if self.kind == ".csv" else None
        if self._csv is not None and not old:
            self._csv.writerow(CSV_COLUMNS)
        self._fh.flush()

    def write(self, now: float, gpus: list[GpuReading], run: dict[str, Any] | None) -> None:
        """One refresh, flushed at once so a killed monitor loses nothing written so far; a
        failed write (full disk, ``ulimit -f``) is one line, the rows before it kept."""
        try:
            self._write(now, gpus, run)
        except OSError as e:
            raise MonitorError(f"--log: {write_failed(e, self.path, kept=True)}") from None

    def _write(self, now: float, gpus: list[GpuReading], run: dict[str, Any] | None) -> None:
        if self._csv is None:
            row = {"time": round(now, 3),
                   "gpus": [{k: _rounded(v) for k, v in g.as_dict().items()} for g in gpus],
                   "run": None if run is None else {k: _rounded(v) for k, v in run.items()}}
            self._fh.write(json.dumps(row) + "\n")
        else:
            tail = ["" if run is None or run[k] is None else _rounded(run[k]) for k in RUN_FIELDS]
            for g in gpus or [None]:
                head = ["", ""] if g is None else [g.index, g.name]
                values = ["" if g is None or getattr(g, k) is None else _rounded(getattr(g, k))
                          for k in GPU_FIELDS]
                self._csv.writerow([round(now, 3), *head, *values, *tail])
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


class Monitor:
    """One refresh at a time: read the GPUs and the run, build a frame, append to the log."""

    def __init__(self, run_dir: str | Path | None, nvml: Any, nvml_reason: str | None,
                 log: MonitorLog | None = None, clock: Callable[[], float] = time.time) -> None:
        self.tail = None if run_dir is None else MetricsTail(run_dir)
        self.nvml, self.nvml_reason = nvml, nvml_reason
        self.log, self.clock = log, clock
        self.warnings: list[str] = []
        self._noted: set[str] = set()

    def _gpus(self) -> tuple[list[GpuReading], str | None]:
        if self.nvml is None:
            return [], self.nvml_reason or "NVML is not available"
        try:
            gpus = read_gpus(self.nvml)
        except Exception as e:  # the driver went away, a GPU fell off the bus
            return [], f"NVML could not read the GPUs ({type(e).__name__}: {e})"
        return gpus, None if gpus else "NVML sees no GPU on this machine"

    def refresh(self, redraw: bool = False) -> list[str]:
        """The lines of one frame. ``redraw``: the screen is cleared each time, so repeat the
        notes and the newest warnings; otherwise each note and warning appears only once."""
        now = self.clock()
        gpus, note = self._gpus()
        new = self.tail.poll() if self.tail is not None else []
        self.warnings = (self.warnings + new)[-MAX_SHOWN_WARNINGS:]
        run = self.tail.status(now) if self.tail is not None else None
        lines = [f"myxtts monitor  {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(now))}"]
        if gpus:
            lines += format_gpus(gpus)
        elif note and (redraw or note not in self._noted):
            lines.append(note)
            self._noted.add(note)
        if self.tail is not None:
            lines += format_run(self.tail, run)
        lines += self.warnings if redraw else new
        if self.log is not None:
            self.log.write(now, gpus, run)
        return lines


def run_monitor(run_dir: str | Path | None = None, interval: float = 1.0, count: int = 0,
                log_path: str | Path | None = None, *, nvml: Any = None,
                clock: Callable[[], float] = time.time, sleep: Callable[[float], Any] = time.sleep,
                out: TextIO | None = None, redraw: bool | None = None) -> int:
    """Refresh every ``interval`` s, ``count`` times (0: until Ctrl-C); returns the number of
    refreshes. ``nvml``: a pynvml-like module (None: :func:`load_nvml`). ``redraw``: clear the
    screen each refresh (None: when ``out`` is a terminal); otherwise frames are separated by a
    blank line."""
    out = out if out is not None else sys.stdout
    redraw = out.isatty() if redraw is None else redraw
    nvml, reason = load_nvml() if nvml is None else (nvml, None)
    log = MonitorLog(log_path) if log_path is not None else None
    monitor = Monitor(run_dir, nvml, reason, log, clock)
    done = 0
    try:
        while True:
            lines = monitor.refresh(redraw)
            out.write((CLEAR if redraw else "") + "\n".join(lines) + ("\n" if redraw else "\n\n"))
            out.flush()
            done += 1
            if count and done >= count:
                break
            sleep(interval)
    except KeyboardInterrupt:  # the way to stop it: a clean exit
        pass
    finally:
        if log is not None:
            log.close()
    return done
