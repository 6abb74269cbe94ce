"""The CUDA half of ``train_step.py``: one preset as ``myxtts train`` runs it on a GPU.

Per preset, in the order the trainer does it (``train.loop``):

1. cold warm-up: the compiled step measures each bucket's batch size (``data.batch_frames
   =auto``, ``train.budget``) and the warm-up compiles and captures every shape
   (``train.warmup``), with a fresh compile cache: the seconds before a user's first step;
2. warm warm-up: the same in a new process with the caches and run folder of 1 (a
   restart: the sizes come from the run folder's cache, the kernels from disk);
3. eager vs compiled vs graphed step (the same initial weights) on pre-staged batches at the
   measured sizes, interleaved windows: step time, utterances/s, mel frames/s, NVML
   utilisation, MFU from counted model FLOPs;
4. the trainer's real input path against pre-staged batches with the graphed step
   (``common.loader_ratio``);
5. peak GPU memory.

An arm that fails is reported as failed with its reason, not as a crash of the benchmark.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import common

MODES = ("eager", "compiled", "graphed")


def _threads(args: argparse.Namespace) -> int:
    return args.threads if args.threads is not None else 0


def cold_and_warm_up(t: common.Trainer, run_dir: Path) -> tuple[Any, dict]:
    """What ``train()`` does before step 1, timed: the graphed (compiled + captured) step."""
    from myxtts.train.compile import compiled_graphs
    from myxtts.train.step import resolve_graphs

    t0, g0 = time.perf_counter(), compiled_graphs()
    step = t.step(compiled=True)
    if t.auto:
        t.fit_auto(step, run_dir)
    t1 = time.perf_counter()
    graphs = resolve_graphs(t.cfg.train.cuda_graphs, t.device, step.dtype, False, step.fused)
    report = t.warm_up(step, graphs)
    t2 = time.perf_counter()
    return step, {"probe_s": t1 - t0, "warmup_s": t2 - t1, "total_s": t2 - t0,
                  "graphs": compiled_graphs() - g0, "captured": report.shapes_captured,
                  "capture_error": report.capture_error, "mode": step.mode}


def restart_main(args: argparse.Namespace) -> None:
    """``train_step.py --restart-of PRESET``: the warm-up of a restarted run, as one JSON line."""
    t = common.Trainer(args.store, args.restart_of, args.batch_frames, args.set, _threads(args))
    _, timing = cold_and_warm_up(t, args.run_dir)
    print(json.dumps(timing))


def warm_restart(store: Path, preset: str, args: argparse.Namespace, run_dir: Path,
                 cache: Path) -> dict:
    cmd = [sys.executable, str(Path(__file__).with_name("train_step.py")), "--restart-of", preset,
           "--store", str(store), "--run-dir", str(run_dir)]
    for item in args.set:
        cmd += ["--set", item]
    if args.batch_frames:
        cmd += ["--batch-frames", str(args.batch_frames)]
    if args.threads is not None:  # CPU kernels are compiled for a thread count
        cmd += ["--threads", str(args.threads)]
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache))
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        return json.loads(r.stdout.strip().splitlines()[-1])
    except Exception as e:  # a failed arm is a table cell, not a crash
        return {"error": f"{type(e).__name__}: {str(e)[:120]}"}


def measure_gpu(store: Path, preset: str, args: argparse.Namespace) -> dict:
    import torch

    from myxtts.observe.flops import StepFlops
    from myxtts.observe.gpu import GpuUtilSampler
    from myxtts.train.compile import reset_compiled

    reset_compiled()
    cache = args.inductor_cache or args.tmp / f"inductor-{preset}"
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
    run_dir = args.tmp / f"run-{preset}"
    t = common.Trainer(store, preset, args.batch_frames, args.set, _threads(args))
    if t.cuda:
        torch.cuda.reset_peak_memory_stats(t.device)
    common.say(f"{preset}: cold warm-up (measuring batch sizes, compiling, capturing)")
    graphed, cold = cold_and_warm_up(t, run_dir)
    out: dict[str, Any] = {"preset": preset, "params_m": t.params_m, "device": str(t.device),
                           "precision": str(graphed.dtype).split(".")[-1], "cold": cold,
                           "batch_frames": t.cfg.data.batch_frames,
                           "sizes": [(s.frames, s.batch) for s in sorted(t.shapes(), key=lambda s: s.frames)]}
    common.say(f"{preset}: cold warm-up {cold['total_s']:.1f} s; restarting for the warm one")
    out["warm"] = warm_restart(store, preset, args, run_dir, cache)
    staged = t.stage()
    steps = {"eager": t.step(compiled=False), "compiled": t.step(compiled=True), "graphed": graphed}
    by_frequency = [k for k, _ in Counter(k for k, _ in t.upcoming(len(t.data.sampler))).most_common()]
    eager = steps["eager"]
    flops = StepFlops(eager.loss, lambda: eager.model.zero_grad(set_to_none=False))
    for key in by_frequency:
        flops(staged[key][0])
    accum = t.cfg.train.grad_accum_steps
    for step in steps.values():  # one untimed pass over every shape (allocations, autotune)
        t.window(step, common.staged_fetch(staged, [k for k in by_frequency for _ in range(accum)]),
                 len(by_frequency))
    gpu = GpuUtilSampler(t.device)
    n = args.steps * accum
    windows: dict[str, list[dict]] = {m: [] for m in MODES}
    for r in range(args.rounds):
        sequence = [by_frequency[(r * n + i) % len(by_frequency)] for i in range(n)]
        for mode in MODES[r % 3:] + MODES[:r % 3]:
            windows[mode].append(t.window(steps[mode], common.staged_fetch(staged, sequence),
                                          args.steps, flops, gpu))
        common.say(f"{preset}: round {r + 1}/{args.rounds}: " + ", ".join(
            f"{m} {windows[m][-1]['steps_per_s']:.2f} steps/s" for m in MODES))
    for mode, ws in windows.items():
        out[mode] = {k: common.median([w[k] for w in ws if k in w]) for k in ws[0]}
    out["nvml"] = gpu.available
    out["ratio"] = common.loader_ratio(t, graphed, staged, args.steps, args.rounds, 2, preset)
    out["workers"] = t.data.loader.num_workers
    out["peak_gib"] = torch.cuda.max_memory_allocated(t.device) / 2**30 if t.cuda else float("nan")
    return out


def rows(results: list[dict], peak_tflops: float) -> list[tuple[str, list[str]]]:
    def three(metric: str, fmt: str, scale: float = 1.0) -> list[str]:
        return [" / ".join(format(r[m][metric] / scale, fmt) if metric in r[m] else "-"
                           for m in MODES) for r in results]

    def warm(r: dict) -> str:
        w = r["warm"]
        return f"failed: {w['error']}" if "error" in w else \
            f"{w['total_s']:.1f} ({w['graphs']} graphs, {w['captured']} captured)"

    def cold(r: dict) -> str:
        c = r["cold"]
        text = (f"{c['total_s']:.0f} = {c['probe_s']:.0f} + {c['warmup_s']:.0f} ({c['graphs']} "
                f"graphs, {c['captured']} captured)")
        return text + (" CAPTURE FAILED" if c["capture_error"] else "")

    return [
        ("parameters (M)", [f"{r['params_m']:.1f}" for r in results]),
        ("device / precision / trainer's step", [f"{r['device']} {r['precision']} {r['cold']['mode']}"
                                                 for r in results]),
        ("data.batch_frames / bucket shapes", [f"{r['batch_frames']} / {len(r['sizes'])}" for r in results]),
        ("step ms: eager / compiled / graphed", [" / ".join(f"{1e3 / r[m]['steps_per_s']:.1f}"
                                                            for m in MODES) for r in results]),
        ("utterances/s: eager / compiled / graphed", three("utt_per_s", ".0f")),
        ("mel frames/s: eager / compiled / graphed", three("frames_per_s", ".0f")),
        (f"MFU (peak {peak_tflops:g} TFLOP/s): e / c / g", three("tflops", ".1%", peak_tflops)),
        ("NVML GPU utilisation %: e / c / g", three("gpu_util", ".0f")),
        ("loader / pre-staged (graphed), median [min-max]",
         [common.spread(r["ratio"]["ratios"]) for r in results]),
        ("data-wait share: loader / loader workers",
         [f"{r['ratio']['loader']['wait_share']:.2%} / {r['workers']}" for r in results]),
        ("warm-up s cold: total = sizes + compile/capture", [cold(r) for r in results]),
        ("warm-up s warm (restart, same caches)", [warm(r) for r in results]),
        ("peak GPU memory GiB", [f"{r['peak_gib']:.1f}" for r in results]),
    ]


def notes(results: list[dict]) -> str:
    lines = ["batch sizes per bucket (T_mel:batch): " + "; ".join(
        f"{r['preset']} " + " ".join(f"{t}:{b}" for t, b in r["sizes"]) for r in results)]
    lines += [f"{r['preset']}: CUDA graph capture failed: {r['cold']['capture_error']}"
              for r in results if r["cold"]["capture_error"]]
    lines.append("step modes: eager; compiled (regional torch.compile of the transformer blocks); "
                 "graphed (compiled + the whole step replayed as CUDA graphs: the trainer's mode).")
    return "\n".join(lines)
