"""XTTS-v2 GPT fine-tuning, myxtts against coqui-tts's GPTTrainer, on the CPU, in one run.

    python benchmarks/xtts_finetune.py --peer-python PY [--data DIR] [--size reduced|released]
        [--batch-size B] [--workers 0,2] [--threads T] [--warmup K] [--turns N]
        [--memory-steps M] [--json FILE]

The peer environment (``PY``: coqui-tts 0.28 with torchaudio importable) writes an XTTS-v2
folder with seeded random weights once (``_xtts_peer.py make``, the tests' reduced size by
default), then lists the clips of ``--data`` (an LJSpeech-style folder; default
../shared/data/ljspeech-mini, skipped with a message when absent) its trainer accepts with
that folder's vocabulary (``_xtts_finetune_peer.py usable``): the benchmark's dataset is
those clips only (a metadata.csv of their rows beside a link to the wavs), so both sides
fine-tune the same GPT from the same weights on the same utterances with the same batch
size. Ours trains from a store prepared once from them (untimed).

Each side is a trainer kept alive in a process of its own, answering commands
(``_xtts_finetune_peer.serve``): coqui-tts's own dataset, collate and on-device DVAE codes
(``_xtts_finetune_peer.PeerTrainer``, whose docstring says what of its Trainer's step it
reproduces), and ours (:class:`OurTrainer`). Per loader worker count:

1. memory: each side alone, one after the other, runs ``--warmup`` + ``--memory-steps``
   optimizer steps; its peak resident memory is read (``_xtts_finetune_peer.peak_rss_mb``:
   ``ru_maxrss`` of the process plus the summed ``VmHWM`` of its live workers; shared pages
   count in each, so forked workers look heavy) beside the sampled peak of the process
   tree's summed PSS (``PssPeak``: shared pages split among their sharers, the real
   footprint). Alone, because two live sides would split the library pages both map;
   the PSS sampler (a thread walking the tree's page tables five times a second, 4-8% of
   a core) runs in this pass only;
2. speed: both sides alive, each runs ``--warmup`` untimed steps and the rest of that
   first pass over the data (untimed), then they take turns, ``--turns`` times each, a turn
   one whole pass over the data (an epoch: every clip once, so both sides' turns hold the
   same utterances; the peer's loader starts its workers inside it, as its Trainer's every
   epoch does), the side that goes first alternating. A pair of turns lasts a minute or two:
   a drift of the machine's speed slower than that (a shared one moves by a third over a
   day) moves both of its sides alike, faster swings (its host taking time away in spells
   of seconds) show in the pairs' spread: each pair's ratio is ours over the peer's
   utterances per second in its two turns. While one side runs, the other waits on its
   stdin, its loader idle.

Reported per worker count: each side's utterances per second over all its timed turns,
the ratio of the two (above 1: myxtts is faster; what ``ratio_<W>_workers`` holds), the
pairs' median and spread, and the memory peaks; then each pair's ratio,
and the same by each training process's CPU time (``time.process_time``: what a virtual
machine's host takes away, steal, is not in it; loader workers are not counted, so it is
a cross-check of the step alone, not the figure). ``--json`` writes every
side's figures and turns, each pair's ratio and ``ratio_<W>_workers`` per worker count.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

HERE = Path(__file__).resolve().parent
WARMUP = 2  # optimizer steps before the timed ones: loader start-up, first calls


class OurTrainer:
    """myxtts fine-tuning the GPT of the XTTS-v2 ``folder`` on the XTTS ``store`` (prepared
    from the benchmark's clips), ready to step, with the recipe's settings (AdamW betas
    0.9/0.96, eps 1e-8, weight decay 1e-2 on weights, lr 5e-6, text CE x 0.01 + mel CE
    x 1.0, conditioning 66150-132300 samples): ``batch_size`` utterances per optimizer step,
    no gradient accumulation, fp32 on the CPU, ``workers`` loader worker processes (0: the
    loader in this process). Its run folder goes under ``work_dir``. The caller has set
    torch's thread count; it is not changed here. :meth:`steps`, :meth:`epoch` and
    :meth:`finish` answer as ``_xtts_finetune_peer.PeerTrainer``'s do."""

    def __init__(self, folder: Path, store: Path, batch_size: int, workers: int,
                 work_dir: Path, sample_pss: bool = True) -> None:
        from _xtts_finetune_peer import PssPeak
        from myxtts.cli.common import config_file
        from myxtts.config import load_config
        from myxtts.train.xtts.recipe import XttsRecipe

        self.pss = PssPeak().start() if sample_pss else None  # the memory pass only
        cfg = load_config(config_file("xtts-finetune"), None, [
            f"train.output_dir={work_dir / 'run'}", "train.device=cpu", "train.compile=off",
            "train.precision=fp32", "train.max_steps=1000000", "train.log_every=1000000",
            "train.val_every=1000000", "train.ckpt_every=1000000",
            "train.grad_accum_steps=1", f"data.num_workers={workers}",
            f"data.max_batch_size={batch_size}",
            # a budget every bucket fills to batch_size utterances: the batch is the peer's size
            f"data.batch_frames={batch_size * 300}"])
        self.recipe = XttsRecipe(cfg, store, init_from=folder, show_progress=False)
        self.recipe.setup()
        self.recipe.engine.model.train()
        self.batch_size, self.workers = batch_size, workers

    def steps(self, n: int) -> dict:
        """Run ``n`` optimizer steps; their seconds, utterances and ``phases`` (the loader's
        wait, the rest of the step)."""
        recipe, counted, waited = self.recipe, [], [0.0]

        class Watch:
            def fetching(self) -> None:
                self.since = time.perf_counter()

            def fetched(self) -> None:
                waited[0] += time.perf_counter() - self.since

            def stepped(self, micro: list, frames: int) -> None:
                counted.append(recipe.utterances(micro))

        cpu, started = time.process_time(), time.perf_counter()
        recipe.run_steps(n, watch=Watch())
        seconds = time.perf_counter() - started
        return {"seconds": seconds, "steps": n, "utterances": sum(counted),
                "cpu_seconds": time.process_time() - cpu,
                "phases": {"loader": waited[0], "step": seconds - waited[0]},
                "loss": recipe.engine.read().get("loss")}

    def epoch(self) -> dict:
        """:meth:`steps` to the end of the data's pass under way (a whole one when the last
        pass ended)."""
        total = len(self.recipe.loader)
        left = total - self.recipe.record.batches_consumed
        return self.steps(left if left > 0 else total)

    def finish(self) -> dict:
        """The memory peaks (read while the loader's workers are alive), then the run ends."""
        import torch

        from _xtts_finetune_peer import peak_rss_mb

        memory = peak_rss_mb()
        memory["peak_pss_mb"] = None if self.pss is None else self.pss.stop()
        self.recipe.cleanup()
        return {**memory, "batch_size": self.batch_size, "workers": self.workers,
                "threads": torch.get_num_threads()}


# ---------------------------------------------------------------- pure helpers

def keep_rows(metadata: str, ids: list[str]) -> str:
    """The lines of an LJSpeech ``metadata`` text whose id is in ``ids``, in their order."""
    wanted = set(ids)
    kept = [line for line in metadata.splitlines() if line.split("|", 1)[0] in wanted]
    return "".join(line + "\n" for line in kept)


def totals(turns: list[dict]) -> dict:
    """A side's timed turns as one: summed seconds, steps, utterances and phases, and
    ``utterances_per_s`` over them all."""
    seconds = sum(t["seconds"] for t in turns)
    phases: dict[str, float] = {}
    for t in turns:
        for name, value in t.get("phases", {}).items():
            phases[name] = phases.get(name, 0.0) + value
    utterances = sum(t["utterances"] for t in turns)
    return {"utterances_per_s": utterances / seconds, "seconds": seconds, "utterances": utterances,
            "steps": sum(t["steps"] for t in turns), "phases": phases,
            "loss": turns[-1].get("loss")}


def pair_ratios(mine: list[dict], peer: list[dict], clock: str = "seconds") -> list[float]:
    """Per pair of turns (ours, the peer's, run back to back): our utterances per second over
    the peer's (above 1: myxtts is faster), by the wall clock or, ``clock="cpu_seconds"``,
    by each training process's CPU time."""
    return [(m["utterances"] / m[clock]) / (p["utterances"] / p[clock])
            for m, p in zip(mine, peer, strict=True)]


def entry(mine: list[dict], peer: list[dict], memory: dict[str, dict]) -> dict:
    """One worker count's figures: each side's :func:`totals` with its memory peaks
    (``memory["mine"]``, ``memory["peer"]``), ``ratio`` (ours over the peer's utterances
    per second, all turns), every pair's ratio and their median."""
    ratios = pair_ratios(mine, peer)
    ours, theirs = totals(mine), totals(peer)
    return {"mine": {**ours, **memory["mine"]}, "peer": {**theirs, **memory["peer"]},
            "ratio": ours["utterances_per_s"] / theirs["utterances_per_s"],
            "pair_ratios": ratios, "pairs_median": common.median(ratios),
            "cpu_pair_ratios": pair_ratios(mine, peer, "cpu_seconds"),
            "turns": {"mine": mine, "peer": peer}}


def figures(runs: dict[int, dict]) -> dict:
    """The JSON: every worker count's :func:`entry`, and ``ratio_<W>_workers`` per count."""
    out: dict = {"runs": {str(w): r for w, r in runs.items()}}
    for w, r in runs.items():
        out[f"ratio_{w}_workers"] = r["ratio"]
    return out


def render(runs: dict[int, dict], head: list[str]) -> str:
    """The table: per worker count, both sides' utterances/s over all their turns, their
    ratio, the pairs' median and spread (how far the machine moved a pair), the peak memory
    (summed RSS peaks, then the sampled PSS peak)."""
    cols = [("workers", 8), ("myxtts utt/s", 14), ("coqui utt/s", 13), ("ratio", 8),
            ("pairs median", 14), ("pairs min-max", 15), ("myxtts RSS MB", 15),
            ("coqui RSS MB", 14), ("myxtts PSS MB", 15), ("coqui PSS MB", 14)]
    line = lambda cells: "".join(f"{c:>{w}}" for c, (_, w) in zip(cells, cols))  # noqa: E731
    rows = [*head, "", line([n for n, _ in cols]), "-" * sum(w for _, w in cols)]
    for w, r in runs.items():
        mine, peer, pairs = r["mine"], r["peer"], r["pair_ratios"]
        rows.append(line([str(w), f"{mine['utterances_per_s']:.2f}",
                          f"{peer['utterances_per_s']:.2f}", f"{r['ratio']:.2f}x",
                          f"{r['pairs_median']:.2f}x", f"{min(pairs):.2f}-{max(pairs):.2f}",
                          *(f"{side[key]:.0f}" for key in ("peak_rss_mb", "peak_pss_mb")
                            for side in (mine, peer))]))
    return "\n".join(rows)


def phase_line(name: str, run: dict) -> str:
    """Where a side's timed steps went, in per cent of their seconds."""
    phases = run.get("phases") or {}
    parts = ", ".join(f"{k} {100 * v / run['seconds']:.0f}%" for k, v in phases.items())
    return f"  {name}, {run['workers']} workers: {parts or 'no breakdown'}"


# ---------------------------------------------------------------- running the sides

class Side:
    """A side's trainer in a process of its own (``argv``), asked over its stdin/stdout
    (``_xtts_finetune_peer.serve``); its stderr goes to ``log``."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict | None = None) -> None:
        self.name, self.log = name, log
        with log.open("w") as err:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=err, text=True, env=env)

    def answer(self) -> dict:
        for line in self.proc.stdout:
            try:
                got = json.loads(line)
            except json.JSONDecodeError:
                continue  # not an answer: something the side printed before serving
            if isinstance(got, dict):
                return got
        self.proc.wait()
        tail = self.log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"{self.name} stopped (exit {self.proc.returncode}); its log "
                         f"{self.log} ends:\n{tail}")

    def ask(self, command: str) -> dict:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.answer()

    def finish(self) -> dict:
        got = self.ask("finish")
        self.proc.wait()
        return got


def _ours_in_child(spec_file: Path) -> None:
    """The ``--ours SPEC`` child: :class:`OurTrainer` serving the benchmark's commands."""
    import torch

    from _xtts_finetune_peer import serve

    spec = json.loads(spec_file.read_text())
    torch.set_num_threads(spec["threads"])
    serve(lambda: OurTrainer(Path(spec["folder"]), Path(spec["store"]), spec["batch_size"],
                             spec["workers"], Path(spec["work_dir"]), spec["sample_pss"]))


def start(side: str, args: argparse.Namespace, paths: dict[str, Path], workers: int,
          sample_pss: bool) -> Side:
    """A fresh process of ``side`` ("mine" or "peer") at ``workers`` loader workers, ready;
    ``sample_pss``: its PSS sampled (the memory pass; the sampling costs CPU time)."""
    work = Path(tempfile.mkdtemp(prefix=f"{side}-{workers}-", dir=paths["tmp"]))
    if side == "peer":
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)  # the peer's own environment, not this tree's sources
        argv = [str(args.peer_python), str(HERE / "_xtts_finetune_peer.py"), "serve",
                str(paths["folder"]), str(paths["data"]), "--batch-size", str(args.batch_size),
                "--workers", str(workers), "--threads", str(args.threads)]
        argv += ["--sample-pss"] if sample_pss else []
        s = Side("coqui-tts's side", argv, work / "log.txt", env)
    else:
        spec = {"folder": str(paths["folder"]), "store": str(paths["store"]),
                "batch_size": args.batch_size, "workers": workers, "work_dir": str(work),
                "threads": args.threads, "sample_pss": sample_pss}
        (work / "spec.json").write_text(json.dumps(spec))
        s = Side("myxtts's side", [sys.executable, __file__, "--ours", str(work / "spec.json")],
                 work / "log.txt")
    s.answer()  # {"ready": true}
    return s


