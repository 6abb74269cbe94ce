"""The CUDA half of ``train_step.py``: one preset as ``myxtts train`` runs it on a GPU.

Per preset:

1. cold warm-up, in a new process with empty compile caches and run folder: ``myxtts
   train``'s default run is built (``_trainer.Trainer``: the engine measures each bucket's
   batch size, ``data.batch_frames=auto``, then compiles and captures every shape): the
   seconds before a user's first step;
2. warm warm-up: the same in another new process with the caches and run folder of 1 (a
   restart: the sizes come from the run folder, the kernels from disk);
3. eager, compiled and graphed runs (``MODES``: config overrides of the default, each run
   measuring its own batch sizes as a user's run with those flags would) on pre-staged
   batches, one run after the other so only one model is on the GPU at a time (a graphed
   run's memory pool stays reserved while it lives): step time, utterances/s, mel frames/s,
   NVML utilisation, MFU from model FLOPs counted once per shape;
4. with the graphed run, its real input path against pre-staged batches
   (``_trainer.loader_ratio``) and its peak memory.

An arm that fails is reported as failed with its reason, not as a crash of the benchmark.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import common
from _trainer import Trainer, loader_ratio, staged_fetch

# each mode's overrides of the default run (graphed: `myxtts train` as it is on a GPU)
MODES = {"eager": ["train.compile=off", "train.cuda_graphs=off"],
         "compiled": ["train.compile=on", "train.cuda_graphs=off"],
         "graphed": []}


def _threads(args: argparse.Namespace) -> int:
    return args.threads if args.threads is not None else 0


def _cache_env(cache: Path) -> dict[str, str]:
    """Inductor's and Triton's caches under ``cache`` (inductor fixes Triton's folder once per
    process, so each preset's cold warm-up runs in its own process)."""
    return {"TORCHINDUCTOR_CACHE_DIR": str(cache), "TRITON_CACHE_DIR": str(cache / "triton")}


def warmup_main(args: argparse.Namespace) -> None:
    """``train_step.py --warmup-of PRESET``: what ``myxtts train`` does before step 1 (data,
    model, the engine's batch sizes, compile, capture: ``_trainer.Trainer``), timed, as one
    JSON line."""
    from myxtts.train.engine import compiled_graphs

    g0 = compiled_graphs()
    t = Trainer(args.store, args.warmup_of, args.batch_frames, args.set, _threads(args),
                args.run_dir)
    startup, report = t.engine.startup, t.report
    print(json.dumps({"total_s": t.setup_s, "sizing_s": startup.sizing_s if startup else 0.0,
                      "warmup_s": report.seconds if report else 0.0,
                      "graphs": compiled_graphs() - g0,
                      "captured": report.shapes_captured if report else 0,
                      "capture_error": report.capture_error if report else None,
                      "mode": t.engine.mode}))


def warmup_in_new_process(store: Path, preset: str, args: argparse.Namespace, run_dir: Path,
                          cache: Path) -> dict:
    cmd = [sys.executable, str(Path(__file__).with_name("train_step.py")), "--warmup-of", preset,
           "--store", str(store), "--run-dir", str(run_dir)]
    for item in args.set:
        cmd += ["--set", item]
    if args.batch_frames:
        cmd += ["--batch-frames", str(args.batch_frames)]
    if args.threads is not None:  # CPU kernels are compiled for a thread count
        cmd += ["--threads", str(args.threads)]
    started = time.perf_counter()
    left = getattr(args, "deadline", time.monotonic() + 420) - time.monotonic()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=max(30.0, min(420.0, left)),
                           env=dict(os.environ, **_cache_env(cache)))
        if r.returncode != 0:
            raise RuntimeError((r.stderr or r.stdout).strip().splitlines()[-1][:200])
        out = json.loads(r.stdout.strip().splitlines()[-1])
    except Exception as e:  # a failed arm is a table cell, not a crash
        return {"error": f"{type(e).__name__}: {str(e)[:160]}"}
    out["process_s"] = time.perf_counter() - started
    return out


