"""Where should the log-mels be made? Training throughput with the input from each data role.

    python benchmarks/data_roles.py [--presets tiny] [--steps N] [--rounds R] [--data DIR]
        [--workers N] [--threads N] [--lead N] [--set section.key=value]

One raw dataset (default ../shared/data/ljspeech-mini, else a generated demo corpus); per
preset, four ways to feed the trainer (columns), each through the trainer's own input path
(a run built as ``myxtts train`` builds it, ``_trainer.Trainer``, read through the recipe's
stream) in the trainer's step mode:

* store: ``myxtts prepare`` first, then the store's loader -> ``CopyFeed`` (baseline);
* cpu-role: the raw folder, ``data.data_device=cpu``: ``--workers`` loader processes decode
  the clips and compute the log-mels, batches reach the step through the slot ring;
* gpu-role (same GPU): ``data.data_device=cuda:0`` while training on cuda:0: the workers only
  decode, a producer thread makes the mels in a CUDA stream of its own (CUDA only);
* gpu-role (second GPU): ``data.data_device=cuda:1``, training on cuda:0 (>= 2 GPUs).

Per arm, as in ``input_ratio.py``, loader windows alternate with windows of the same step fed
pre-staged batches (in device memory, one per shape, replayed in the loader's shape order):
RATIO = loader steps/s / pre-staged steps/s of paired windows, medians over rounds; ``1 -
RATIO`` is the share of the step's speed of light the data role costs. Each arm is compared
with ITS OWN pre-staged batches: on the fly, buckets are planned from header (untrimmed)
lengths, so batches pad longer and are shaped differently from the store's. Across arms
("vs store" rows) utterances/s is the fair measure; "pre-staged vs store" is what the
on-the-fly shapes alone cost the step.

Each loader window follows ``--lead`` untimed steps from its stream: what a data role buffered
while other windows ran (ring slots, worker queues) would otherwise be free batches. On a CPU
the arms run side by side, interleaved round by round (a shared machine's load comes and
goes); on CUDA one at a time, each fitting its batch sizes (``batch_frames=auto``) and
compiling on an otherwise empty GPU, as a run does.

Reading it: RATIO ~1.00 means the data role keeps up with the step. A gpu-role near 1.00
where the cpu-role is well below means too few CPU cores for feature extraction: the
data/model split helps. A cpu-role near 1.00 leaves a GPU role nothing to win. Compare
utterances/s with the store to see what on-the-fly padding costs beside the data role. On a
CPU the "device" is the cores that also load, so the ratio is the loader's CPU cost.

CPU defaults: preset tiny at data.batch_frames 1500, one torch thread, 20 steps x 12 rounds,
workers = every CPU but one (the on-the-fly default; the store keeps its own). CUDA defaults:
tiny and base at the config's budget (auto), torch's threads, 40 steps x 3 rounds.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import tempfile
import traceback
from pathlib import Path
from typing import Any

import common
from _trainer import Paired, Trainer

ARMS = ("store", "cpu-role", "gpu-role (same GPU)", "gpu-role (second GPU)")


def stage_onthefly(t: Trainer) -> dict[tuple, tuple[dict, int]]:
    """``Trainer.stage`` for a raw folder: one device batch per bucket shape, features made
    on the arm's data device by a loader of its own (the trainer's sampler stays untouched)."""
    from myxtts.data.feed.onthefly import build_onthefly_loader

    src = t.data.loader
    return t.stage(*build_onthefly_loader(
        t.data.source, t.cfg, tokenizer=src.tokenizer, mel_stats=(src.mel_mean, src.mel_std),
        raw_splits=({"train": src.raw}, src.tokenizer, src.speakers), num_workers=0,
        plan=t.data.sampler.plan))


class Arm:
    """One data role for one preset: the trainer's parts, its step, staged batches and its
    loader / pre-staged windows (``Paired``), kept open so windows of several arms can
    interleave."""

    def __init__(self, name: str, path: Path, preset: str, sets: list[str],
                 args: argparse.Namespace, cuda: bool) -> None:
        from myxtts.data.feed.loader import PREFETCH_PER_WORKER
        from myxtts.data.feed.onthefly import OnTheFlyLoader

        bf = None if cuda else common.CPU_BATCH_FRAMES[preset]
        self.name = name
        common.say(f"{preset} {name}: building the run")
        self.t = t = Trainer(path, preset, bf, sets, args.threads,
                             args.tmp / f"run-{preset}-{ARMS.index(name)}")
        self.on_the_fly = isinstance(t.data.loader, OnTheFlyLoader)
        staged = stage_onthefly(t) if self.on_the_fly else t.stage()
        t.prime(staged)  # every shape once (allocations)
        accum = t.cfg.train.grad_accum_steps
        self.workers = t.data.loader.num_workers
        buffered = (t.cfg.data.ring_slots + accum - 1 if self.on_the_fly
                    else t.cfg.data.prefetch_batches) + PREFETCH_PER_WORKER * self.workers
        lead = args.lead if args.lead is not None else -(-buffered // accum)
        # shapes only: on the fly the plan knows header lengths, not the trimmed frames
        self.pair = Paired(t, staged, lead, exact=False)
        t.window(self.pair.loader(lead + args.warmup), lead + args.warmup)

    def result(self) -> dict[str, Any]:
        import torch

        t = self.t
        out = self.pair.result()
        out.update(params_m=t.params_m, mode=t.engine.mode,
                   device=str(t.device), threads=torch.get_num_threads(),
                   batch_frames=t.cfg.data.batch_frames, shapes=len(self.pair.staged),
                   batches=len(t.data.sampler), padding=t.data.sampler.padding_efficiency(),
                   workers=self.workers, lead=self.pair.lead,
                   data_device=t.cfg.data.data_device if self.on_the_fly else "store")
        return out


def specs(data: Path, store: Path, n_gpus: int) -> list[tuple[str, Path | None, list[str], str]]:
    """(arm, path, overrides, why not) per arm; path None when the arm cannot run here."""
    return [("store", store, [], ""),
            ("cpu-role", data, ["data.data_device=cpu"], ""),
            ("gpu-role (same GPU)", data if n_gpus else None, ["data.data_device=cuda:0"],
             "n/a (no GPU)"),
            ("gpu-role (second GPU)", data if n_gpus >= 2 else None, ["data.data_device=cuda:1"],
             "n/a (needs 2 GPUs)")]


def measure(preset: str, data: Path, store: Path, args: argparse.Namespace,
            n_gpus: int) -> dict[str, Any]:
    import torch

    live = [s for s in specs(data, store, n_gpus) if s[1] is not None]
    groups = [live] if not n_gpus else [[s] for s in live]  # CPU: side by side; CUDA: one by one
    results: dict[str, Any] = {}
    for group in groups:
        arms: list[Arm] = []
        try:
            for name, path, sets, _ in group:
                base = ["train.device=cuda:0"] if n_gpus else []
                if path == data:  # on the fly
                    base.append(f"data.num_workers={args.workers}")
                try:  # one role failing (e.g. a GPU role) still reports the others
                    arms.append(Arm(name, path, preset, base + sets + args.set, args, bool(n_gpus)))
                except Exception as e:
                    traceback.print_exc()
                    results[name] = f"failed: {type(e).__name__}"
            if arms:
                results.update(interleave(arms, preset, args.rounds, args.steps))
        finally:
            while arms:  # no reference may outlive the group (GPU memory, ring threads)
                arm = arms.pop()
                arm.pair.close()
                arm.t.close()
            gc.collect()
            if n_gpus:
                torch.cuda.empty_cache()
    return results


def interleave(arms: list[Arm], preset: str, rounds: int, steps: int) -> dict[str, Any]:
    """Rounds of paired windows per arm (A/B, then B/A), the arms' order rotating."""
    for r in range(rounds):
        for arm in arms[r % len(arms):] + arms[:r % len(arms)]:
            arm.pair.round(r, steps)
        common.say(f"{preset}: round {r + 1}/{rounds}: " + ", ".join(
            f"{a.name} {a.pair.windows['loader'][-1]['steps_per_s']:.2f} / "
            f"{a.pair.windows['pre-staged'][-1]['steps_per_s']:.2f} steps/s" for a in arms))
    return {a.name: a.result() for a in arms}


