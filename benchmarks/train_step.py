"""How fast is the training step itself, and how much of the device does it use?

    python benchmarks/train_step.py [--presets tiny,small] [--steps N] [--rounds R]
        [--compile-presets LIST | --skip-compile] [--compile-shapes K] [--flops]
        [--peak-tflops N] [--inductor-cache DIR] [--budget-s S] [--data DIR | --store DIR]
        [--batch-frames N] [--threads N] [--set section.key=value]

Every arm is a run set up by the recipe ``myxtts train`` runs (``_trainer.Trainer``:
``train.tts.TTSRecipe``), so it has everything the trainer has on that device (memory
caps, auto batch sizes, warm-up of every bucket shape, CUDA graphs with the room beside
them); arms differ only by config overrides, as a user's runs would.

On a GPU (default presets tiny, small, base, measured base first; a preset starts only while
``--budget-s`` leaves room, 540 s by default, so the default run fits one 10-minute window --
the run time itself has not been measured on a GPU yet), per preset (``step_gpu.py``): cold
and warm (restarted process) set-up seconds of ``myxtts train``'s default run (auto batch
sizes, compile, capture), then eager (``train.compile=off``, ``train.cuda_graphs=off``),
compiled (``train.cuda_graphs=off``) and graphed (the default) runs, each with the batch
sizes it measured itself, on pre-staged batches (step time, utterances/s, mel frames/s,
NVML utilisation, MFU from counted model FLOPs against ``--peak-tflops``), the real loader
against pre-staged batches with the graphed run, and peak memory.

On a CPU (the default run: presets tiny and small at small budgets, one torch thread, ~3
min), per preset on pre-staged batches (one per bucket shape, already in device memory: the
input pipeline is ``input_ratio.py``'s subject), from the same initial weights:

* eager vs compiled (``train.compile=off`` / ``on``: the trainer's regional
  ``torch.compile``): step time in interleaved windows (A/B, B/A, ...; medians, per-round
  speed-up), utterances/s and mel frames/s;
* compile warm-up: the seconds the compiled run's warm-up took over every bucket shape,
  cold (a fresh inductor cache unless ``--inductor-cache``), graphs compiled then and any
  compiled during the timed windows (recompiles: should be 0);
* model FLOPs per step (``myxtts.train.efficiency``: counted on a meta-device copy, as
  training and ``myxtts profile`` count them; with ``--flops``) and achieved TFLOP/s.

Compiled only for tiny by default (a cold inductor compile takes minutes on 2 cores), and
timed on its most frequent shape only (``--compile-shapes 0`` times all shapes); eager-only
presets are timed on all shapes.
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
from _trainer import Trainer, staged_fetch

EAGER, COMPILED = "eager", "compiled"


def measure(store: Path, preset: str, args: argparse.Namespace) -> dict:
    """One preset on the CPU (see the module docstring)."""
    import torch

    from myxtts.observe.flops import StepFlops
    from myxtts.train.efficiency import meta_step_counter
    from myxtts.train.engine import compiled_graphs, reset_compiled

    reset_compiled()
    bf = args.batch_frames or common.CPU_BATCH_FRAMES[preset]
    threads = args.threads if args.threads is not None else 1
    compiles = preset in args.compile_presets
    runs = {EAGER: Trainer(store, preset, bf, [*args.set, "train.compile=off"], threads,
                           args.tmp / f"run-{preset}-eager")}
    t = runs[EAGER]
    staged = t.stage()
    accum = t.cfg.train.grad_accum_steps
    by_frequency = [k for k, _ in Counter(k for k, _ in t.upcoming(len(t.data.sampler))).most_common()]
    k = args.compile_shapes if args.compile_shapes is not None else 1
    keys = by_frequency if k <= 0 or not compiles else by_frequency[:k]
    flops = None
    if args.flops:
        flops = StepFlops(meta_step_counter(t.cfg, t.data.vocab_size, len(t.data.languages)))
        for key in keys:
            flops(key)
    out: dict = {"preset": preset, "params_m": t.params_m, "device": str(t.device),
                 "precision": str(t.engine.dtype).split(".")[-1],
                 "threads": torch.get_num_threads(), "batch_frames": t.cfg.data.batch_frames,
                 "shapes": len(staged), "measured_shapes": len(keys)}
    if compiles:  # built as `myxtts train --compile` builds it: every bucket shape warmed up
        g0 = compiled_graphs()
        runs[COMPILED] = Trainer(store, preset, bf, [*args.set, "train.compile=on"], threads,
                                 args.tmp / f"run-{preset}-compiled")
        runs[COMPILED].prime(staged, keys)
        out["warmup_s"] = runs[COMPILED].report.seconds
        out["graphs_warmup"] = compiled_graphs() - g0
        common.say(f"{preset}: compiled {len(staged)} shape(s) in {out['warmup_s']:.0f} s")
    t.prime(staged, keys)
    g1 = compiled_graphs()
    cycle = [x for x in by_frequency if x in keys]
    n = args.steps * accum
    windows: dict[str, list[dict]] = {m: [] for m in runs}
    for r in range(args.rounds):
        sequence = [cycle[(r * n + i) % len(cycle)] for i in range(n)]
        order = list(runs) if r % 2 == 0 else list(runs)[::-1]
        for mode in order:
            windows[mode].append(runs[mode].window(staged_fetch(staged, sequence), args.steps,
                                                   flops))
        common.say(f"{preset}: round {r + 1}/{args.rounds}: " + ", ".join(
            f"{m} {windows[m][-1]['steps_per_s']:.2f} steps/s" for m in windows))
    out["recompiles"] = compiled_graphs() - g1
    out["compiled_ok"] = COMPILED in runs and runs[COMPILED].engine.compiled
    for mode, ws in windows.items():
        out[mode] = {m: common.median([w[m] for w in ws if m in w]) for m in ws[0]}
    if COMPILED in windows:
        out["speedup"] = [c["steps_per_s"] / e["steps_per_s"]
                          for e, c in zip(windows[EAGER], windows[COMPILED])]
    if flops is not None:
        out["gflop_per_step"] = flops.total(cycle) / len(cycle) * accum / 1e9
    for run in runs.values():
        run.close()
    return out


MIN_PRESET_S = 150  # a preset is not started with less of --budget-s left (a threshold, not a
# measured time)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_arguments(p)
    p.add_argument("--warmup-of", help=argparse.SUPPRESS)  # step_gpu.py's warm-up process
    p.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--skip-compile", action="store_true", help="eager only")
    p.add_argument("--compile-presets", help="CPU: presets also measured compiled (default tiny)")
    p.add_argument("--compile-shapes", type=int, help="CPU: bucket shapes timed when a preset "
                   "is compiled, most frequent first; 0 = all (default 1)")
    p.add_argument("--flops", action="store_true", help="count model FLOPs on CPU too (always on CUDA)")
    p.add_argument("--peak-tflops", type=float,
                   help="the GPU's peak dense TFLOP/s at the training precision, for MFU "
                        "(default: the package's table for this GPU at bf16, as training and "
                        "`myxtts profile` use; H100/H200 989)")
    p.add_argument("--inductor-cache", type=Path,
                   help="TORCHINDUCTOR_CACHE_DIR (default: a fresh one: warm-up is a cold compile)")
    p.add_argument("--budget-s", type=float, default=540,
                   help="CUDA: seconds the whole run may take; a preset starts only while "
                        f"{MIN_PRESET_S:.0f} s of it are left, the rest are named as skipped "
                        "(default 540)")
    args = p.parse_args()
    if args.warmup_of:
        import step_gpu

        step_gpu.warmup_main(args)
        return
    tmp = args.tmp = Path(tempfile.mkdtemp(prefix="myxtts-bench-step-"))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(args.inductor_cache or tmp / "inductor")
    import torch

    cuda = torch.cuda.is_available()
    if cuda:
        return gpu_main(args, tmp)
    args.steps = args.steps or 8
    args.rounds = args.rounds or 6
    presets = (args.presets or "tiny,small").split(",")
    args.compile_presets = set() if args.skip_compile else set(
        (args.compile_presets or "tiny").split(","))
    try:
        data, store = common.prepare(args.data, args.store, tmp)
        results = [measure(store, preset, args) for preset in presets]
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
        ("compile warm-up s, every shape, cold (graphs compiled)",
         [f"{r['warmup_s']:.0f} ({r['graphs_warmup']})" + ("" if r["compiled_ok"] else " FAILED")
          if "warmup_s" in r else "-" for r in results]),
        ("graphs compiled during the timed windows", [str(r["recompiles"]) for r in results]),
        ("model GFLOP per step (fwd+bwd)", [opt(r, "gflop_per_step", ".1f") for r in results]),
        ("achieved TFLOP/s: eager / compiled", [cell(r, "tflops", ".3g") for r in results]),
    ]
    print(common.table([r["preset"] for r in results], rows, head))
    print("speed-up: per-round eager time / compiled time on the same batches, median [min-max].")


def gpu_main(args: argparse.Namespace, tmp: Path) -> None:
    import step_gpu

    args.steps = args.steps or 30
    args.rounds = args.rounds or 3
    presets = (args.presets or "tiny,small,base").split(",")
    # The targets are the base preset's: it goes first, so a tight budget skips the
    # others; the table keeps the order asked for.
    order = sorted(presets, key=lambda p: p != "base") if not args.presets else presets
    args.deadline = time.monotonic() + args.budget_s
    skipped = []
    try:
        data, store = common.prepare(args.data, args.store, tmp)
        results = []
        for preset in order:
            if args.deadline - time.monotonic() < MIN_PRESET_S:
                skipped.append(preset)
                continue
            try:
                results.append(step_gpu.measure_gpu(store, preset, args))
            except Exception as e:  # one preset failing must not lose the others' figures
                common.say(f"{preset}: FAILED ({type(e).__name__}: {str(e)[:300]})")
        results.sort(key=lambda r: presets.index(r["preset"]))
        head = common.header(data, store, f"windows: {args.steps} steps on pre-staged batches, "
                             f"{args.rounds} per mode, medians"
                             + (f"; overrides {args.set}" if args.set else ""))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if results:
        import torch

        from myxtts.observe.flops import peak_tflops

        peak = args.peak_tflops or peak_tflops(torch.cuda.get_device_name(0), torch.bfloat16)
        if not peak:  # the figures still print; MFU reads nan
            common.say(f"no peak TFLOP/s known for {torch.cuda.get_device_name(0)}: pass "
                       f"--peak-tflops for MFU")
            peak = float("nan")
        print(common.table([r["preset"] for r in results], step_gpu.rows(results, peak), head))
        print(step_gpu.notes(results))
    if skipped:
        print(f"skipped (--budget-s {args.budget_s:g} ran out): {', '.join(skipped)}; measure them "
              f"with --presets {','.join(skipped)}")


if __name__ == "__main__":
    main()
