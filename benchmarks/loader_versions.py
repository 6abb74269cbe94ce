"""The on-the-fly loader of other revisions against this tree's, in one run.

    python benchmarks/loader_versions.py --against REV[,REV...] [--data DIR] [--workers 0,2]
                                         [--rounds R] [--seconds S]

Each revision's ``src/`` is exported (``git archive``) into a temporary folder, and every
arm runs in a fresh interpreter with ``PYTHONPATH`` pointing at its own sources: the same
script, the same clips, the same bucket-sampler batches (checked), 1 BLAS/OpenMP/torch
thread per process, features on the CPU (``data.data_device=cpu``), workers persistent.
Rounds alternate the order of the arms (load from other jobs comes and goes); the table
keeps each arm's best run and prints every run. A regression shows as a ratio below 1
against the revision it is measured against, under the same load in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import common

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
THIS = "this tree"


def _export(rev: str, into: Path) -> Path:
    """``rev``'s ``src/`` as files under ``into`` (a ``git archive`` of that revision)."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(common.REPO), "archive", rev, "src"],
                             capture_output=True, check=False)
    if archive.returncode != 0:
        raise SystemExit(f"--against {rev}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into / "src"


def _run_arm(src: Path, data: Path, workers: int, seconds: float) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONWARNINGS": "ignore",
           **{var: "1" for var in THREAD_VARS}}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--part", "--data", str(data),
           "--workers", str(workers), "--seconds", str(seconds)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"arm {src} ({workers} workers) failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def part(args: argparse.Namespace) -> dict:
    """One arm, in the interpreter whose ``PYTHONPATH`` names the revision's sources."""
    import hashlib

    import soundfile as sf
    import torch

    import myxtts
    from _pipelines import timed_epochs
    from myxtts.config import load_config

    try:  # the module moved between revisions
        from myxtts.data.feed.onthefly import build_onthefly_loader
    except ImportError:
        from myxtts.data.onthefly import build_onthefly_loader
    torch.set_num_threads(1)
    cfg = load_config(overrides=["data.data_device=cpu"])
    loader, sampler = build_onthefly_loader(args.data, cfg, num_workers=args.workers)
    plan = hashlib.sha1(json.dumps([sampler.batches(e) for e in range(3)]).encode()).hexdigest()
    import numpy as np

    durations = np.array([sf.info(str(p)).duration for p in loader.raw.paths])
    out = timed_epochs(loader, args.seconds, durations, cfg.audio.n_mels)
    return {**out, "plan": plan[:12], "clips": len(loader.raw.paths),
            "module": str(Path(myxtts.__file__).parent)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--against", required=False, default="",
                   help="comma-separated git revisions to measure against this tree")
    p.add_argument("--data", type=Path, default=None,
                   help=f"raw dataset (default {common.DEFAULT_DATA})")
    p.add_argument("--workers", default="0,2", help="loader worker counts (default 0,2)")
    p.add_argument("--rounds", type=int, default=3, help="alternating runs of each arm")
    p.add_argument("--seconds", type=float, default=4.0, help="minimum timed seconds per run")
    p.add_argument("--part", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.part:
        args.workers = int(args.workers)
        print(json.dumps(part(args)))
        return
    revs = [r for r in args.against.split(",") if r]
    if not revs:
        raise SystemExit("--against: name at least one git revision (e.g. --against v0.1.0)")
    workers = [int(w) for w in args.workers.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="myxtts-versions-"))
    try:
        data = common.find_data(args.data, tmp)
        for wav in sorted(data.rglob("*.wav")):  # warm the page cache for every arm
            wav.read_bytes()
        srcs = {rev: _export(rev, tmp / f"rev{i}") for i, rev in enumerate(revs)}
        srcs[THIS] = common.REPO / "src"
        arms = list(srcs)
        runs: dict[tuple[str, int], list[dict]] = {(a, w): [] for a in arms for w in workers}
        for r in range(args.rounds):
            for w in workers:
                for arm in arms if r % 2 == 0 else arms[::-1]:
                    common.say(f"round {r + 1}/{args.rounds}: {arm}, {w} workers")
                    runs[arm, w].append(_run_arm(srcs[arm], data, w, args.seconds))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    plans = {run["plan"] for v in runs.values() for run in v}
    if len(plans) != 1:
        raise SystemExit(f"the revisions did not iterate the same batches: plans {plans}")
    best = {k: max(v, key=lambda x: x["utt_per_s"]) for k, v in runs.items()}
    clips = runs[THIS, workers[0]][0]["clips"]
    lines = [f"data: {data} ({clips} train clips), {os.cpu_count()} CPUs, load average "
             f"{os.getloadavg()[0]:.1f}; on-the-fly loader, features on the CPU, utterances/s "
             f"(best of {args.rounds} alternating runs, each >= {args.seconds:.0f} s after a "
             f"warm-up epoch)", ""]
    head = f"{'revision':<24}" + "".join(f"{f'{w} workers':>14}{'ratio':>8}" for w in workers)
    lines += [head, "-" * len(head)]
    for arm in arms:
        cells = "".join(f"{best[arm, w]['utt_per_s']:>14.0f}"
                        f"{best[THIS, w]['utt_per_s'] / best[arm, w]['utt_per_s']:>7.2f}x"
                        for w in workers)
        lines.append(f"{arm:<24}{cells}")
    lines += ["", "ratio: this tree's utterances/s over the revision's (same run, same load)",
              "every run: " + "; ".join(
                  f"{arm} {w}w " + "/".join(f"{x['utt_per_s']:.0f}" for x in runs[arm, w])
                  for arm in arms for w in workers),
              "CPU-ms per audio-s (best run): " + "; ".join(
                  f"{arm} {w}w {best[arm, w]['cpu_per_audio_s'] * 1e3:.2f}"
                  for arm in arms for w in workers)]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
