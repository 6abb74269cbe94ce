"""What the benchmarks share: options, the data and its store, the header and the table, and
progress lines (the trainer's own progress, ``myxtts.train``'s log, among them). Run
a benchmark as ``python benchmarks/NAME.py``: this folder is then on the import path.
``_trainer.py`` holds the trainer's parts the training benchmarks time, ``_pipelines.py``
``data_pipeline.py``'s measured parts.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# ../shared/data/ljspeech-mini beside the checkout, or beside a folder above it (a worktree
# kept deeper); the nearest that exists
DEFAULT_DATA = next((f / "shared" / "data" / "ljspeech-mini" for f in REPO.parents
                     if (f / "shared" / "data" / "ljspeech-mini").exists()),
                    REPO.parent / "shared" / "data" / "ljspeech-mini")
CPU_BATCH_FRAMES = {"tiny": 1500, "small": 1000, "base": 1000}  # ~0.15-1 s steps on 2 cores
LABEL = 56  # width of a table's first column
OPTIONS: dict[str, tuple[Any, str]] = {  # the shared options: type, default help
    "presets": (str, "comma-separated (default: tiny,small on CPU; tiny,small,base on CUDA)"),
    "data": (Path, "dataset to prepare (default: ../shared/data/ljspeech-mini)"),
    "store": (Path, "prepared store to use or create and keep"),
    "steps": (int, "optimizer steps per window (default 8 on CPU; on CUDA 30 in train_step.py, "
                   "40 in input_ratio.py)"),
    "rounds": (int, "windows per arm, interleaved (default 6 on CPU, 3 on CUDA)"),
    "batch-frames": (int, "data.batch_frames (default: CPU 1500 tiny, 1000 small/base; CUDA "
                          "the config's)"),
    "threads": (int, "torch threads; 0 = torch's default (default: 1 on CPU, 0 on CUDA)"),
    "set": (None, "config override for every preset (repeatable)")}


def add_arguments(p: argparse.ArgumentParser, **helps: str | None) -> None:
    """The options of ``OPTIONS``; ``helps`` (``batch_frames=...``) replaces one's help text,
    or leaves it out (None)."""
    for name, (kind, text) in OPTIONS.items():
        text = helps.get(name.replace("-", "_"), text)
        if text is None:
            continue
        if name == "set":
            p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                           help=text)
        else:
            p.add_argument(f"--{name}", type=kind, help=text)


def say(msg: str) -> None:
    print(f"[{Path(sys.argv[0]).stem} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class _Say(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        say(record.getMessage())


_setup_log = logging.getLogger("myxtts.train")  # batch sizes and warm-up progress
_setup_log.setLevel(logging.INFO)
_setup_log.addHandler(_Say())


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def spread(values: list[float]) -> str:
    """``median [min-max]`` of per-round ratios."""
    return f"{median(values):.3f} [{min(values):.2f}-{max(values):.2f}]" if values else "-"


def above_load_mb(run: dict) -> float:
    """A measured child's peak RSS above what it held once loaded: the work's own memory."""
    return run["peak_rss_mb"] - run["loaded_rss_mb"]


def versus(run: dict, base: dict | None, keys: tuple[str, ...]) -> list[str]:
    """``run``'s value over the baseline run ``base``'s for each key (``"above"``: memory above
    the load), or "-" each without a baseline."""
    if base is None:
        return ["-"] * len(keys)

    def value(r: dict, key: str) -> float:
        return above_load_mb(r) if key == "above" else r[key]

    return [f"{value(run, k) / max(value(base, k), 1e-9):.3f}x" for k in keys]


def machine(threads: object) -> str:
    """torch's version, the CPUs, ``threads`` and the load average, for a table's first line."""
    import torch  # deferred: the benchmarks parse their arguments before torch loads

    return (f"torch {torch.__version__}, {os.cpu_count()} CPUs, {threads} threads, load average "
            f"{os.getloadavg()[0]:.1f}")


def measure_plan(plan: list[tuple[int, str]], measure: Any, base_arm: str, keys: tuple[str, ...],
                 columns: list[tuple[str, int]], line: Any) -> None:
    """Each ``(length, arm)`` of ``plan`` measured (``measure(length, arm)``) and printed as it
    comes, so a long run shows what it has, under the ``(name, width)`` ``columns``:
    ``line(length, arm, run, ratios)`` formats the row, the ratios (:func:`versus` of
    ``keys``) against the ``base_arm`` run of the same length."""
    print("".join(f"{name:<{-width}}" if width < 0 else f"{name:>{width}}"
                  for name, width in columns), flush=True)
    base: dict[int, dict] = {}
    for n, arm in plan:
        r = measure(n, arm)
        if arm == base_arm:
            base[n] = r
        print(line(n, arm, r, versus(r, base.get(n), keys)), flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


def find_data(data: Path | None, tmp: Path) -> Path:
    """``data``, or the LJSpeech sample beside the repository, else a demo corpus in ``tmp``."""
    if data is not None:
        if not data.exists():
            raise SystemExit(f"--data {data} does not exist; pass a dataset folder")
        return data
    if DEFAULT_DATA.exists():
        return DEFAULT_DATA
    from myxtts.synthetic import make_demo_data

    say(f"{DEFAULT_DATA} not found: using a generated demo corpus")
    return make_demo_data(tmp / "demo", speakers=4, utterances=40)


def prepare(data: Path | None, store: Path | None, tmp: Path, cfg: Any = None,
            note: str = "") -> tuple[Path, Path]:
    """A store of ``data`` (``find_data``) made with ``cfg`` (default: the default config),
    kept at ``store`` or made in ``tmp``."""
    from myxtts.config import Config
    from myxtts.data.prepare.build import prepare_store

    data = find_data(data, tmp)
    store = store or tmp / "store"
    say(f"preparing {data} -> {store}{note}")
    prepare_store(data, store, cfg or Config(), progress=False, echo=lambda s: None)
    return data, store


def header(data: Path, store: Path, extra: str) -> list[str]:
    import torch

    from myxtts.config import Config
    from myxtts.data.store import FeatureStore

    train = FeatureStore.open(store, "train", Config())
    minutes = float(train.mel_lengths.sum()) / Config().audio.frames_per_second / 60
    gpu = f", GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    return [f"data: {data} ({len(train)} train utterances, {minutes:.1f} min)",
            f"torch {torch.__version__}, {os.cpu_count()} CPUs, load average "
            f"{os.getloadavg()[0]:.1f}{gpu}", extra]


def table(names: list[str], rows: list[tuple[str, list[str]]], head: list[str],
          first: str = "preset", width: int = 0) -> str:
    width = width or max(22, *(len(n) for n in names))
    line = lambda label, cells: f"{label:<{LABEL}}" + "".join(f"{c:>{width}}" for c in cells)  # noqa: E731
    out = head + ["", line(first, names), "-" * (LABEL + width * len(names))]
    return "\n".join(out + [line(label, cells) for label, cells in rows])