def _release() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def measure_gpu(store: Path, preset: str, args: argparse.Namespace) -> dict:
    import torch

    from myxtts.observe.flops import StepFlops
    from myxtts.observe.gpu import GpuUtilSampler
    from myxtts.train.efficiency import meta_step_counter
    from myxtts.train.engine import reset_compiled

    cache = args.inductor_cache or args.tmp / f"inductor-{preset}"
    run_dir = args.tmp / f"run-{preset}"
    common.say(f"{preset}: cold warm-up in a new process (sizes, compile, capture)")
    out: dict[str, Any] = {"preset": preset,
                           "cold": warmup_in_new_process(store, preset, args, run_dir, cache)}
    common.say(f"{preset}: warm warm-up in a new process (same caches and run folder)")
    out["warm"] = warmup_in_new_process(store, preset, args, run_dir, cache)
    os.environ.update(_cache_env(cache))  # this process compiles from the warm caches
    reset_compiled()
    gpu = GpuUtilSampler(torch.device("cuda"))
    flops = staged = by_frequency = None
    for mode, sets in MODES.items():
        # graphed: the cold run's folder (its measured sizes); the others measure their own
        folder = run_dir if mode == "graphed" else args.tmp / f"run-{preset}-{mode}"
        torch.cuda.reset_peak_memory_stats()
        t = Trainer(store, preset, args.batch_frames, [*args.set, *sets], _threads(args), folder)
        accum = t.cfg.train.grad_accum_steps
        out.update(params_m=t.params_m, device=str(t.device), batch_frames=t.cfg.data.batch_frames)
        staged = t.stage()
        by_frequency = [k for k, _ in
                        Counter(k for k, _ in t.upcoming(len(t.data.sampler))).most_common()]
        flops = StepFlops(meta_step_counter(t.cfg, t.data.vocab_size, len(t.data.languages)))
        for key in by_frequency:
            flops(key)
        if t.report is not None and t.report.capture_error:
            out["capture_error"] = t.report.capture_error
        out[f"{mode}_is"] = t.engine.mode
        t.prime(staged, by_frequency)
        n, windows = args.steps * accum, []
        for r in range(args.rounds):
            sequence = [by_frequency[(r * n + i) % len(by_frequency)] for i in range(n)]
            windows.append(t.window(staged_fetch(staged, sequence), args.steps, flops, gpu))
        out[mode] = {k: common.median([w[k] for w in windows if k in w]) for k in windows[0]}
        out[f"{mode}_sizes"] = [(s.frames, s.batch) for s in sorted(t.shapes(), key=lambda s: s.frames)]
        common.say(f"{preset}: {mode} ({t.engine.mode}): {out[mode]['steps_per_s']:.2f} steps/s")
        if mode == "graphed":
            out["ratio"] = loader_ratio(t, staged, args.steps, args.rounds, 2, preset)
            out["workers"] = t.data.loader.num_workers
            out["peak_gib"] = torch.cuda.max_memory_allocated(t.device) / 2**30
            out["sizes"] = out["graphed_sizes"]
        staged = None
        t.close()
        _release()
    out["nvml"] = gpu.available
    return out


def rows(results: list[dict], peak_tflops: float) -> list[tuple[str, list[str]]]:
    def three(metric: str, fmt: str, scale: float = 1.0) -> list[str]:
        return [" / ".join(format(r[m][metric] / scale, fmt) if metric in r[m] else "-"
                           for m in MODES) for r in results]

    def warm_up(w: dict) -> str:
        if "error" in w:
            return f"failed: {w['error']}"
        text = (f"{w['total_s']:.0f} (sizes {w['sizing_s']:.0f}, compile/capture "
                f"{w['warmup_s']:.0f}; {w['graphs']} graphs, {w['captured']} captured)")
        return text + (" CAPTURE FAILED" if w["capture_error"] else "")

    return [
        ("parameters (M)", [f"{r['params_m']:.1f}" for r in results]),
        ("device / trainer's step", [f"{r['device']} {r['cold'].get('mode', '?')}" for r in results]),
        ("data.batch_frames / bucket shapes", [f"{r['batch_frames']} / {len(r['sizes'])}"
                                               for r in results]),
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
        ("set-up s cold: total (sizes, compile/capture)", [warm_up(r["cold"]) for r in results]),
        ("set-up s warm (restart, same caches)", [warm_up(r["warm"]) for r in results]),
        ("peak GPU memory GiB (graphed run)", [f"{r['peak_gib']:.1f}" for r in results]),
    ]


def notes(results: list[dict]) -> str:
    lines = ["batch sizes per bucket (T_mel:batch): " + "; ".join(
        f"{r['preset']} " + " ".join(f"{t}:{b}" for t, b in r["sizes"]) for r in results)]
    for r in results:
        modes = ", ".join(f"{m} ran {r[f'{m}_is']}" for m in MODES if r[f"{m}_is"] != m)
        if modes:
            lines.append(f"{r['preset']}: {modes}")
        if r.get("capture_error"):
            lines.append(f"{r['preset']}: CUDA graph capture failed: {r['capture_error']}")
    for r in results:
        for m in ("eager", "compiled"):
            if r.get(f"{m}_sizes") and r[f"{m}_sizes"] != r["sizes"]:
                lines.append(f"{r['preset']} {m} sizes: " + " ".join(
                    f"{t}:{b}" for t, b in r[f"{m}_sizes"]))
    lines.append("runs: eager (train.compile=off, train.cuda_graphs=off); compiled "
                 "(train.cuda_graphs=off: regional torch.compile of the transformer blocks); "
                 "graphed (myxtts train's default: compiled blocks and each bucket's whole step "
                 "replayed as a CUDA graph). Each run is built as myxtts train builds it and "
                 "measures its own batch sizes; runs are measured one after the other, one "
                 "model on the GPU at a time; set-up seconds are the trainer's in a new process.")
    return "\n".join(lines)
