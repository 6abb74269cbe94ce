"""Every GPU figure the README lacks, and the GPU tests, in one command of about 8 minutes.

    python benchmarks/gpu_acceptance.py [--data DIR] [--json FILE] [--budget-s 480]
        [--parts NAME,...] [--work DIR] [--dry-run]

The parts run in this order, each in processes of its own with its own deadline: a part
that runs over is stopped and reported as such, and the next one starts on time. The
table is printed again as each part finishes, and the JSON file (``--json``; default
``$OUT/gpu_acceptance.json`` where ``OUT`` is set, else ``gpu_acceptance.json``) is
rewritten then, so a run cut short keeps what it measured.

1. store: ``myxtts prepare DATA`` (``--data``; default ../shared/data/ljspeech-mini, or
   generated demo data where that is absent).
2. train: ``myxtts train STORE --model-size base`` at its defaults (auto batch sizes,
   compiled blocks, CUDA graphs, bf16) with fresh compile caches, stopped by SIGTERM at its
   deadline (it writes a checkpoint and exits): the cold warm-up (seconds from the process
   start to the warm-up's summary line, and the warm-up's own seconds), then over the
   logged intervals after the first one NVML utilisation, MFU, mel frames/s and the
   data-wait share, and NVML sampled by this script over the whole process.
3. restart: the same command again, which resumes: batch sizes from the run folder,
   kernels from the caches: the warm warm-up and the same figures.
4. loader: ``benchmarks/input_ratio.py --presets base``: the real loader against pre-staged
   batches with the graphed step.
5. save: ``benchmarks/checkpoint_save.py --preset base --device cuda``: the step gap a
   checkpoint save adds, synchronous and in the background.
6. demo: ``myxtts demo``: its training time (its [3/4] line to its [4/4] line), the whole
   command, and the tiny model's NVML utilisation from its metrics.
7. xtts: ``benchmarks/xtts_decode.py --size released --device cuda``: XTTS-v2's GPT step
   in ms per code, eager against replayed as a CUDA graph (codes checked equal), float32
   and bfloat16, the blocks' projections alone on one row (the weights read once), and
   its HiFi-GAN decoder's seconds per second of audio; seeded random
   weights, no files (nothing to carry but the code).
8. tests: ``pytest -m gpu``, tests/gpu/test_capture_safety.py and test_engine_gpu.py first,
   then every other gpu-marked test: counts and the names of failures. It gets whatever
   the budget has left, never less than its deadline.

One part runs only when named (``--parts xtts-finetune``, a device call of its own: it
does not fit beside the others in one call of 10 minutes):

9. xtts-finetune: ``benchmarks/xtts_finetune_gpu.py`` at the released size: XTTS-v2's GPT
   fine-tuned on a store of the data, as ``myxtts train --init-from`` runs it (auto batch
   sizes, compiled blocks, CUDA graphs, bf16): the run's warm-up, steps/s, NVML
   utilisation and MFU, the loader against pre-staged batches.

``--dry-run`` prints the parts, their deadlines and commands, and runs nothing.

On a machine without network (the wheels it lacks copied into an ignored ``.whl/``, the
data into an ignored ``.data/``)::

    python3 -m pip install -q --no-index --no-deps --target .site .whl/*.whl
    export PYTHONPATH=$PWD/.site:$PWD/src:$PWD PYTHONUNBUFFERED=1
    python3 benchmarks/gpu_acceptance.py --data .data/ljspeech-mini
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import common

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "myxtts.cli.main"]
BENCH = Path(__file__).resolve().parent
FIRST_TESTS = ["tests/gpu/test_capture_safety.py", "tests/gpu/test_engine_gpu.py"]
# seconds each part may take (the tests part: at least this, or what the budget has left)
DEADLINES = {"store": 25, "train": 125, "restart": 50, "loader": 50, "save": 40, "demo": 70,
             "xtts": 25, "tests": 95, "xtts-finetune": 480}
ON_REQUEST = ("xtts-finetune",)  # run only when --parts names them
STOP_GRACE_S = 25  # a stopped training run's time to write its checkpoint and exit


@dataclass
class Ran:
    """One process's run: exit code (None: killed), seconds, whether it ran past its
    deadline, and its output lines with the seconds since its start."""

    rc: int | None
    seconds: float
    over: bool
    lines: list[tuple[float, str]] = field(default_factory=list)

    def first(self, pattern: str) -> tuple[float, re.Match] | None:
        """The first line matching ``pattern``: (seconds since start, match)."""
        for t, line in self.lines:
            found = re.search(pattern, line)
            if found:
                return t, found
        return None

    def tail(self, n: int = 25) -> list[str]:
        return [line for _, line in self.lines[-n:]]


def run(cmd: list[str], deadline: float, env: dict, log, cwd: Path | None = None,
        stop_at: float | None = None, grace: float = STOP_GRACE_S) -> Ran:
    """Run ``cmd`` (its own process group), its output to ``log`` as it comes. At ``stop_at``
    seconds it is sent SIGTERM (a planned stop, not counted as over); at ``deadline`` SIGTERM
    if still running (SIGKILL after a planned stop), SIGKILL ``grace`` seconds later."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=cwd, start_new_session=True, errors="replace")
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append((time.monotonic() - start, line.rstrip()))
            log.write(line)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    over, signalled = False, False
    for limit in ([stop_at] if stop_at else []) + [deadline, deadline + grace]:
        try:
            proc.wait(timeout=max(0.0, limit - (time.monotonic() - start)))
            break
        except subprocess.TimeoutExpired:
            over = limit != stop_at
            sig = signal.SIGKILL if signalled and limit != stop_at else signal.SIGTERM
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            signalled = True
    proc.wait()
    reader.join(timeout=5)
    log.flush()
    return Ran(proc.returncode if proc.returncode is not None and proc.returncode >= 0
               else None, time.monotonic() - start, over, lines)


