"""What grows with the corpus: prepare, verify and the start-up of ``myxtts train``, at
20,000 and 200,000 utterances (1,000,000 with ``--million``), with each cost's growth factor.

The corpus: 200 generated demo clips (8 voices), hard-linked into an LJSpeech folder of N
utterances (100 per speaker), so it costs a few MB of disk whatever N; the store it gives
is real (~32 KB of mels per utterance). Every command runs in a fresh process, as a user
runs it; its peak memory is split into anonymous and file-backed (``RssAnon``/``RssFile``
of ``/proc/PID/status``, sampled every 10 ms: file-backed is what a memory map of the store
adds to a process) and ``wait4``'s peak RSS of the process tree.

* prepare: ``myxtts prepare CORPUS --out STORE`` (every CPU), wall and peak RSS;
* verify: ``myxtts prepare --verify STORE`` (hashes and reads every byte), wall and peak;
* train: ``myxtts train STORE --max-steps 2`` (tiny on the CPU, a fresh run folder): the
  start-up (process start to the first optimizer step), the first step, and the memory at
  the first step. Cold: the store's pages evicted from the page cache first (``--cold``:
  ``fadvise``, POSIX_FADV_DONTNEED on every store file, the default; or ``drop-caches``,
  all of the machine's caches, root only), checked with mincore. Hot: the same command
  again. Old store: the manifest's finite-check record removed (a store from an older
  prepare), first start (reads the mels once, records the result) and the next.

    python benchmarks/scale.py --work /scratch/scale            # 20k and 200k, ~25 min on 2 cores
    python benchmarks/scale.py --work /scratch/scale --million  # adds 1M (~32 GB of store)
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

from common import say

SIZES = (20_000, 200_000)
MILLION = 1_000_000
PER_SPEAKER = 100
SOURCE = {"speakers": 8, "utterances": 25, "seed": 3}  # 200 distinct clips
MIB = 2**20
_LOW_BIT = bytes(b & 1 for b in range(256))

# Runs ``myxtts`` with its first training step timed: the first forward of any module (on
# the CPU nothing runs the model before step 1) to the first optimizer step's end, through
# torch's global hooks, so neither the package nor a restructured trainer needs a hook.
# argv: MARKS_FILE, then the CLI's arguments.
DRIVER = r"""
import json, sys, time
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook

def status():
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile", "RssShmem", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out

marks = {}

def forward(module, args):
    marks["first_step_start"], marks["at_first_step"] = time.time(), status()
    first_forward.remove()

def stepped(optimizer, args, kwargs):
    if "first_step_end" not in marks:
        marks["first_step_end"] = time.time()
        with open(sys.argv[1], "w") as fh:
            json.dump(marks, fh)

first_forward = register_module_forward_pre_hook(forward)
register_optimizer_step_post_hook(stepped)
from myxtts.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


# The parent imports neither torch nor numpy: Linux counts a child's RSS before its exec
# (the forked copy of this process) in its peak, so this process is kept small.
@dataclass
class Run:
    """One command's cost: wall seconds, peak RSS of its process tree (``wait4``), peak
    anonymous and file-backed RSS of its main process (sampled), and for train its marks."""

    wall_s: float
    peak_rss: int
    peak_anon: int = 0
    peak_file: int = 0
    marks: dict = field(default_factory=dict)
    t0: float = 0.0

    @property
    def startup_s(self) -> float:
        return self.marks["first_step_start"] - self.t0

    @property
    def first_step_s(self) -> float:
        return self.marks["first_step_end"] - self.marks["first_step_start"]


def _status(pid: int) -> tuple[int, int]:
    anon = file = 0
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("RssAnon:"):
                    anon = int(line.split()[1]) * 1024
                elif line.startswith("RssFile:"):
                    file = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return anon, file


def measure(args: list[str], marks: Path | None = None) -> Run:
    """Run ``python -m myxtts.cli.main ARGS`` (through ``DRIVER`` with ``marks``); fails
    loudly on a non-zero exit."""
    cmd = [sys.executable, "-c", DRIVER, str(marks), *args] if marks else \
        [sys.executable, "-m", "myxtts.cli.main", *args]
    peaks = [0, 0]
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            anon, file = _status(proc.pid)
            peaks[0], peaks[1] = max(peaks[0], anon), max(peaks[1], file)
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.time() - t0
    done.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}):\n{output.decode()[-3000:]}")
    run = Run(wall, usage.ru_maxrss * 1024, peaks[0], peaks[1], t0=t0)
    if marks:
        run.marks = json.loads(marks.read_text())
    return run


# ---------------------------------------------------------------- the corpus

