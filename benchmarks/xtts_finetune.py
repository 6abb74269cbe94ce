"""XTTS-v2 GPT fine-tuning, myxtts against coqui-tts's GPTTrainer, on the CPU, in one run.

    python benchmarks/xtts_finetune.py --peer-python PY [--data DIR] [--size reduced|released]
        [--batch-size B] [--steps N] [--warmup K] [--workers 0,2] [--threads T] [--rounds R]
        [--json FILE]

The peer environment (``PY``: coqui-tts 0.28 with torchaudio importable) writes an XTTS-v2
folder with seeded random weights once (``_xtts_peer.py make``, the tests' reduced size by
default), then lists the clips of ``--data`` (an LJSpeech-style folder; default
../shared/data/ljspeech-mini, skipped with a message when absent) its trainer accepts with
that folder's vocabulary (``_xtts_finetune_peer.py usable``): the benchmark's dataset is
those clips only (a metadata.csv of their rows beside a link to the wavs), so both sides
fine-tune the same GPT from the same weights on the same utterances with the same batch
size. Per loader worker count, each side runs in a fresh process: coqui-tts's own
dataset, collate and on-device DVAE codes (``_xtts_finetune_peer.py train``, whose
docstring says what of its Trainer's step it reproduces), then ours (:func:`ours`). Each
runs ``--warmup`` untimed optimizer steps, then times ``--steps`` more. ``--rounds R`` runs all
of it R times, the side that goes first alternating, and reports medians (:func:`combine`).

Reported per worker count: utterances per second of the timed steps, the ratio ours over
the peer's (above 1: myxtts is faster), and the peak resident memory of each side's process
plus its loader workers (``_xtts_finetune_peer.peak_rss_mb``: ``ru_maxrss`` of the process
plus the summed ``VmHWM`` of its live workers; shared pages count in each, so forked
workers look heavy), and the peak of the process tree's summed PSS (``PssPeak``: shared
pages split among their sharers, sampled every 0.2 s: the real footprint). ``--json``
writes every run and ``ratio_<W>_workers`` per worker count (null where ours did not run).
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


def ours(folder: Path, data: Path, batch_size: int, workers: int, steps: int, work_dir: Path,
         warmup: int = WARMUP) -> dict:
    """Fine-tune the GPT of the XTTS-v2 ``folder`` on ``data`` with myxtts and time it.

    ``data`` is the benchmark's LJSpeech-style folder (metadata.csv: ``id|text|normalized
    text``, English, the third column trains; wavs/ at 22050 Hz), holding only the clips the
    peer accepts. Anything prepared from it (a store) goes under ``work_dir`` (empty, a
    temporary folder); preparing is not timed. Train from ``folder``'s weights with the
    recipe's settings (AdamW betas 0.9/0.96, eps 1e-8, weight decay 1e-2 on weights, lr
    5e-6, text CE x 0.01 + mel CE x 1.0, conditioning 66150-132300 samples), ``batch_size``
    utterances per optimizer step, no gradient accumulation, fp32 on the CPU, ``workers``
    loader worker processes (0: the loader in this process). Run ``warmup`` optimizer steps
    untimed, then time ``steps`` more. The caller has set torch's thread count; do not
    change it.

    Returns a dict with the peer's keys: ``utterances_per_s`` (``steps * batch_size``
    over ``seconds``), ``steps``, ``batch_size``, ``workers``, ``seconds`` (of the timed
    steps), and ``peak_rss_mb``, ``main_rss_mb``, ``workers_rss_mb`` from
    ``_xtts_finetune_peer.peak_rss_mb()`` called after the timed steps while the loader's
    workers are still alive (when the keys are missing the caller fills them in after
    return, when the workers may be gone). ``peak_pss_mb`` is sampled by the caller around
    this call (``PssPeak``); leave it out. Optional: ``phases`` ({name: seconds} of the
    timed steps, the peer's names: loader, on_device, forward, backward, optimizer),
    ``loss`` (the last step's).
    """
    from _xtts_finetune_peer import peak_rss_mb
    from myxtts.cli.common import config_file
    from myxtts.config import load_config
    from myxtts.train.xtts.prepare import prepare_xtts
    from myxtts.train.xtts.recipe import XttsRecipe

    store = work_dir / "store"
    # every clip trains (the peer's dataset holds them all); the store is made once, untimed
    prepare_xtts(data, store, load_config(overrides=["data.val_fraction=0",
                                                     "data.min_val_utterances=0"]),
                 folder, workers=1, progress=False, echo=lambda *a: None)
    cfg = load_config(config_file("xtts-finetune"), None, [
        f"train.output_dir={work_dir / 'run'}", "train.device=cpu", "train.compile=off",
        "train.precision=fp32", "train.max_steps=1000000", "train.log_every=1000000",
        "train.val_every=1000000", "train.ckpt_every=1000000", "train.grad_accum_steps=1",
        f"data.num_workers={workers}", f"data.max_batch_size={batch_size}",
        # a budget every bucket fills to batch_size utterances: the batch is the peer's size
        f"data.batch_frames={batch_size * 300}"])
    recipe = XttsRecipe(cfg, store, init_from=folder, show_progress=False)
    recipe.setup()
    recipe.engine.model.train()
    counted = []

    class Count:
        def fetching(self) -> None: ...
        def fetched(self) -> None: ...
        def stepped(self, micro: list, frames: int) -> None:
            counted.append(recipe.utterances(micro))

    recipe.run_steps(warmup)
    started = time.perf_counter()
    recipe.run_steps(steps, watch=Count())
    seconds = time.perf_counter() - started
    loss = recipe.engine.read().get("loss")
    memory = peak_rss_mb()
    recipe.cleanup()
    return {"utterances_per_s": sum(counted) / seconds, "steps": steps,
            "batch_size": batch_size, "workers": workers, "seconds": seconds, "loss": loss,
            "utterances": sum(counted), **memory}


# ---------------------------------------------------------------- pure helpers

def keep_rows(metadata: str, ids: list[str]) -> str:
    """The lines of an LJSpeech ``metadata`` text whose id is in ``ids``, in their order."""
    wanted = set(ids)
    kept = [line for line in metadata.splitlines() if line.split("|", 1)[0] in wanted]
    return "".join(line + "\n" for line in kept)


def ratio(mine: dict | None, peer: dict) -> float | None:
    """Our utterances per second over the peer's (above 1: myxtts is faster), None without ours."""
    if not mine:
        return None
    return mine["utterances_per_s"] / peer["utterances_per_s"]


def run_ratio(r: dict) -> float | None:
    """A worker count's ratio: the median of its rounds' (``combine``), else its one run's."""
    return r["ratio"] if "ratio" in r else ratio(r.get("mine"), r["peer"])


def _median(values: list[float]) -> float:
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def combine(rounds: list[dict[int, dict]]) -> dict[int, dict]:
    """Several rounds of ``{workers: {"peer": run, "mine": run}}`` as one: per worker count
    each side's run of median speed, ``ratio`` the median of the rounds' own ratios (each
    round's two sides ran back to back, so a machine that drifts between rounds moves both),
    ``round_ratios`` every round's, the memory peaks the largest of any round."""
    out: dict[int, dict] = {}
    for w in rounds[0]:
        entry: dict = {}
        for side in ("peer", "mine"):
            runs = [r[w][side] for r in rounds if r[w].get(side)]
            if not runs:
                entry[side] = None
                continue
            runs.sort(key=lambda run: run["utterances_per_s"])
            chosen = dict(runs[(len(runs) - 1) // 2])
            for key in ("peak_rss_mb", "peak_pss_mb"):
                if all(key in run for run in runs):
                    chosen[key] = max(run[key] for run in runs)
            entry[side] = chosen
        ratios = [ratio(r[w].get("mine"), r[w]["peer"]) for r in rounds]
        if all(q is not None for q in ratios):
            entry["ratio"], entry["round_ratios"] = _median(ratios), ratios
        elif entry["mine"] is None:
            entry["ratio"] = None
        out[w] = entry
    return out


def figures(runs: dict[int, dict]) -> dict:
    """The JSON: every run, and ``ratio_<W>_workers`` per worker count ``W``."""
    out: dict = {"runs": {str(w): r for w, r in runs.items()}}
    for w, r in runs.items():
        out[f"ratio_{w}_workers"] = run_ratio(r)
    return out


def render(runs: dict[int, dict], head: list[str]) -> str:
    """The table: per worker count, both sides' utterances/s, the ratio, the peak memory
    (summed RSS peaks, then the sampled PSS peak)."""
    cols = [("workers", 8), ("myxtts utt/s", 14), ("coqui utt/s", 13), ("ratio", 8),
            ("myxtts RSS MB", 15), ("coqui RSS MB", 14), ("myxtts PSS MB", 15),
            ("coqui PSS MB", 14)]
    line = lambda cells: "".join(f"{c:>{w}}" for c, (_, w) in zip(cells, cols))  # noqa: E731
    rows = [*head, "", line([n for n, _ in cols]), "-" * sum(w for _, w in cols)]
    for w, r in runs.items():
        mine, peer = r.get("mine"), r["peer"]
        q = run_ratio(r)
        rows.append(line([str(w), f"{mine['utterances_per_s']:.2f}" if mine else "-",
                          f"{peer['utterances_per_s']:.2f}", f"{q:.2f}x" if q else "-",
                          *(f"{side[key]:.0f}" if side and key in side else "-"
                            for key in ("peak_rss_mb", "peak_pss_mb") for side in (mine, peer))]))
    return "\n".join(rows)


def phase_line(name: str, run: dict) -> str:
    """Where a side's timed steps went, in per cent of their seconds."""
    phases = run.get("phases") or {}
    parts = ", ".join(f"{k} {100 * v / run['seconds']:.0f}%" for k, v in phases.items())
    return f"  {name}, {run['workers']} workers: {parts or 'no breakdown'}"


# ---------------------------------------------------------------- running the sides

def _peer(args: argparse.Namespace, script: str, *argv: str) -> dict:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the peer's own environment, not this tree's sources
    r = subprocess.run([str(args.peer_python), str(HERE / script), *argv],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"the peer failed ({script} {argv[0]}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _ours_in_child(spec_file: Path) -> None:
    """The ``--ours SPEC`` child: a fresh process per run, so that its peak memory is the
    run's own."""
    import torch

    from _xtts_finetune_peer import PssPeak, peak_rss_mb

    spec = json.loads(spec_file.read_text())
    torch.set_num_threads(spec.pop("threads"))
    spec = {k: Path(v) if k in ("folder", "data", "work_dir") else v for k, v in spec.items()}
    pss = PssPeak().start()
    try:
        run = ours(**spec)
    except NotImplementedError as e:
        print(json.dumps({"not_implemented": str(e)}))
        return
    if "peak_rss_mb" not in run:
        run.update(peak_rss_mb())
    run.setdefault("peak_pss_mb", pss.stop())
    print(json.dumps(run))


def _run_ours(args: argparse.Namespace, tmp: Path, folder: Path, data: Path, workers: int) -> dict | None:
    work = Path(tempfile.mkdtemp(prefix=f"ours-{workers}-", dir=tmp))
    spec = {"folder": str(folder), "data": str(data), "batch_size": args.batch_size,
            "workers": workers, "steps": args.steps, "work_dir": str(work), "warmup": args.warmup,
            "threads": args.threads}
    (work / "spec.json").write_text(json.dumps(spec))
    r = subprocess.run([sys.executable, __file__, "--ours", str(work / "spec.json")],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"myxtts's side failed ({workers} workers):\n{r.stderr[-3000:]}")
    got = json.loads(r.stdout.strip().splitlines()[-1])
    if "not_implemented" in got:
        common.say(f"myxtts's side is not implemented yet ({got['not_implemented']}): peer only")
        return None
    return got


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--peer-python", type=Path, help="interpreter with coqui-tts")
    p.add_argument("--data", type=Path, help="LJSpeech-style folder (default: "
                   "../shared/data/ljspeech-mini beside the checkout)")
    p.add_argument("--size", choices=("reduced", "released"), default="reduced")
    p.add_argument("--batch-size", type=int, default=3, help="utterances per optimizer step "
                   "(default 3, the recipe's)")
    p.add_argument("--steps", type=int, default=8, help="timed optimizer steps per run")
    p.add_argument("--warmup", type=int, default=WARMUP, help="untimed steps before them")
    p.add_argument("--workers", default="0,2", help="loader worker counts, comma-separated")
    p.add_argument("--threads", type=int, default=1, help="torch threads on each side (coqui's "
                   "dataset module sets 1 when imported)")
    p.add_argument("--rounds", type=int, default=1, help="run the comparison this many times "
                   "(each side's order alternating) and report medians (default 1)")
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument("--ours", type=Path, help=argparse.SUPPRESS)  # the child running ours()
    args = p.parse_args()
    if args.ours:
        _ours_in_child(args.ours)
        return 0
    if args.peer_python is None:
        p.error("--peer-python is required")
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
                   f"{len(accepted['dropped'])} left out (the reference trainer refuses them)")
        rounds: list[dict[int, dict]] = []
        for k in range(args.rounds):
            this: dict[int, dict] = {}
            for w in counts:
                this[w] = {}
                # alternate which side runs first, so that a drifting machine favours neither
                for side in (("peer", "mine") if k % 2 == 0 else ("mine", "peer")):
                    if side == "peer":
                        common.say(f"round {k + 1}, {w} workers: coqui-tts's GPTTrainer, "
                                   f"{args.warmup} + {args.steps} steps ...")
                        this[w]["peer"] = _peer(
                            args, "_xtts_finetune_peer.py", "train", str(folder), str(data),
                            "--batch-size", str(args.batch_size), "--workers", str(w),
                            "--steps", str(args.steps), "--warmup", str(args.warmup),
                            "--threads", str(args.threads))
                    else:
                        common.say(f"round {k + 1}, {w} workers: myxtts, the same ...")
                        this[w]["mine"] = _run_ours(args, tmp, folder, data, w)
            rounds.append(this)
        runs = rounds[0] if len(rounds) == 1 else combine(rounds)
    head = [f"XTTS-v2 GPT fine-tuning, {args.size} size, seeded random weights; "
            f"{len(accepted['ids'])} clips of {source}",
            f"batch {args.batch_size}, {args.warmup} warm-up + {args.steps} timed optimizer steps, "
            f"fp32, torch threads {args.threads}; {os.cpu_count()} CPUs, load average "
            f"{os.getloadavg()[0]:.1f}"
            + (f"; medians of {args.rounds} rounds (ratio: the median of each round's)"
               if args.rounds > 1 else ""),
            "RSS MB: process ru_maxrss + the loader workers' summed VmHWM (shared pages in each); "
            "PSS MB: the process tree's sampled PSS peak"]
    print(render(runs, head))
    for w, r in runs.items():
        if r.get("round_ratios"):
            print(f"  {w} workers, each round's ratio: "
                  + ", ".join(f"{q:.2f}x" for q in r["round_ratios"]))
    print("where the timed steps went:")
    for r in runs.values():
        for name in ("mine", "peer"):
            if r.get(name):
                print(phase_line("myxtts" if name == "mine" else "coqui", r[name]))
    if args.json:
        args.json.write_text(json.dumps(figures(runs), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
