"""Does the device wait for data? The trainer's real input path against pre-staged batches.

    python benchmarks/input_ratio.py [--presets tiny,small] [--steps N] [--rounds R]
        [--data DIR | --store DIR] [--batch-frames N] [--threads N] [--set section.key=value]

Two arms per preset, one run built as ``myxtts train`` builds it (``_trainer.Trainer``:
eager on CPU; on CUDA compiled and captured as CUDA graphs, after the engine's warm-up and,
with ``data.batch_frames=auto``, its measured batch sizes), on the same shapes in the same
order:

* loader: prepared store -> ``open_train_data`` (``build_loader``) -> the recipe's
  stream (side-stream prefetch) -> the engine's step;
* pre-staged: the same engine fed batches already in device memory, replaying the
  shape order the loader delivers (the sampler's plan is deterministic, so it is known
  ahead; the table counts any mismatch).

RATIO = loader steps/s / pre-staged steps/s of paired windows (interleaved A/B, B/A, ...,
since a shared machine's load comes and goes; medians over rounds). ``1 - RATIO`` is the
share of the step's speed of light lost to the input pipeline, whatever the mechanism:
time in ``next(loader)`` (which the data-wait meter also sees), but also host syncs, copies
serialised on the compute stream, or loader workers competing for cores (which it does
not). On a GPU an asynchronous step with enough queued work hides the loader: ~1.00 means
the GPU never waits. On a CPU the "device" is the cores that load, so the ratio is the
loader's CPU cost per step.

CPU defaults: presets tiny and small at small budgets (``data.batch_frames`` 1500 / 1000:
~0.15 / ~1 s steps on 2 cores), one torch thread (``--threads 1``: on a shared 2-core
machine torch's 2 threads made a step swing by 10x whenever another process took a core;
the loader runs on the training thread either way at <= 2 CPUs). GPU defaults: tiny, small,
base at the config's budget (auto: measured per bucket), torch's threads, 40 steps per window.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import common
from _trainer import Trainer, loader_ratio


def measure(store: Path, preset: str, args: argparse.Namespace, cuda: bool) -> dict:
    import torch

    bf = args.batch_frames or (None if cuda else common.CPU_BATCH_FRAMES[preset])
    t = Trainer(store, preset, bf, args.set,
                args.threads if args.threads is not None else (0 if cuda else 1),
                args.tmp / f"run-{preset}")
    staged = t.stage()
    t.prime(staged)  # every shape once (allocations)
    out = loader_ratio(t, staged, args.steps, args.rounds, args.warmup, preset)
    out.update({"preset": preset, "params_m": t.params_m, "mode": t.engine.mode,
                "device": str(t.device),
                "threads": torch.get_num_threads(), "batch_frames": t.cfg.data.batch_frames,
                "shapes": len(staged), "batches": len(t.data.sampler),
                "padding": t.data.sampler.padding_efficiency(),
                "workers": t.data.loader.num_workers})
    t.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_arguments(p)
    p.add_argument("--warmup", type=int, default=2, help="untimed loader steps first (default 2)")
    args = p.parse_args()
    import torch

    cuda = torch.cuda.is_available()
    args.steps = args.steps or (40 if cuda else 8)
    args.rounds = args.rounds or (3 if cuda else 6)
    presets = (args.presets or ("tiny,small,base" if cuda else "tiny,small")).split(",")
    tmp = args.tmp = Path(tempfile.mkdtemp(prefix="myxtts-bench-input-"))
    try:
        data, store = common.prepare(args.data, args.store, tmp)
        results = [measure(store, preset, args, cuda) for preset in presets]
        head = common.header(data, store, f"windows: {args.steps} steps, {args.rounds} rounds per arm "
                      f"interleaved A/B then B/A, medians over rounds; {args.warmup} untimed "
                      f"loader steps" + (f"; overrides {args.set}" if args.set else ""))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def both(metric: str, fmt: str) -> list[str]:
        return [f"{format(r['loader'][metric], fmt)} / {format(r['pre-staged'][metric], fmt)}"
                for r in results]

    rows = [
        ("parameters (M)", [f"{r['params_m']:.1f}" for r in results]),
        ("device / threads / step mode", [f"{r['device']} {r['threads']}t {r['mode']}" for r in results]),
        ("data.batch_frames / shapes / batches per epoch",
         [f"{r['batch_frames']} / {r['shapes']} / {r['batches']}" for r in results]),
        ("padding efficiency / loader workers", [f"{r['padding']:.3f} / {r['workers']}" for r in results]),
        ("steps/s: loader / pre-staged", both("steps_per_s", ".2f")),
        ("utterances/s: loader / pre-staged", both("utt_per_s", ".1f")),
        ("mel frames/s: loader / pre-staged", both("frames_per_s", ".0f")),
        ("data-wait share: loader / pre-staged", both("wait_share", ".2%")),
        ("RATIO loader / pre-staged, median [min-max]", [common.spread(r["ratios"]) for r in results]),
        ("shape-order mismatches loader vs plan", [str(r["mismatches"]) for r in results]),
    ]
    print(common.table([r["preset"] for r in results], rows, head))
    print("RATIO = loader steps/s / pre-staged steps/s of paired windows (same shapes, same order);\n"
          "  1 - RATIO is the share of the step's speed of light lost to the input pipeline.\n"
          "data-wait share: StepTimer (time in next(loader); on CUDA only while the GPU queue was dry).")


if __name__ == "__main__":
    main()