def build_corpus(work: Path, n: int) -> Path:
    """An LJSpeech folder of ``n`` utterances hard-linked to the 200 source clips."""
    source = work / "source"
    if not (source / "metadata.csv").exists():
        measure(["make-demo-data", str(source), *(f"--{k}={v}" for k, v in SOURCE.items())])
    rows = [line.split("|") for line in (source / "metadata.csv").read_text().splitlines()]
    out = work / f"corpus-{n}"
    if (out / "metadata.csv").exists():
        return out
    (out / "wavs").mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        uid, text = rows[i % len(rows)][:2]
        new = f"u{i:07d}"
        target = out / "wavs" / f"{new}.wav"
        if not target.exists():
            os.link(source / "wavs" / f"{uid}.wav", target)
        lines.append(f"{new}|{text}|{text}|s{i // PER_SPEAKER:05d}")
    (out / "metadata.csv").write_text("\n".join(lines) + "\n")
    return out


def store_files(store: Path) -> list[Path]:
    return [p for p in store.rglob("*") if p.is_file()]


def evict(store: Path, method: str) -> float:
    """Drop the store's pages from the page cache; returns the share still resident."""
    os.sync()
    if method == "drop-caches":
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    else:
        for f in store_files(store):
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return resident_share(store)


def resident_share(store: Path) -> float:
    """Share of the store's bytes in the page cache: ``mincore`` over a map of each file
    (mapping faults nothing in)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    resident = total = 0
    for f in store_files(store):
        size = f.stat().st_size
        if size == 0:
            continue
        fd = os.open(f, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), f"mmap {f}")
            vec = (ctypes.c_ubyte * -(-size // mmap.PAGESIZE))()
            try:
                if libc.mincore(addr, size, vec) != 0:
                    raise OSError(ctypes.get_errno(), f"mincore {f}")
            finally:
                libc.munmap(addr, size)
        finally:
            os.close(fd)
        resident += bytes(vec).translate(_LOW_BIT).count(1)  # bit 0: page resident
        total += size
    return min(1.0, resident * mmap.PAGESIZE / max(total, 1))


# ---------------------------------------------------------------- one size

def drop_record(store: Path) -> None:
    """The store as an older prepare left it: no finite-check record in its manifest."""
    manifest = json.loads((store / "manifest.json").read_text())
    manifest.pop("finite_check", None)
    (store / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")


def measure_size(work: Path, n: int, cold: str, reuse: bool) -> dict[str, object]:
    corpus = build_corpus(work, n)
    store = work / f"store-{n}"
    out: dict[str, object] = {"n": n}
    if reuse and (store / "manifest.json").exists():
        say(f"{n}: reusing {store}")
    else:
        shutil.rmtree(store, ignore_errors=True)
        say(f"{n}: prepare {corpus} -> {store}")
        out["prepare"] = measure(["prepare", str(corpus), "--out", str(store), "--quiet"])
    out["store_bytes"] = sum(f.stat().st_size for f in store_files(store))
    say(f"{n}: verify")
    out["verify"] = measure(["prepare", "--verify", str(store)])
    train = ["train", str(store), "--max-steps", "2", "--model-size", "tiny", "--set",
             "train.device=cpu", "--set", "train.tensorboard=false"]
    runs = work / f"runs-{n}"
    shutil.rmtree(runs, ignore_errors=True)

    def start(name: str) -> Run:
        return measure([*train, "--output-dir", str(runs / name)], runs / f"{name}.json")

    runs.mkdir(parents=True)
    out["resident_before_cold"] = evict(store, cold)
    say(f"{n}: train, cold ({out['resident_before_cold']:.1%} of the store cached)")
    out["cold"] = start("cold")
    say(f"{n}: train, hot")
    out["hot"] = min((start("hot1"), start("hot2")), key=lambda r: r.startup_s)
    manifest = (store / "manifest.json").read_bytes()
    try:
        drop_record(store)
        say(f"{n}: train, a store without the record: first start, then the next")
        out["old_first"] = start("old1")
        out["old_next"] = start("old2")
    finally:
        (store / "manifest.json").write_bytes(manifest)
    return out


# ---------------------------------------------------------------- the table

def _mb(x: float) -> str:
    return f"{x / MIB:,.0f}"


def _s(x: float) -> str:
    return f"{x:.2f}"


# (label, what is measured: "store_bytes", "prepare.KEY", a command's "RUN.FIELD" or
# "at_step.KEY" (the hot run's /proc status at step 1), and how it prints)
SPEC = """\
store size (GB)                                  | store_bytes          | GB
prepare: wall s                                  | prepare.wall_s       | s
prepare: peak RSS MB (largest process)           | prepare.peak_rss     | MB
verify: wall s                                   | verify.wall_s        | s
verify: peak RSS MB                              | verify.peak_rss      | MB
verify: peak anonymous MB                        | verify.peak_anon     | MB
verify: peak file-backed MB                      | verify.peak_file     | MB
train start-up s, hot (process start -> step 1)  | hot.startup_s        | s
train start-up s, cold                           | cold.startup_s       | s
train first step s (hot)                         | hot.first_step_s     | s
train whole command s (hot: 2 steps, val, save)  | hot.wall_s           | s
train RSS at step 1: anonymous MB (hot)          | at_step.RssAnon      | MB
train RSS at step 1: file-backed MB (hot)        | at_step.RssFile      | MB
train peak anonymous MB (hot, whole command)     | hot.peak_anon        | MB
train peak file-backed MB (hot, whole command)   | hot.peak_file        | MB
train peak file-backed MB (cold, whole command)  | cold.peak_file       | MB
no record (older store): start-up s, 1st start   | old_first.startup_s  | s
no record (older store): start-up s, 2nd start   | old_next.startup_s   | s
"""
FORMATS = {"GB": lambda v: f"{v / 1e9:.2f}", "MB": _mb, "s": _s}


def _value(r: dict[str, object], what: str) -> float | None:
    """One measurement of a size's results, named as in ``SPEC``."""
    if what == "store_bytes":
        return r["store_bytes"]
    role, key = what.split(".")
    if role == "prepare":  # not measured when the store was reused
        return getattr(r["prepare"], key) if "prepare" in r else None
    if role == "at_step":
        return r["hot"].marks["at_first_step"][key]
    return getattr(r[role], key)