def rows_for(preset: str, res: dict[str, Any], na: dict[str, str]) -> list[tuple[str, list[str]]]:
    na = {**na, **{a: r for a, r in res.items() if isinstance(r, str)}}  # + arms that failed

    def cells(fn: Any) -> list[str]:
        return [na[a] if a in na else fn(res[a]) for a in ARMS]

    def rel(r: dict, kind: str) -> str:
        return "-" if "store" in na else " / ".join(
            f"{r[kind][m] / res['store'][kind][m]:.3f}" for m in ("steps_per_s", "utt_per_s"))

    first = next((res[a] for a in ARMS if a not in na), None)
    return [
        (f"== {preset}" + (f" ({first['params_m']:.1f} M parameters, {first['device']} "
                           f"{first['threads']}t {first['mode']} step)" if first else ""),
         cells(lambda r: r["data_device"])),
        ("data.batch_frames / shapes / batches per epoch",
         cells(lambda r: f"{r['batch_frames']} / {r['shapes']} / {r['batches']}")),
        ("padding efficiency (planned) / workers / lead",
         cells(lambda r: f"{r['padding']:.3f} / {r['workers']} / {r['lead']}")),
        ("steps/s: loader / pre-staged",
         cells(lambda r: f"{r['loader']['steps_per_s']:.2f} / {r['pre-staged']['steps_per_s']:.2f}")),
        ("utterances/s: loader / pre-staged",
         cells(lambda r: f"{r['loader']['utt_per_s']:.1f} / {r['pre-staged']['utt_per_s']:.1f}")),
        ("data-wait share: loader / pre-staged",
         cells(lambda r: f"{r['loader']['wait_share']:.2%} / {r['pre-staged']['wait_share']:.2%}")),
        ("RATIO loader / own pre-staged, median [min-max]", cells(lambda r: common.spread(r["ratios"]))),
        ("vs store: loader steps/s / utterances/s", cells(lambda r: rel(r, "loader"))),
        ("vs store: pre-staged steps/s / utterances/s", cells(lambda r: rel(r, "pre-staged"))),
        ("shape-order mismatches loader vs plan", cells(lambda r: str(r["mismatches"]))),
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_arguments(
        p, presets="comma-separated (default: tiny on CPU; tiny,base on CUDA)",
        data="raw dataset folder (default: ../shared/data/ljspeech-mini)", store=None,
        steps="optimizer steps per window (default 20 on CPU, 40 on CUDA)",
        rounds="windows per arm and kind (default 12 on CPU, 3 on CUDA)", batch_frames=None,
        threads="torch threads, 0 = torch's (default: CPU 1, CUDA 0)",
        set="config override for every arm and preset (repeatable)")
    p.add_argument("--workers", type=int, help="data.num_workers of the on-the-fly arms (default: "
                   "every CPU but one); the store keeps its own default")
    p.add_argument("--lead", type=int, help="untimed loader steps before each loader window "
                   "(default: the batches the arm's input path can hold)")
    p.add_argument("--warmup", type=int, default=2, help="untimed loader steps first (default 2)")
    args = p.parse_args()
    import torch

    from myxtts.data.feed.onthefly import default_onthefly_workers

    n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n_gpus:
        torch.cuda.set_device(0)  # as train() does: events and streams default to cuda:0
    args.steps = args.steps or (40 if n_gpus else 20)
    args.rounds = args.rounds or (3 if n_gpus else 12)
    args.threads = args.threads if args.threads is not None else (0 if n_gpus else 1)
    args.workers = args.workers if args.workers is not None else default_onthefly_workers()
    presets = (args.presets or ("tiny,base" if n_gpus else "tiny")).split(",")
    tmp = args.tmp = Path(tempfile.mkdtemp(prefix="myxtts-bench-roles-"))
    try:
        data, store = common.prepare(args.data, None, tmp)
        results = {preset: measure(preset, data, store, args, n_gpus) for preset in presets}
        head = common.header(data, store, (
            f"windows: {args.steps} steps, {args.rounds} rounds per arm, loader/pre-staged "
            f"interleaved A/B then B/A, medians over rounds; arms "
            f"{'one at a time' if n_gpus else 'interleaved round by round'}; {n_gpus} GPU(s)"
            + (f"; overrides {args.set}" if args.set else "")))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    na = {name: why for name, path, _, why in specs(data, store, n_gpus) if path is None}
    rows = [row for preset, res in results.items() for row in rows_for(preset, res, na)]
    print(common.table(list(ARMS), rows, head, "arm", max(24, *(len(a) + 2 for a in ARMS))))
    print("RATIO = loader steps/s / pre-staged steps/s of paired windows of the SAME arm (same shapes,\n"
          "  same order): on the fly, buckets come from header (untrimmed) lengths and pad longer than\n"
          "  the store's, so each arm is compared with its own batches. vs store: ratios of medians;\n"
          "  utterances/s is the fair cross-arm measure, pre-staged what on-the-fly shapes alone cost.\n"
          "data-wait share: StepTimer (time in next(loader); on CUDA only while the GPU queue was dry).")


if __name__ == "__main__":
    main()