def measure(args: argparse.Namespace, paths: dict[str, Path], workers: int) -> dict:
    """One worker count: the memory pass, then the interleaved turns (module docstring)."""
    memory = {}
    for side in ("mine", "peer"):
        common.say(f"{workers} workers, memory: {side} alone, "
                   f"{args.warmup} + {args.memory_steps} steps ...")
        s = start(side, args, paths, workers, sample_pss=True)
        s.ask(f"steps {args.warmup + args.memory_steps}")
        memory[side] = s.finish()
    common.say(f"{workers} workers, speed: both sides warm up, then {args.turns} epochs each, "
               f"taking turns ...")
    sides = {side: start(side, args, paths, workers, sample_pss=False)
             for side in ("mine", "peer")}
    for s in sides.values():
        s.ask(f"steps {args.warmup}")
        s.ask("epoch")  # the rest of the first pass: every timed turn is a whole one
    turns: dict[str, list[dict]] = {"mine": [], "peer": []}
    for k in range(args.turns):
        for side in (("mine", "peer") if k % 2 == 0 else ("peer", "mine")):
            turns[side].append(sides[side].ask("epoch"))
    for s in sides.values():
        s.finish()
    return entry(turns["mine"], turns["peer"], memory)


def _peer(args: argparse.Namespace, script: str, *argv: str) -> dict:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the peer's own environment, not this tree's sources
    r = subprocess.run([str(args.peer_python), str(HERE / script), *argv],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"the peer failed ({script} {argv[0]}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--peer-python", type=Path, help="interpreter with coqui-tts")
    p.add_argument("--data", type=Path, help="LJSpeech-style folder (default: "
                   "../shared/data/ljspeech-mini beside the checkout)")
    p.add_argument("--size", choices=("reduced", "released"), default="reduced")
    p.add_argument("--batch-size", type=int, default=3, help="utterances per optimizer step "
                   "(default 3, the recipe's)")
    p.add_argument("--workers", default="0,2", help="loader worker counts, comma-separated")
    p.add_argument("--threads", type=int, default=1, help="torch threads on each side (coqui's "
                   "dataset module sets 1 when imported)")
    p.add_argument("--warmup", type=int, default=WARMUP, help="untimed steps before the timed ones")
    p.add_argument("--turns", type=int, default=3, help="timed epochs per side, taking turns "
                   "(default 3)")
    p.add_argument("--memory-steps", type=int, default=12, help="steps of the memory pass after "
                   "the warm-up (default 12)")
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument("--ours", type=Path, help=argparse.SUPPRESS)  # the child running ours
    p.add_argument("--prepare", nargs=3, type=Path, help=argparse.SUPPRESS)  # DATA STORE FOLDER
    args = p.parse_args()
    if args.ours:
        _ours_in_child(args.ours)
        return 0
    if args.prepare:
        prepare_store(*args.prepare)
        return 0
    if args.peer_python is None:
        p.error("--peer-python is required")
    if args.turns < 1 or args.memory_steps < 0 or args.warmup < 0:
        p.error("--turns must be at least 1, --memory-steps and --warmup at least 0")
    source = args.data or common.DEFAULT_DATA
    if not (source / "metadata.csv").exists():
        print(f"skipped: no dataset at {source} (an LJSpeech-style folder with metadata.csv and "
              f"wavs/); pass --data DIR")
        return 0
    counts = [int(w) for w in args.workers.split(",") if w.strip()]
    with tempfile.TemporaryDirectory(prefix="xtts-finetune-") as tmp:
        tmp = Path(tmp)
        folder = tmp / "xtts"
        common.say(f"writing a {args.size}-size XTTS-v2 folder with seeded random weights (peer) ...")
        _peer(args, "_xtts_peer.py", "make", str(folder), "--size", args.size)
        accepted = _peer(args, "_xtts_finetune_peer.py", "usable", str(folder), str(source))
        data = tmp / "data"
        data.mkdir()
        (data / "metadata.csv").write_text(
            keep_rows((source / "metadata.csv").read_text(encoding="utf-8"), accepted["ids"]),
            encoding="utf-8")
        (data / "wavs").symlink_to((source / "wavs").resolve(), target_is_directory=True)
        common.say(f"{len(accepted['ids'])} clips of {source} train; "
                   f"{len(accepted['dropped'])} left out (the reference trainer refuses them); "
                   f"preparing our store (untimed) ...")
        paths = {"tmp": tmp, "folder": folder, "data": data, "store": tmp / "store"}
        # in a child: this process imports no torch, so it shares no library pages with
        # the sides (which would lower their PSS)
        subprocess.run([sys.executable, __file__, "--prepare", str(data), str(paths["store"]),
                        str(folder)], check=True)
        runs = {w: measure(args, paths, w) for w in counts}
    head = [f"XTTS-v2 GPT fine-tuning, {args.size} size, seeded random weights; "
            f"{len(accepted['ids'])} clips of {source}",
            f"batch {args.batch_size}, fp32, torch threads {args.threads}; {os.cpu_count()} CPUs, "
            f"load average {os.getloadavg()[0]:.1f}",
            f"speed: {args.warmup} warm-up steps and the rest of that epoch, then {args.turns} "
            f"epochs per side, taking turns; ratio: of the utterances/s over all turns; "
            f"pairs: each pair of turns' ratio",
            f"memory: each side alone, {args.warmup} + {args.memory_steps} steps; RSS MB: process "
            f"ru_maxrss + the loader workers' summed VmHWM (shared pages in each); PSS MB: the "
            f"process tree's sampled PSS peak"]
    print(render(runs, head))
    for w, r in runs.items():
        print(f"  {w} workers, each pair's ratio: "
              + ", ".join(f"{q:.2f}x" for q in r["pair_ratios"])
              + "; by the training processes' CPU time (no time the machine took away; "
              + "loader workers not counted): "
              + ", ".join(f"{q:.2f}x" for q in r["cpu_pair_ratios"]))
    print("where the timed steps went:")
    for r in runs.values():
        for name in ("mine", "peer"):
            print(phase_line("myxtts" if name == "mine" else "coqui", r[name]))
    if args.json:
        args.json.write_text(json.dumps(figures(runs), indent=1))
    return 0


def prepare_store(data: Path, store: Path, folder: Path) -> None:
    """Our XTTS store of ``data`` for ``folder`` (every clip trains: no validation split)."""
    from myxtts.config import load_config
    from myxtts.train.xtts.prepare import prepare_xtts

    prepare_xtts(data, store, load_config(overrides=["data.val_fraction=0",
                                                     "data.min_val_utterances=0"]),
                 folder, workers=1, progress=False, echo=lambda *a: None)


if __name__ == "__main__":
    sys.exit(main())