def rows(results: list[dict[str, object]]) -> list[tuple[str, list[str], str]]:
    """``(label, value per size, growth: the last size's value over the first's)``."""
    spec = [[part.strip() for part in line.split("|")] for line in SPEC.splitlines()]
    out = []
    for label, what, unit in spec:
        values = [_value(r, what) for r in results]
        cells = ["-" if v is None else FORMATS[unit](v) for v in values]
        a, b = values[0], values[-1]
        growth = f"{b / a:.2f}x" if len(values) > 1 and a and b is not None else "-"
        out.append((label, cells, growth))
    return out


def render(results: list[dict[str, object]], head: list[str]) -> str:
    names = [f"{r['n']:,}" for r in results]
    label_w, width = 52, 12
    fmt = lambda label, cells, last: (f"{label:<{label_w}}" + "".join(  # noqa: E731
        f"{c:>{width}}" for c in cells) + f"{last:>10}")
    lines = head + ["", fmt("utterances", names, "growth"), "-" * (label_w + width * len(names) + 10)]
    lines += [fmt(*row) for row in rows(results)]
    lines.append(f"growth: the value at {names[-1]} utterances over the value at {names[0]}.")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, help="scratch folder for corpora, stores and runs "
                   "(default: a temporary folder, deleted at the end)")
    p.add_argument("--million", action="store_true", help="also 1,000,000 utterances "
                   "(~32 GB of store, twice that while prepare packs)")
    p.add_argument("--sizes", default=",".join(map(str, SIZES)),
                   help="comma-separated corpus sizes (default: 20000,200000)")
    p.add_argument("--cold", choices=("fadvise", "drop-caches"), default="fadvise",
                   help="how the cold start empties the page cache (drop-caches needs root)")
    p.add_argument("--reuse-stores", action="store_true",
                   help="keep complete stores already in --work (prepare is not measured)")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")] + ([MILLION] if args.million else [])
    work = args.work or Path(tempfile.mkdtemp(prefix="myxtts-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    head = [f"torch {version('torch')}, {os.cpu_count()} CPUs, load average "
            f"{os.getloadavg()[0]:.1f}; corpus: {SOURCE['speakers'] * SOURCE['utterances']} "
            f"demo clips hard-linked, {PER_SPEAKER} utterances per speaker",
            f"cold start: {args.cold} ({'POSIX_FADV_DONTNEED on every store file' if args.cold == 'fadvise' else '/proc/sys/vm/drop_caches = 3'})"]
    try:
        results = []
        for n in sizes:
            results.append(measure_size(work, n, args.cold, args.reuse_stores))
            head_n = [*head, "store resident before the cold starts: " + ", ".join(
                f"{r['n']:,}: {r['resident_before_cold']:.1%}" for r in results)]
            say("\n" + render(results, head_n))
        print(render(results, head_n))
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
