"""How fast is the training step itself? Eager vs compiled, and how much of the device it uses.

    python benchmarks/train_step.py [--presets tiny,small] [--steps N] [--rounds R]
        [--compile-presets LIST | --skip-compile] [--compile-shapes K] [--flops]
        [--peak-tflops 989] [--inductor-cache DIR] [--data DIR | --store DIR]
        [--batch-frames N] [--threads N] [--set section.key=value]

Per preset, on pre-staged batches (one per bucket shape, already in device memory: the
input pipeline is ``input_ratio.py``'s subject, not this one's), the same ``TrainStep``
as the trainer, from the same initial weights:

* eager vs compiled (``torch.compile`` as the trainer does it: one static graph per bucket
  shape): step time in interleaved windows (A/B, B/A, ...; medians, per-round speed-up),
  utterances/s and mel frames/s;
* compile warm-up: seconds to compile the shapes, cold (a fresh inductor cache unless
  ``--inductor-cache``), graphs compiled then and any compiled during the timed windows
  (recompiles: should be 0);
* model FLOPs per step (``myxtts.observe.flops``: counted once per shape, attention through
  the math kernel), achieved TFLOP/s, and on CUDA MFU against ``--peak-tflops`` (989: dense
  bf16 of an H100/H200), NVML GPU utilisation (``myxtts.observe.gpu``, with nvidia-ml-py)
  and peak memory.

CPU defaults (2-core machine, ~3 min): presets tiny and small at small budgets, one torch
thread (see ``input_ratio.py``), compiled only for tiny and then on its most frequent shape only
(a cold inductor compile of one shape takes ~1.5 minutes there; ``--compile-shapes 0``
compiles all); eager-only presets are measured on all shapes. GPU defaults: tiny, small, base at the config's budget, every shape compiled.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

import common

EAGER, COMPILED = "eager", "compiled"


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def measure(store: Path, preset: str, args: argparse.Namespace, cuda: bool) -> dict:
    import torch

    from myxtts.observe.flops import StepFlops
    from myxtts.observe.gpu import GpuUtilSampler
    from myxtts.train.step import resolve_precision

    torch._dynamo.reset()
    bf = args.batch_frames or (None if cuda else common.CPU_BATCH_FRAMES[preset])
    t = common.Trainer(store, preset, bf, args.set, args.threads if args.threads is not None else (0 if cuda else 1))
    staged = t.stage()
    accum = t.cfg.train.grad_accum_steps
    by_frequency = [k for k, _ in Counter(k for k, _ in t.upcoming(len(t.data.sampler))).most_common()]
    k = args.compile_shapes if args.compile_shapes is not None else (0 if cuda else 1)
    compiles = preset in args.compile_presets
    keys = by_frequency if k <= 0 or not compiles else by_frequency[:k]
    steps = {EAGER: t.step(compiled=False)}
    flops = None
    if cuda or args.flops:
        flops = StepFlops(steps[EAGER].loss, lambda: steps[EAGER].model.zero_grad(set_to_none=True))
        for key in keys:
            flops(staged[key][0])
    out: dict = {"preset": preset, "params_m": t.params_m, "device": str(t.device),
                 "precision": str(resolve_precision(t.cfg.train.precision, t.device)).split(".")[-1],
                 "threads": torch.get_num_threads(), "batch_frames": t.cfg.data.batch_frames,
                 "shapes": len(staged), "measured_shapes": len(keys)}
    if compiles:
        g0 = _graphs()
        start = time.perf_counter()
        steps[COMPILED] = t.step(compiled=True)
        t.window(steps[COMPILED], common.staged_fetch(staged, [x for x in keys for _ in range(accum)]), len(keys))
        out["warmup_s"], out["graphs_warmup"] = time.perf_counter() - start, _graphs() - g0
        common.say(f"{preset}: compiled {len(keys)} shape(s) in {out['warmup_s']:.0f} s")
    t.window(steps[EAGER], common.staged_fetch(staged, [x for x in keys for _ in range(accum)]), len(keys))
    g1 = _graphs()
    gpu = GpuUtilSampler(t.device) if cuda else None
    cycle = [x for x in by_frequency if x in keys]
    n = args.steps * accum
    windows: dict[str, list[dict]] = {m: [] for m in steps}
    for r in range(args.rounds):
        sequence = [cycle[(r * n + i) % len(cycle)] for i in range(n)]
        order = list(steps) if r % 2 == 0 else list(steps)[::-1]
        for mode in order:
            windows[mode].append(t.window(steps[mode], common.staged_fetch(staged, sequence), args.steps,
                                          flops, gpu))
        common.say(f"{preset}: round {r + 1}/{args.rounds}: " + ", ".join(
            f"{m} {windows[m][-1]['steps_per_s']:.2f} steps/s" for m in windows))
    out["recompiles"] = _graphs() - g1
    out["compiled_ok"] = COMPILED in steps and steps[COMPILED].compiled
    for mode, ws in windows.items():
        out[mode] = {m: common.median([w[m] for w in ws if m in w]) for m in ws[0]}
    if COMPILED in windows:
        out["speedup"] = [c["steps_per_s"] / e["steps_per_s"]
                          for e, c in zip(windows[EAGER], windows[COMPILED])]
    if flops is not None:
        out["gflop_per_step"] = flops.total(cycle) / len(cycle) * accum / 1e9
    if cuda:
        out["peak_gib"] = torch.cuda.max_memory_allocated(t.device) / 2**30
        out["nvml"] = gpu is not None and gpu.available
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_arguments(p)
    p.add_argument("--skip-compile", action="store_true", help="eager only")
    p.add_argument("--compile-presets", help="presets also measured compiled (default: tiny on "
                   "CPU, all on CUDA)")
    p.add_argument("--compile-shapes", type=int, help="bucket shapes measured, most frequent "
                   "first; 0 = all (default: 1 on CPU, 0 on CUDA)")
    p.add_argument("--flops", action="store_true", help="count model FLOPs on CPU too (always on CUDA)")
    p.add_argument("--peak-tflops", type=float, default=989.0,
                   help="the GPU's peak dense TFLOP/s at the training precision, for MFU "
                        "(default 989: H100/H200 bf16)")
    p.add_argument("--inductor-cache", type=Path,
                   help="TORCHINDUCTOR_CACHE_DIR (default: a fresh one: warm-up is a cold compile)")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="myxtts-bench-step-"))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(args.inductor_cache or tmp / "inductor")
    import torch

    cuda = torch.cuda.is_available()
    args.steps = args.steps or (40 if cuda else 8)
    presets = (args.presets or ("tiny,small,base" if cuda else "tiny,small")).split(",")
    args.compile_presets = set() if args.skip_compile else set(
        (args.compile_presets or (",".join(presets) if cuda else "tiny")).split(","))
    try:
        data, store = common.prepare(args.data, args.store, tmp)
        results = [measure(store, preset, args, cuda) for preset in presets]
        head = common.header(data, store, f"windows: {args.steps} steps on pre-staged batches, "
                      f"{args.rounds} rounds per mode interleaved, medians over rounds"
                      + (f"; overrides {args.set}" if args.set else ""))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def cell(r: dict, metric: str, fmt: str, scale: float = 1.0) -> str:
        vals = [format(r[m][metric] / scale, fmt) for m in (EAGER, COMPILED) if m in r and metric in r[m]]
        return " / ".join(vals) or "-"

    def opt(r: dict, key: str, fmt: str) -> str:
        return format(r[key], fmt) if key in r else "-"

    rows = [
        ("parameters (M)", [f"{r['params_m']:.1f}" for r in results]),
        ("device / precision / threads", [f"{r['device']} {r['precision']} {r['threads']}t" for r in results]),
        ("data.batch_frames / shapes (measured)",
         [f"{r['batch_frames']} / {r['shapes']} ({r['measured_shapes']})" for r in results]),
        ("step ms: eager / compiled", [" / ".join(f"{1e3 / r[m]['steps_per_s']:.0f}" for m in
                                                  (EAGER, COMPILED) if m in r) for r in results]),
        ("compiled speed-up (eager / compiled time)", [common.spread(r.get("speedup", [])) for r in results]),
        ("utterances/s: eager / compiled", [cell(r, "utt_per_s", ".1f") for r in results]),
        ("mel frames/s: eager / compiled", [cell(r, "frames_per_s", ".0f") for r in results]),
        ("compile warm-up s, cold (graphs compiled)",
         [f"{r['warmup_s']:.0f} ({r['graphs_warmup']})" + ("" if r["compiled_ok"] else " FAILED")
          if "warmup_s" in r else "-" for r in results]),
        ("graphs compiled during the timed windows", [str(r["recompiles"]) for r in results]),
        ("model GFLOP per step (fwd+bwd)", [opt(r, "gflop_per_step", ".1f") for r in results]),
        ("achieved TFLOP/s: eager / compiled", [cell(r, "tflops", ".3g") for r in results]),
    ]
    if cuda:
        rows += [(f"MFU (peak {args.peak_tflops:g} TFLOP/s): eager / compiled",
                  [cell(r, "tflops", ".1%", args.peak_tflops) for r in results]),
                 ("GPU utilisation % (NVML): eager / compiled",
                  [cell(r, "gpu_util", ".0f") for r in results]),
                 ("peak GPU memory GiB", [opt(r, "peak_gib", ".1f") for r in results])]
    print(common.table([r["preset"] for r in results], rows, head))
    print("speed-up: per-round eager time / compiled time on the same batches, median [min-max].")


if __name__ == "__main__":
    main()