def metrics(run_dir: Path, fps: float) -> dict:
    """Means over a run's logged intervals after its first (which holds the first steps'
    allocations): NVML utilisation, MFU, mel frames/s, data-wait share; and the steps."""
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
    rows = [r for r in rows if "train/steps_per_s" in r]
    steady = rows[1:] if len(rows) > 1 else rows

    def mean(key: str, scale: float = 1.0) -> float | None:
        values = [r[key] * scale for r in steady if key in r]
        return round(sum(values) / len(values), 4) if values else None

    return {"intervals": len(steady), "last_step": rows[-1]["step"] if rows else 0,
            "gpu_util_pct": mean("train/gpu_util"), "mfu": mean("train/mfu"),
            "mel_frames_per_s": mean("train/audio_s_per_s", fps),
            "steps_per_s": mean("train/steps_per_s"),
            "data_wait_share": mean("train/data_wait_share")}


def warm_up_figures(ran: Ran) -> dict:
    """From a training run's output: seconds from the process start to the warm-up's summary
    line (about step 1), the warm-up's own seconds and what it did."""
    found = ran.first(r"warm-up: (\d+) bucket shapes in ([\d.]+) s \((.*)\); (\w+) step")
    if found is None:
        return {"to_step_1_s": None}
    t, m = found
    return {"to_step_1_s": round(t, 1), "warmup_s": float(m.group(2)), "shapes": int(m.group(1)),
            "did": m.group(3), "step_mode": m.group(4)}


def row_of(ran: Ran, label: str) -> str | None:
    """A benchmark table's row (its values, as printed) by the start of its label."""
    for _, line in ran.lines:
        if line.startswith(label):
            return line[len(label):].strip()
    return None


