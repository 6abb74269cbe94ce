"""`myxtts monitor [RUN_DIR]`: a live table of every GPU and a training run's latest figures."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from myxtts.cli.common import CLIError
from myxtts.outputs import is_inside, output_file


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "monitor", help="live table of every GPU (NVML) and a training run's progress",
        description="Refresh a table of every GPU NVML sees (utilisation, memory, power, SM clock, "
                    "temperature, PCIe traffic) and, given RUN_DIR, that run's latest step, "
                    "steps/s, data-wait share, loss, GPU utilisation, MFU and val loss from "
                    "RUN_DIR/metrics.jsonl, with the age of its last row. Run it in a second "
                    "terminal beside `myxtts train`; Ctrl-C stops it.")
    p.add_argument("run_dir", nargs="?", metavar="RUN_DIR",
                   help="a training run folder (train.output_dir); omit for the GPUs only")
    p.add_argument("--interval", type=float, default=1.0, metavar="S",
                   help="seconds between refreshes (default 1.0)")
    p.add_argument("--count", type=int, default=0, metavar="N",
                   help="refresh N times, then exit (default 0: until Ctrl-C)")
    p.add_argument("--log", metavar="FILE", help="also append every refresh to FILE: .jsonl (one "
                   "object per refresh) or .csv (one row per GPU per refresh); a file outside "
                   "RUN_DIR, new or written by the monitor before (not '-': the table is on "
                   "stdout)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not (math.isfinite(args.interval) and args.interval > 0):
        raise CLIError(f"--interval must be a number of seconds > 0, got {args.interval}")
    if args.count < 0:
        raise CLIError(f"--count must be >= 0 (0: until Ctrl-C), got {args.count}")
    if args.log and Path(args.log).suffix.lower() not in (".csv", ".jsonl"):
        what = " is standard output, the table's place" if args.log == "-" else ""
        raise CLIError(f"--log {args.log}{what}: the file must end in .csv or .jsonl")
    if args.run_dir is not None:
        run_dir = Path(args.run_dir)
        if not run_dir.exists():
            raise CLIError(f"run folder {run_dir} does not exist; pass the folder `myxtts train` "
                           "writes to (train.output_dir), or no RUN_DIR for the GPUs only")
        if not run_dir.is_dir():
            raise CLIError(f"{run_dir} is not a folder; pass a training run folder "
                           "(the one holding metrics.jsonl)")
        if args.log and is_inside(args.log, run_dir):
            raise CLIError(f"--log {args.log} is inside the run folder {run_dir}; the monitor "
                           "never writes into a run's files: give a path outside it")
    try:
        from myxtts.diagnose.monitor import (  # deferred: torch
            MONITOR_LOG,
            MonitorError,
            run_monitor,
        )

        if args.log:
            output_file(args.log, "--log", MONITOR_LOG)
        try:
            run_monitor(args.run_dir, interval=args.interval, count=args.count, log_path=args.log)
        except MonitorError as e:
            raise CLIError(str(e)) from None
    except KeyboardInterrupt:  # Ctrl-C is how an endless monitor ends: not an error
        pass
    return 0

