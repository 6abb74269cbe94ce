"""Where should the log-mels be made? Training throughput with the input from each data role.

    python benchmarks/data_roles.py [--presets tiny] [--steps N] [--rounds R] [--data DIR]
        [--workers N] [--threads N] [--lead N] [--set section.key=value]

One raw dataset (default ../shared/data/ljspeech-mini, else a generated demo corpus); per
preset, four ways to feed the trainer (columns), each through the trainer's own input path
(``open_train_data`` -> the loop's ``BatchStream``) in the trainer's step mode:

* store: ``myxtts prepare`` first, then the store's loader -> ``DevicePrefetcher`` (baseline);
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

ARMS = ("store", "cpu-role", "gpu-role (same GPU)", "gpu-role (second GPU)")


def stage_onthefly(t: common.Trainer) -> dict[tuple, tuple[dict, int]]:
    """``Trainer.stage`` for a raw folder: one device batch per bucket shape, features made
    on the arm's data device by a loader of its own (the trainer's sampler stays untouched)."""
    from myxtts.data.onthefly import build_onthefly_loader

    src = t.data.loader
    return t.stage(*build_onthefly_loader(
        t.data.source, t.cfg, tokenizer=src.tokenizer, mel_stats=(src.mel_mean, src.mel_std),
        raw_splits=({"train": src.raw}, src.tokenizer, src.speakers), num_workers=0,
        batch_sizes=t.batch_sizes))


class Arm:
    """One data role for one preset: the trainer's parts, its step, staged batches and its
    ``BatchStream``, kept open so windows of several arms can interleave."""

    def __init__(self, name: str, path: Path, preset: str, sets: list[str],
                 args: argparse.Namespace, cuda: bool) -> None:
        from myxtts.data.loader import PREFETCH_PER_WORKER
        from myxtts.data.onthefly import OnTheFlyLoader
        from myxtts.train.loop import BatchStream
        from myxtts.train.step import resolve_compile, resolve_graphs

        bf = None if cuda else common.CPU_BATCH_FRAMES[preset]
        self.name, self.args = name, args
        self.t = t = common.Trainer(path, preset, bf, sets, args.threads)
        self.step = step = t.step(resolve_compile(t.cfg.train.compile, t.device))
        if t.auto:  # as train() does: measure the batch sizes first
            t.fit_auto(step, args.tmp / f"run-{preset}-{ARMS.index(name)}")
        graphs = resolve_graphs(t.cfg.train.cuda_graphs, t.device, step.dtype, False, step.fused)
        common.say(f"{preset} {name}: warming up ({step.mode}{', graphs' if graphs else ''})")
        if step.compiled or graphs:
            t.warm_up(step, graphs)
        self.on_the_fly = isinstance(t.data.loader, OnTheFlyLoader)
        self.staged = stage_onthefly(t) if self.on_the_fly else t.stage()
        self.accum = accum = t.cfg.train.grad_accum_steps
        shapes = [k for k in sorted(self.staged) for _ in range(accum)]  # every shape once
        t.window(step, common.staged_fetch(self.staged, shapes), len(self.staged))
        loader = t.data.loader
        self.workers = loader.loader.num_workers if self.on_the_fly else loader.num_workers
        buffered = (t.cfg.data.ring_slots + accum - 1 if self.on_the_fly
                    else t.cfg.data.prefetch_batches) + PREFETCH_PER_WORKER * self.workers
        self.lead = args.lead if args.lead is not None else -(-buffered // accum)
        self.stream = iter(BatchStream(t.cfg, t.data, t.device, t.record))
        self.mismatches = 0
        self.windows: dict[str, list[dict]] = {"loader": [], "pre-staged": []}
        self.plan: list[tuple] = []
        t.window(step, self.loader_fetch(self.lead + args.warmup), self.lead + args.warmup)

    def loader_fetch(self, n_steps: int) -> Any:
        from myxtts.observe.flops import batch_key

        expected = iter([k for k, _ in self.t.upcoming(n_steps * self.accum)])

        def fetch() -> tuple[dict, int]:
            batch, frames = next(self.stream)
            # shapes only: on the fly the plan knows header lengths, not the trimmed frames
            self.mismatches += batch_key(batch) != next(expected)
            return batch, frames

        return fetch

    def next_round(self) -> None:
        """The shapes of the next timed loader window (after its lead steps)."""
        a = self.accum
        self.plan = [k for k, _ in self.t.upcoming((self.lead + self.args.steps) * a)][self.lead * a:]

    def run(self, kind: str) -> None:
        t, steps = self.t, self.args.steps
        if kind == "loader":
            if self.lead:  # untimed: use up what was buffered while other windows ran
                t.window(self.step, self.loader_fetch(self.lead), self.lead)
            fetch = self.loader_fetch(steps)
        else:
            fetch = common.staged_fetch(self.staged, self.plan)
        self.windows[kind].append(t.window(self.step, fetch, steps))

    def result(self) -> dict[str, Any]:
        import torch

        t, w = self.t, self.windows
        out: dict[str, Any] = {k: {m: common.median([x[m] for x in v]) for m in v[0]}
                               for k, v in w.items()}
        out.update(ratios=[a["steps_per_s"] / b["steps_per_s"]
                           for a, b in zip(w["loader"], w["pre-staged"])],
                   mismatches=self.mismatches, params_m=t.params_m, mode=self.step.mode,
                   device=str(t.device), threads=torch.get_num_threads(),
                   batch_frames=t.cfg.data.batch_frames, shapes=len(self.staged),
                   batches=len(t.data.sampler), padding=t.data.sampler.padding_efficiency(),
                   workers=self.workers, lead=self.lead,
                   data_device=t.cfg.data.data_device if self.on_the_fly else "store")
        return out

    def close(self) -> None:
        self.stream.close()  # stops the ring's producer thread (on the fly)


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
                results.update(interleave(arms, preset, args.rounds))
        finally:
            while arms:  # no reference may outlive the group (GPU memory, ring threads)
                arms.pop().close()
            gc.collect()
            if n_gpus:
                torch.cuda.empty_cache()
    return results


def interleave(arms: list[Arm], preset: str, rounds: int) -> dict[str, Any]:
    """Rounds of paired windows per arm (A/B, then B/A), the arms' order rotating."""
    for r in range(rounds):
        for arm in arms[r % len(arms):] + arms[:r % len(arms)]:
            arm.next_round()
            for kind in (["loader", "pre-staged"] if r % 2 == 0 else ["pre-staged", "loader"]):
                arm.run(kind)
        common.say(f"{preset}: round {r + 1}/{rounds}: " + ", ".join(
            f"{a.name} {a.windows['loader'][-1]['steps_per_s']:.2f} / "
            f"{a.windows['pre-staged'][-1]['steps_per_s']:.2f} steps/s" for a in arms))
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
    p.add_argument("--presets", help="comma-separated (default: tiny on CPU; tiny,base on CUDA)")
    p.add_argument("--data", type=Path, help="raw dataset folder (default: ../shared/data/ljspeech-mini)")
    p.add_argument("--steps", type=int, help="optimizer steps per window (default 20 on CPU, 40 on CUDA)")
    p.add_argument("--rounds", type=int, help="windows per arm and kind (default 12 on CPU, 3 on CUDA)")
    p.add_argument("--threads", type=int, help="torch threads, 0 = torch's (default: CPU 1, CUDA 0)")
    p.add_argument("--workers", type=int, help="data.num_workers of the on-the-fly arms (default: "
                   "every CPU but one); the store keeps its own default")
    p.add_argument("--lead", type=int, help="untimed loader steps before each loader window "
                   "(default: the batches the arm's input path can hold)")
    p.add_argument("--warmup", type=int, default=2, help="untimed loader steps first (default 2)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="config override for every arm and preset (repeatable)")
    args = p.parse_args()
    import torch

    from myxtts.data.onthefly import default_onthefly_workers

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
    width = max(24, *(len(a) + 2 for a in ARMS))
    line = lambda label, cells: f"{label:<{common.LABEL}}" + "".join(f"{c:>{width}}" for c in cells)  # noqa: E731
    out = head + ["", line("arm", ARMS), "-" * (common.LABEL + width * len(ARMS))]
    for preset, res in results.items():
        out += [line(label, cells) for label, cells in rows_for(preset, res, na)]
    print("\n".join(out))
    print("RATIO = loader steps/s / pre-staged steps/s of paired windows of the SAME arm (same shapes,\n"
          "  same order): on the fly, buckets come from header (untrimmed) lengths and pad longer than\n"
          "  the store's, so each arm is compared with its own batches. vs store: ratios of medians;\n"
          "  utterances/s is the fair cross-arm measure, pre-staged what on-the-fly shapes alone cost.\n"
          "data-wait share: StepTimer (time in next(loader); on CUDA only while the GPU queue was dry).")


if __name__ == "__main__":
    main()