class Acceptance:
    """The parts (module docstring), their figures and the table."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = args.work or Path(tempfile.gettempdir()) / f"myxtts-gpu-acceptance-{os.getpid()}"
        self.store = self.work / "store"
        self.run_dir = self.work / "run-base"
        cache = self.work / "compile-cache"
        path = os.pathsep.join(p for p in (str(REPO / "src"), str(REPO),
                                           os.environ.get("PYTHONPATH", "")) if p)
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=path,
                        TORCHINDUCTOR_CACHE_DIR=str(cache), TRITON_CACHE_DIR=str(cache / "triton"))
        self.results: dict = {"budget_s": args.budget_s, "parts": {}}
        self.started = time.monotonic()

    def commands(self) -> dict[str, list[list[str]]]:
        train = [*CLI, "train", str(self.store), "--model-size", "base", "--output-dir",
                 str(self.run_dir), "--quiet"]
        py = sys.executable
        return {
            "store": [[*CLI, "prepare", str(self.data()), "--out", str(self.store)]],
            "train": [train], "restart": [train],
            "loader": [[py, str(BENCH / "input_ratio.py"), "--presets", "base", "--store",
                        str(self.store), "--steps", "20", "--rounds", "2"]],
            "save": [[py, str(BENCH / "checkpoint_save.py"), "--preset", "base", "--device",
                      "cuda", "--steps", "12", "--every", "6"]],
            "demo": [[*CLI, "demo", "--quiet"]],
            "xtts": [[py, str(BENCH / "xtts_decode.py"), "--size", "released", "--device", "cuda",
                      "--codes", "60"]],
            "xtts-finetune": [[py, str(BENCH / "xtts_finetune_gpu.py"), "--data", str(self.data()),
                               "--steps", "20", "--rounds", "2"]],
            "tests": [[py, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                       *FIRST_TESTS],
                      [py, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                       "tests", *(f"--deselect={t}" for t in FIRST_TESTS)]],
        }

    def data(self) -> Path:
        if self.args.data:
            return self.args.data
        return common.DEFAULT_DATA if common.DEFAULT_DATA.is_dir() else self.work / "demo-data"

    def part(self, name: str, log) -> dict:
        """Run one part; its figures."""
        cmds, deadline = self.commands()[name], DEADLINES[name]
        if name in ("store", "xtts-finetune") and not self.data().is_dir():
            run([*CLI, "make-demo-data", str(self.data())], deadline, self.env, log)
        if name in ("train", "restart"):
            return self.training(cmds[0], deadline, log)
        if name == "tests":
            return self.tests(cmds, log)
        cwd = self.work / "demo" if name == "demo" else None
        if cwd is not None:
            cwd.mkdir(exist_ok=True)
        ran = run(cmds[0], deadline, self.env, log, cwd=cwd)
        out: dict = {"rc": ran.rc, "seconds": round(ran.seconds, 1), "over": ran.over,
                     "tail": ran.tail()}
        if name == "loader":
            out.update(ratio=row_of(ran, "RATIO loader / pre-staged"),
                       steps_per_s=row_of(ran, "steps/s: loader / pre-staged"),
                       data_wait=row_of(ran, "data-wait share: loader / pre-staged"),
                       mode=row_of(ran, "device / threads / step mode"))
        elif name == "save":
            out.update(gap_ms=row_of(ran, "gap a save adds ms"),
                       gap_vs_sync=row_of(ran, "gap vs synchronous"),
                       equal=row_of(ran, "saves / checkpoints equal the state"))
        elif name == "xtts":
            out.update({key: row_of(ran, label) for key, label in (
                ("eager_fp32", "GPT step, eager, float32 (ms per code)"),
                ("graph_fp32", "GPT step, CUDA graph, float32 (ms per code)"),
                ("eager_bf16", "GPT step, eager, bfloat16 (ms per code)"),
                ("graph_bf16", "GPT step, CUDA graph, bfloat16 (ms per code)"),
                ("floor_fp32", "  its projections alone, one row (ms per code)"),
                ("hifigan", "HiFi-GAN decoder (s per s of audio)"))})
        elif name == "xtts-finetune":
            out.update({key: row_of(ran, label) for key, label in (
                ("ready_s", "run ready in s (warm-up included) / store prepared in s"),
                ("batch_sizes", "batch size per bucket"),
                ("steps_per_s", "steps/s: loader / pre-staged"),
                ("gpu_util", "GPU utilisation (NVML) %: loader / pre-staged"),
                ("mfu", "MFU: loader / pre-staged"),
                ("ratio", "RATIO loader / pre-staged, median [min-max]"))})
        elif name == "demo":
            begin, end = ran.first(r"^\[3/4\]"), ran.first(r"^\[4/4\]")
            out["training_s"] = round(end[0] - begin[0], 1) if begin and end else None
            run_dirs = sorted((self.work / "demo").glob("*/run"))
            if run_dirs:
                out["tiny_gpu_util_pct"] = metrics(run_dirs[0], self.fps())["gpu_util_pct"]
        return out

    def fps(self) -> float:
        from myxtts.config import load_config  # deferred: the dry run needs no torch

        return load_config().audio.frames_per_second

    def training(self, cmd: list[str], deadline: float, log) -> dict:
        from myxtts.observe.gpu import GpuUtilSampler  # deferred: the dry run needs no torch

        sampler = GpuUtilSampler("cuda", period_s=0.2)
        sampler.start()
        ran = run(cmd, deadline, self.env, log, stop_at=deadline - STOP_GRACE_S)
        whole = sampler.stop()
        out = {"rc": ran.rc, "seconds": round(ran.seconds, 1), "over": ran.over,
               "nvml_whole_process_pct": None if whole is None else round(whole, 1),
               **warm_up_figures(ran), **metrics(self.run_dir, self.fps()),
               "tail": ran.tail()}
        return out

    def tests(self, cmds: list[list[str]], log) -> dict:
        left = self.args.budget_s - (time.monotonic() - self.started)
        deadline = max(DEADLINES["tests"], left)
        out: dict = {"deadline_s": round(deadline), "runs": []}
        for cmd in cmds:
            spent = sum(r["seconds"] for r in out["runs"])
            if deadline - spent < 20:
                out["runs"].append({"skipped": "no time left"})
                continue
            ran = run(cmd, deadline - spent, self.env, log, cwd=REPO)
            summary = next((line for _, line in reversed(ran.lines)
                            if re.search(r"\d+ (passed|failed|skipped|error)", line)), None)
            failed = [line.split(" ", 1)[1] for _, line in ran.lines
                      if line.startswith(("FAILED ", "ERROR "))]
            out["runs"].append({"rc": ran.rc, "seconds": round(ran.seconds, 1), "over": ran.over,
                                "summary": summary, "failed": failed})
        return out

    def table(self) -> str:
        parts = self.results["parts"]

        def get(part: str, key: str, fmt: str = "{}") -> str:
            value = parts.get(part, {}).get(key)
            return "-" if value is None else fmt.format(value)

        def tests() -> str:
            runs = parts.get("tests", {}).get("runs", [])
            return "; ".join(r.get("summary") or r.get("skipped") or f"rc {r.get('rc')}"
                             for r in runs) or "-"

        rows = [
            ("NVML GPU utilisation %, train / restart", ">= 95",
             f"{get('train', 'gpu_util_pct', '{:.1f}')} / {get('restart', 'gpu_util_pct', '{:.1f}')}"),
            ("NVML % over the whole process, train / restart", "-",
             f"{get('train', 'nvml_whole_process_pct')} / {get('restart', 'nvml_whole_process_pct')}"),
            ("MFU, train / restart", ">= 0.35",
             f"{get('train', 'mfu', '{:.3f}')} / {get('restart', 'mfu', '{:.3f}')}"),
            ("mel frames/s, train / restart", ">= 1,000,000",
             f"{get('train', 'mel_frames_per_s', '{:,.0f}')} / "
             f"{get('restart', 'mel_frames_per_s', '{:,.0f}')}"),
            ("data-wait share, train / restart", "-",
             f"{get('train', 'data_wait_share', '{:.3f}')} / "
             f"{get('restart', 'data_wait_share', '{:.3f}')}"),
            ("start to step 1 s, cold / warm", "<= 60 / <= 10",
             f"{get('train', 'to_step_1_s')} / {get('restart', 'to_step_1_s')}"),
            ("warm-up alone s, cold / warm", "-",
             f"{get('train', 'warmup_s')} / {get('restart', 'warmup_s')}"),
            ("loader / pre-staged (median [min-max])", ">= 0.99", get("loader", "ratio")),
            ("save gap ms: synchronous / background", "hidden", get("save", "gap_ms")),
            ("myxtts demo: training s / whole s", "<= 60",
             f"{get('demo', 'training_s')} / {get('demo', 'seconds')}"),
            ("tiny (demo) NVML utilisation %", ">= 60", get("demo", "tiny_gpu_util_pct")),
            ("XTTS-v2 ms/code: eager / graph (fp32)", "-",
             f"{get('xtts', 'eager_fp32')} / {get('xtts', 'graph_fp32')}"),
            ("XTTS-v2 ms/code: eager / graph (bf16)", "-",
             f"{get('xtts', 'eager_bf16')} / {get('xtts', 'graph_bf16')}"),
            ("XTTS-v2 ms/code: projections alone (fp32)", "-", get("xtts", "floor_fp32")),
            ("XTTS-v2 HiFi-GAN s per s of audio", "-", get("xtts", "hifigan")),
            ("pytest -m gpu (first files; the rest)", "all pass", tests()),
        ]
        if "xtts-finetune" in parts:
            rows += [
                ("XTTS-v2 fine-tuning: ready s / store s", "-", get("xtts-finetune", "ready_s")),
                ("XTTS-v2 fine-tuning steps/s: loader / staged", "-",
                 get("xtts-finetune", "steps_per_s")),
                ("XTTS-v2 fine-tuning NVML %: loader / staged", ">= 95",
                 get("xtts-finetune", "gpu_util")),
                ("XTTS-v2 fine-tuning MFU: loader / staged", "-", get("xtts-finetune", "mfu")),
                ("XTTS-v2 fine-tuning loader / pre-staged", ">= 0.99",
                 get("xtts-finetune", "ratio"))]
        head = f"{'figure':<48} {'target':>14}  measured"
        return "\n".join([head, "-" * 100] + [f"{a:<48} {b:>14}  {c}" for a, b, c in rows])

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.results, indent=1, default=str) + "\n")
        tmp.replace(path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, help="dataset for the store (default: ljspeech-mini "
                   "beside the checkout, else generated demo data)")
    p.add_argument("--json", type=Path, help="the JSON written after each part (default "
                   "$OUT/gpu_acceptance.json, else ./gpu_acceptance.json)")
    p.add_argument("--budget-s", type=float, default=480,
                   help="seconds for the whole run; the tests part gets what is left (default 480)")
    p.add_argument("--parts", help=f"comma-separated, of {','.join(DEADLINES)} (default all "
                   f"but {', '.join(ON_REQUEST)})")
    p.add_argument("--work", type=Path, help="scratch folder (default: a new temporary one)")
    p.add_argument("--dry-run", action="store_true", help="print the parts, deadlines and "
                   "commands; run nothing")
    args = p.parse_args()
    names = args.parts.split(",") if args.parts else [n for n in DEADLINES if n not in ON_REQUEST]
    unknown = [n for n in names if n not in DEADLINES]
    if unknown:
        p.error(f"unknown part(s) {unknown}; the parts are {', '.join(DEADLINES)}")
    acc = Acceptance(args)
    if args.dry_run:
        total = 0
        for name in names:
            total += DEADLINES[name]
            print(f"{name:<8} deadline {DEADLINES[name]:>4} s"
                  + (" (or what the budget has left)" if name == "tests" else ""))
            for cmd in acc.commands()[name]:
                print("         " + " ".join(cmd))
        print(f"deadlines add up to {total} s; budget {args.budget_s:g} s")
        return
    out = args.json or Path(os.environ.get("OUT", ".")) / "gpu_acceptance.json"
    import torch

    if not torch.cuda.is_available():
        sys.exit("gpu_acceptance.py measures a CUDA GPU and finds none; --dry-run shows its parts")
    acc.results.update(device=torch.cuda.get_device_name(0), torch=torch.__version__,
                       python=sys.version.split()[0], started=time.strftime("%Y-%m-%d %H:%M:%S"))
    acc.work.mkdir(parents=True, exist_ok=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".log"), "w", encoding="utf-8") as log:
        for name in names:
            common.say(f"{name}: starting (deadline {DEADLINES[name]} s)")
            t0 = time.monotonic()
            try:
                acc.results["parts"][name] = acc.part(name, log)
            except Exception as e:  # one part failing must not lose the others' figures
                acc.results["parts"][name] = {"error": f"{type(e).__name__}: {e}"}
            acc.results["parts"][name]["wall_s"] = round(time.monotonic() - t0, 1)
            acc.results["elapsed_s"] = round(time.monotonic() - acc.started, 1)
            acc.write(out)
            print(f"\n[after {name}, {acc.results['elapsed_s']:.0f} s]\n{acc.table()}", flush=True)
    print(f"\nJSON: {out}")


if __name__ == "__main__":
    main()
