"""What does activation checkpointing (``train.activation_checkpointing``) save, and cost?

    python benchmarks/activation_checkpointing.py [--preset tiny|small|base]
        [--device auto|cpu|cuda] [--batch-frames N] [--shapes K] [--steps N] [--rounds R]
        [--data DIR | --store DIR] [--threads N] [--set section.key=value]

Two runs built as ``myxtts train`` builds them (``_trainer.Trainer``: precision,
``train.compile`` and ``train.cuda_graphs`` as resolved on the device, batch sizes, every
bucket shape warmed up), from the same initial weights: without checkpointing (the
baseline) and with it (``train.activation_checkpointing``). Both run each measured bucket
shape's
worst-case batch (every utterance at the bucket's padded shape: what the warm-up and the
auto batch budget run), the shapes planned from the data at ``data.batch_frames`` as the
trainer plans them (default: the LJSpeech sample beside the repository, else a generated
demo corpus; ``--shapes`` picks that many, from the longest to the shortest, 0 = all).
Per shape:

* saved for backward: bytes of the tensors autograd keeps from the forward to the backward
  pass, counted with ``torch.autograd.graph.saved_tensors_hooks`` during one forward and
  backward of the model outside the step (each storage once, parameters left out; a CUDA
  graph replay cannot be hooked): what checkpointing removes, the same on any device;
* peak CUDA memory of that forward and backward above what stays allocated between steps
  (weights, gradients, AdamW state, a graphed run's pool): ``torch.cuda.max_memory_allocated``
  (n/a on a CPU);
* step time: median of ``--steps`` steps per round (each synchronised on CUDA), rounds
  interleaved (A/B, B/A, ...) after a warm-up, and the per-round ratio to the baseline.

Ratios are checkpointing / baseline: below 1 for memory is the saving, above 1 for time the
price. Defaults: CPU the tiny preset at 1500 frames, 1 thread, 3 shapes, 4 rounds of 5
steps (under a minute on 2 cores, eager); CUDA the config's plan (compiled, CUDA graphs),
5 rounds of 10 steps. Both arms stay on the device together (interleaved rounds), so the
CUDA peak is counted above each step's resident state rather than from zero.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import common
from _trainer import Trainer

ARMS = ("off", "on")  # checkpointing; "off" is the baseline
MIB = 2**20


def pick(shapes: list[Any], k: int) -> list[Any]:
    """``k`` shapes spread from the longest to the shortest (all for k <= 0)."""
    if k <= 0 or k >= len(shapes):
        return shapes
    if k == 1:
        return shapes[:1]
    return [shapes[round(i * (len(shapes) - 1) / (k - 1))] for i in range(k)]


def memory(t: Trainer, batch: dict) -> tuple[int, int | None]:
    """(bytes saved for backward, CUDA peak above the resident state or None) of one forward
    and backward of the run's model on ``batch``, in the run's precision; the gradients it
    leaves are zeroed in place (the engine's next step starts from zero, as always)."""
    import torch

    from myxtts.model.losses import compute_losses
    from myxtts.observe.meters import SavedBytes

    model, peak = t.engine.model, None
    t.sync()
    if t.cuda:
        torch.cuda.reset_peak_memory_stats(t.device)
        resident = torch.cuda.memory_allocated(t.device)
    autocast = torch.autocast(t.device.type, dtype=t.engine.dtype,
                              enabled=t.engine.dtype != torch.float32)
    with SavedBytes(model) as saved, autocast:
        compute_losses(model(batch), batch, t.cfg.train)["loss"].backward()
    t.sync()
    if t.cuda:
        peak = torch.cuda.max_memory_allocated(t.device) - resident
    model.zero_grad(set_to_none=False)
    return saved.nbytes, peak


def timed(t: Trainer, batch: dict, n: int) -> list[float]:
    """Seconds of each of ``n`` training steps, run by the training loop (``run_steps``, fed
    ``batch``; replayed as a CUDA graph where captured)."""
    accum = t.cfg.train.grad_accum_steps
    out = []
    for _ in range(n):
        t.sync()
        start = time.perf_counter()
        t.run.run_steps(1, source=iter([(batch, 0)] * accum))
        t.sync()
        out.append(time.perf_counter() - start)
    return out


def measure(runs: dict[str, Trainer], shapes: list[Any], args: argparse.Namespace
            ) -> tuple[list[dict], str]:
    """Per shape: each arm's (saved bytes, CUDA peak) and step times, the per-round time
    ratios; and how the steps ran (mode, precision)."""
    from myxtts.model.dummy import worst_case_batch
    from myxtts.train.engine import resolve_compile

    t = runs["off"]
    results = []
    for shape in shapes:
        batch = worst_case_batch(shape, t.data.vocab_size, len(t.data.languages), t.device)
        r: dict[str, Any] = {"shape": shape, "times": {a: [] for a in ARMS}, "ratios": []}
        for arm in ARMS:
            timed(runs[arm], batch, args.warmup)
            r[arm] = memory(runs[arm], batch)
        for i in range(args.rounds):
            medians = {}
            for arm in (ARMS if i % 2 == 0 else ARMS[::-1]):
                times = timed(runs[arm], batch, args.steps)
                r["times"][arm] += times
                medians[arm] = statistics.median(times)
            r["ratios"].append(medians["on"] / medians["off"])
        common.say(f"B={shape.batch} T={shape.frames}: step ms " + ", ".join(
            f"{a} {1e3 * common.median(r['times'][a]):.0f}" for a in ARMS)
            + f"; saved MiB off {r['off'][0] / MIB:.1f}, on {r['on'][0] / MIB:.1f}")
        results.append(r)
    modes = {arm: f"{run.engine.mode} step" for arm, run in runs.items()}
    how = modes["off"] if modes["off"] == modes["on"] else f"{modes['off']} (off) / {modes['on']} (on)"
    if any(run.engine.compiled != resolve_compile(t.cfg.train.compile, t.device)
           for run in runs.values()):
        how += " (compiling FAILED: see the log)"
    return results, f"{how}, {str(t.engine.dtype).split('.')[-1]}"


def render(results: list[dict], head: list[str]) -> str:
    cols = ["checkpointing", "saved MiB", "ratio", "peak CUDA MiB", "ratio", "step ms",
            "ratio [min-max]"]
    widths = [14, 12, 8, 15, 8, 10, 20]
    first = 34

    def line(label: str, cells: list[str]) -> str:
        return f"{label:<{first}}" + "".join(f"{c:>{w}}" for c, w in zip(cells, widths))

    out = [*head, "", line("shape: B x T mel (L text, R ref)", cols), "-" * (first + sum(widths))]
    for r in results:
        s = r["shape"]
        label = f"{s.batch} x {s.frames} (L {s.text}, R {s.ref_frames})"
        base_saved, base_peak = r["off"]
        for arm in ARMS:
            saved, peak = r[arm]
            ms = 1e3 * common.median(r["times"][arm])
            base_ms = 1e3 * common.median(r["times"]["off"])
            cells = [arm, f"{saved / MIB:.2f}", f"{saved / base_saved:.3f}",
                     "n/a" if peak is None else f"{peak / MIB:.0f}",
                     "n/a" if peak is None else f"{peak / base_peak:.3f}",
                     f"{ms:.1f}", "1.000" if arm == "off" else
                     f"{ms / base_ms:.3f} [{min(r['ratios']):.2f}-{max(r['ratios']):.2f}]"]
            out.append(line(label if arm == "off" else "", cells))
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="tiny", choices=["tiny", "small", "base"])
    p.add_argument("--device", default="auto", help="train.device: auto (CUDA if present), cpu, "
                   "cuda, cuda:N")
    common.add_arguments(
        p, presets=None, steps="timed steps per round (default 5 CPU, 10 CUDA)",
        rounds="rounds per arm, interleaved (default 4 CPU, 5 CUDA)",
        batch_frames=f"data.batch_frames (default: CPU {common.CPU_BATCH_FRAMES}; CUDA 12000, "
                     "the budget auto sizes plan from)", set="config override (repeatable)")
    p.add_argument("--shapes", type=int, default=3, help="bucket shapes measured, spread from "
                   "the longest to the shortest; 0 = all (default 3)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per arm and shape")
    args = p.parse_args()

    import torch

    cuda = args.device.startswith("cuda") or (args.device == "auto" and torch.cuda.is_available())
    args.steps = args.steps or (10 if cuda else 5)
    args.rounds = args.rounds or (5 if cuda else 4)
    threads = args.threads if args.threads is not None else (0 if cuda else 1)
    # a fixed frame budget on CUDA too (auto's planning budget): with auto sizes the run with
    # checkpointing would fit larger batches, and the two could not be compared shape by shape
    batch_frames = args.batch_frames or (12000 if cuda else common.CPU_BATCH_FRAMES[args.preset])
    tmp = Path(tempfile.mkdtemp(prefix="myxtts-bench-ckpt-"))
    try:
        data, store = common.prepare(args.data, args.store, tmp)
        runs = {arm: Trainer(store, args.preset, batch_frames,
                             [f"train.device={args.device}", *args.set,
                              f"train.activation_checkpointing={arm == 'on'}"], threads,
                             tmp / f"run-{arm}") for arm in ARMS}
        t = runs["off"]  # both runs plan the same buckets (a fixed frame budget)
        shapes = pick(t.shapes(), args.shapes)
        results, how = measure(runs, shapes, args)
        head = common.header(data, store, (
            f"preset {args.preset} ({t.params_m:.1f} M parameters) on {t.device}, "
            f"{how}, {torch.get_num_threads()} threads, data.batch_frames "
            f"{t.cfg.data.batch_frames}; {args.rounds} rounds x {args.steps} steps per arm, "
            f"interleaved" + (f"; overrides {args.set}" if args.set else "")))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(render(results, head))
    print("ratio: checkpointing on / off (the baseline, measured in the same run); step time "
          "ratio: median [min-max] of per-round ratios.")


if __name__ == "__main__":
    main()
