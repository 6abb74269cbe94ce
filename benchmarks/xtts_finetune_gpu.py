"""XTTS-v2 fine-tuning on the device: utilisation, steps/s, and the loader against
pre-staged batches, at the released size, with no file to carry but the code.

    python benchmarks/xtts_finetune_gpu.py [--data DIR] [--size released|reduced]
        [--steps N] [--rounds R] [--warmup K] [--threads T] [--set section.key=value ...]
        [--json FILE]

What it does, in one process:

1. writes an XTTS-v2 folder with seeded random weights (``_xtts_folder``: myxtts alone, no
   coqui-tts; its BPE vocabulary learnt from the dataset's texts, so every clip trains);
2. ``myxtts prepare DATA --xtts FOLDER`` (untimed; ``--data``, default
   ../shared/data/ljspeech-mini, else a generated demo corpus): text tokens, DVAE codes;
3. builds the run ``myxtts train STORE --init-from FOLDER`` builds (``_xtts_trainer``: the
   ``xtts-finetune`` preset; on CUDA its auto batch sizes per bucket unless ``--set
   data.batch_frames=N``, compiled blocks, CUDA graphs, bf16, as the config resolves them
   there; ``--set`` changes any of it, as it would a user's run) and reports how long that
   took (the warm-up: batch sizes measured, blocks compiled, graphs captured);
4. times paired windows of ``--steps`` optimizer steps (``_trainer.loader_ratio``): the real
   input path (the store's loader with its workers, the side-stream copy) against the same
   engine fed batches already in device memory in the same shape order, interleaved A/B,
   B/A; on CUDA with NVML's utilisation sampled in each window, TFLOP/s and MFU counted
   from the step's FLOPs (every frame of the voice segments).

RATIO = loader steps/s / pre-staged steps/s: ~1.00 means the device never waits for data.
On a CPU (``--size reduced``) it runs the same way, eager, one torch thread by default:
the figures are the CPU's; it is how the script itself is tested.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import common

CPU_SETTINGS = ["data.max_batch_size=3", "data.batch_frames=900"]  # the CPU benchmark's batch


def dataset_texts(data: Path) -> list[str]:
    """Every text field of an LJSpeech-style ``metadata.csv`` (``id|text|normalized``)."""
    texts = []
    for line in (data / "metadata.csv").read_text(encoding="utf-8").splitlines():
        texts += [field for field in line.split("|")[1:] if field.strip()]
    if not texts:
        raise SystemExit(f"{data / 'metadata.csv'} has no texts; pass --data with an "
                         f"LJSpeech-style folder")
    return texts


def run_overrides(args: argparse.Namespace, cuda: bool) -> list[str]:
    """The run's settings: never a log, validation or checkpoint inside the windows, then the
    device's defaults (on CUDA the batch sizes the engine measures; on a CPU the CPU
    benchmark's batch of 3), then the user's ``--set``, which win."""
    quiet = ["train.max_steps=1000000", "train.log_every=1000000", "train.val_every=1000000",
             "train.ckpt_every=1000000", "train.eval_every=0", "train.synth_every=0"]
    device = ["train.device=cuda", "data.batch_frames=auto"] if cuda else \
        ["train.device=cpu", *CPU_SETTINGS]
    return [*quiet, *device, *args.set]


def measure(args: argparse.Namespace, tmp: Path, cuda: bool) -> dict:
    """Steps 1-4 of the module docstring in ``tmp``; the figures of both arms and the run's
    settings."""
    import torch

    from _trainer import loader_ratio
    from _xtts_folder import write_random_xtts
    from _xtts_trainer import XttsTrainer
    from myxtts.config import load_config
    from myxtts.observe.flops import StepFlops, peak_tflops
    from myxtts.observe.gpu import GpuUtilSampler
    from myxtts.train.xtts.flops import xtts_step_counter
    from myxtts.train.xtts.prepare import prepare_xtts

    data = common.find_data(args.data, tmp)
    folder, store = tmp / "xtts", tmp / "store"
    common.say(f"writing a {args.size}-size XTTS-v2 folder with seeded random weights ...")
    write_random_xtts(folder, dataset_texts(data), args.size)
    common.say(f"preparing {data} -> {store} (text tokens, DVAE codes) ...")
    started = time.perf_counter()
    prepare_xtts(data, store, load_config(overrides=["data.val_fraction=0",
                                                     "data.min_val_utterances=0"]),
                 folder, progress=False, echo=lambda *a: None)
    prepare_s = time.perf_counter() - started
    common.say("building the run (warm-up: batch sizes, compiled blocks, graphs) ...")
    t = XttsTrainer(folder, store, run_overrides(args, cuda), args.threads, tmp / "run")
    common.say(f"ready in {t.setup_s:.1f} s ({t.engine.mode}); staging batches ...")
    total = args.warmup + args.rounds * args.steps
    staged = t.stage(total)
    t.prime(staged)  # every staged shape once: first-call allocations
    config = t.run.base.config
    samples = t.shapes()[0].ref_frames
    flops = StepFlops(xtts_step_counter(config, samples))
    gpu = GpuUtilSampler(t.device, period_s=0.1) if cuda else None
    out = loader_ratio(t, staged, args.steps, args.rounds, args.warmup, f"xtts-{args.size}",
                       gpu=gpu, flops=flops)
    peak = peak_tflops(torch.cuda.get_device_name(t.device), t.engine.dtype) if cuda else None
    out.update({"size": args.size, "params_m": t.params_m, "mode": str(t.engine.mode),
                "device": str(t.device) + (f" ({torch.cuda.get_device_name(t.device)})" if cuda else ""),
                "dtype": str(t.engine.dtype).replace("torch.", ""),
                "threads": torch.get_num_threads(), "setup_s": t.setup_s,
                "prepare_s": prepare_s, "batch_frames": t.cfg.data.batch_frames,
                "batch_sizes": t.batch_sizes, "shapes": len(staged),
                "batches": len(t.run.sampler), "workers": t.run.loader.num_workers,
                "peak_tflops": peak, "data": str(data), "clips": len(t.batches.store)})
    t.close()
    return out


def render(r: dict) -> str:
    def both(metric: str, fmt: str, scale: float = 1.0) -> str:
        a, b = r["loader"].get(metric), r["pre-staged"].get(metric)
        if a is None or b is None:
            return "-"
        return f"{format(a * scale, fmt)} / {format(b * scale, fmt)}"

    mfu = "-"
    if r.get("peak_tflops") and r["loader"].get("tflops") is not None:
        mfu = (f"{100 * r['loader']['tflops'] / r['peak_tflops']:.1f}% / "
               f"{100 * r['pre-staged']['tflops'] / r['peak_tflops']:.1f}%")
    rows = [
        ("parameters (M, the GPT trains)", [f"{r['params_m']:.1f}"]),
        ("device / torch threads / step mode / precision",
         [f"{r['device']} {r['threads']}t {r['mode']} {r['dtype']}"]),
        ("data.batch_frames / shapes staged / batches per epoch",
         [f"{r['batch_frames']} / {r['shapes']} / {r['batches']}"]),
        ("batch size per bucket", [" ".join(str(b) for b in r["batch_sizes"])]),
        ("loader workers", [str(r["workers"])]),
        ("run ready in s (warm-up included) / store prepared in s",
         [f"{r['setup_s']:.1f} / {r['prepare_s']:.1f}"]),
        ("steps/s: loader / pre-staged", [both("steps_per_s", ".2f")]),
        ("utterances/s: loader / pre-staged", [both("utt_per_s", ".1f")]),
        ("audio s/s: loader / pre-staged", [both("audio_s_per_s", ".0f")]),
        ("data-wait share: loader / pre-staged", [both("wait_share", ".2%")]),
        ("GPU utilisation (NVML) %: loader / pre-staged", [both("gpu_util", ".0f")]),
        ("TFLOP/s: loader / pre-staged", [both("tflops", ".1f")]),
        ("MFU: loader / pre-staged", [mfu]),
        ("RATIO loader / pre-staged, median [min-max]", [common.spread(r["ratios"])]),
        ("shape-order mismatches loader vs plan", [str(r["mismatches"])]),
    ]
    head = [f"XTTS-v2 GPT fine-tuning, {r['size']} size, seeded random weights; "
            f"{r['clips']} clips of {r['data']}", common.machine(r["threads"])]
    return common.table([r["size"]], rows, head, first="measure", width=40)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_arguments(p, presets=None, store=None, batch_frames=None,
                         steps="optimizer steps per window (default 30 on CUDA, 4 on CPU)",
                         rounds="windows per arm, interleaved (default 3 on CUDA, 2 on CPU)",
                         threads="torch threads; 0 = torch's default (default: 1 on CPU, 0 "
                                 "on CUDA)")
    p.add_argument("--size", choices=("released", "reduced"), help="the GPT's size (default: "
                   "released on CUDA, reduced on a CPU)")
    p.add_argument("--warmup", type=int, default=2, help="untimed loader steps first (default 2)")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args()
    import torch

    cuda = torch.cuda.is_available()
    args.size = args.size or ("released" if cuda else "reduced")
    args.steps = args.steps or (30 if cuda else 4)
    args.rounds = args.rounds or (3 if cuda else 2)
    args.threads = args.threads if args.threads is not None else (0 if cuda else 1)
    tmp = Path(tempfile.mkdtemp(prefix="myxtts-bench-xtts-gpu-"))
    try:
        result = measure(args, tmp, cuda)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(render(result))
    print("RATIO = loader steps/s / pre-staged steps/s of paired windows (same shapes, same "
          "order);\n  ~1.00: the device never waits for data. TFLOP/s: the step's FLOPs over "
          "every frame of the voice segments.")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    elif os.environ.get("OUT"):
        Path(os.environ["OUT"], "xtts_finetune_gpu.json").write_text(
            json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
