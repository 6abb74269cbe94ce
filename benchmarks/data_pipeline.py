"""Data pipeline benchmark: prepare throughput, loader throughput, padding, memory.

    python benchmarks/data_pipeline.py [--data DIR] [--parts prepare,loaders,padding,onthefly,
                                       precomputed] [--peer-python PY] [--workers N]
                                       [--seconds S] [--rounds R]

Uses ``../shared/data/ljspeech-mini`` (next to the repository) when present, else a
generated demo corpus. Prints ONE table, every number measured in this run:

(a) prepare throughput in audio-seconds per second: ``myxtts prepare`` with ``--workers``
    = the available cores vs the naive single-process baseline a user would write
    (``librosa.load`` + ``librosa.feature.melspectrogram`` per clip, library default
    threads), and vs the same loop tuned (1 BLAS/OpenMP thread); both baselines are
    warmed up first so librosa's one-off import/JIT cost is not counted against them.
    Totals and per core (ours / workers vs baseline / 1 process), with ratios.
(b) batches from the store: utterances/s and audio-seconds/s of ``build_loader`` vs a
    naive DataLoader that loads each wav and computes its mel with librosa in
    ``__getitem__`` (same worker count), over several epochs.
(c) padding efficiency and distinct batch shapes of the bucket sampler, on this data
    and on an LJSpeech-sized set (13,100 lengths drawn from this data's distribution).
(d) peak RSS of the loader process (and of its largest worker).
(e) no store: ``build_onthefly_loader`` (log-mels computed as it goes) vs per-item peers
    on the same clips and the same batches, with 0 and 2 (persistent) workers each:
    utterances/s, audio-s/s and CPU seconds (main process + live workers) per audio
    second after a warm-up epoch; ratios to the best peer per worker count and overall.
    Peers: the naive librosa loader of (b) and, with ``--peer-python``, Coqui TTS's
    ``TTSDataset`` (``_peers.py``). ``--parts onthefly`` runs only this section.
(f) the store loader vs lhotse's precomputed-feature loading (``--peer-python``) of the
    store's own mels, the same batches, at 0 and 2 workers, and the store loader with its
    own worker choice (``data.num_workers=-1``). ``--parts precomputed``.

``--peer-python``: the interpreter of a separate environment holding the peers (never
dependencies of myxtts), e.g. ``python -m venv /work/bench-venv && /work/bench-venv/bin/pip
install torch==2.13.0 && /work/bench-venv/bin/pip install coqui-tts lhotse lilcom`` (docs/
performance.md). Each measurement runs in its own subprocess so imports, page-cache
warm-up and peak memory of one do not leak into another.
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
from _pipelines import PARTS, source_audio_s

SECTIONS = ("prepare", "loaders", "padding", "onthefly", "precomputed")  # --parts (a / b+d / c / e / f)


# ---------------------------------------------------------------- driver

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _run_part(part: str, *, default_threads: bool = False, **kw) -> dict:
    """Run one part in a fresh interpreter. By default with one BLAS/OpenMP thread per
    process (parallelism only through processes); ``default_threads`` leaves the thread
    settings to the libraries, as a user's naive script would."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--part", part]
    for k, v in kw.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    if not default_threads:
        env.update({var: "1" for var in THREAD_VARS})
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"benchmark part {part} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _run_peer(args: argparse.Namespace, kind: str, workers: int, **kw) -> dict:
    """A peer's loader (``_peers.py``) in the ``--peer-python`` interpreter: the spec is
    written by this environment (``_peer_specs.py``), the loader runs in that one."""
    spec = args.tmp / f"{kind}-{kw.get('storage', '')}.json"
    if not spec.exists():
        _run_part(f"{kind}_spec", out=spec, **kw)
    env = {**os.environ, "PYTHONWARNINGS": "ignore", **{var: "1" for var in THREAD_VARS}}
    env.pop("PYTHONPATH", None)  # the peers' environment, without this project's sources
    cmd = [str(args.peer_python), str(Path(__file__).resolve().parent / "_peers.py"), str(spec),
           str(workers), str(args.seconds)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"peer {kind} ({workers} workers) failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _row(metric: str, ours_v: str, base_v: str = "", ratio: str = "") -> str:
    return f"{metric:<52} {ours_v:>16} {base_v:>14} {ratio:>8}"


def _store_section(args: argparse.Namespace, parts: set[str], data: Path,
                   tmp: Path) -> tuple[list[str], list[str]]:
    """Rows and footnotes of (a)-(d): prepare, the store loader, padding, memory."""
    from myxtts.data.feed.loader import default_num_workers
    from myxtts.system import available_cpus

    workers = args.workers or available_cpus()
    store = tmp / "store"
    rows: list[str] = []
    notes: list[str] = []
    print("measuring prepare ...", file=sys.stderr)
    # Alternate the three and keep each one's best run: other jobs on the machine come
    # and go, and a single run of each would compare different load conditions.
    runs: dict[str, list[dict]] = {"ours": [], "base": [], "tuned": []}
    for _ in range(args.repeats if "prepare" in parts else 1):
        runs["ours"].append(_run_part("prepare", data=data, out=store, workers=workers))
        if "prepare" in parts:
            runs["base"].append(_run_part("baseline", default_threads=True, data=data))
            runs["tuned"].append(_run_part("baseline", data=data))
    if "prepare" in parts:
        ours, base, tuned = (min(runs[k], key=lambda r: r["seconds"]) for k in runs)
        ours_rate, base_rate, tuned_rate = (r["audio_s"] / r["seconds"] for r in (ours, base, tuned))
        # Per CPU-second: what each process actually got to run, so other jobs competing for
        # the cores move it much less than the wall-clock rates (best run of each kind).
        ours_cpu, base_cpu, tuned_cpu = (max(r["audio_s"] / r["cpu_s"] for r in runs[k])
                                         for k in runs)
        rows += [
            _row(f"(a) prepare, audio-s/s (ours --workers {workers} vs naive)", f"{ours_rate:.0f}",
                 f"{base_rate:.0f}", f"{ours_rate / base_rate:.2f}x"),
            _row("(a) prepare, audio-s/s per core (vs naive)", f"{ours_rate / workers:.0f}",
                 f"{base_rate:.0f}", f"{ours_rate / workers / base_rate:.2f}x"),
            _row("    vs baseline tuned (1 BLAS thread), audio-s/s", f"{ours_rate:.0f}",
                 f"{tuned_rate:.0f}", f"{ours_rate / tuned_rate:.2f}x"),
            _row("    vs baseline tuned, audio-s/s per core", f"{ours_rate / workers:.0f}",
                 f"{tuned_rate:.0f}", f"{ours_rate / workers / tuned_rate:.2f}x"),
            _row("    audio-s per CPU-second (vs naive baseline)", f"{ours_cpu:.0f}",
                 f"{base_cpu:.0f}", f"{ours_cpu / base_cpu:.2f}x"),
            _row("    audio-s per CPU-second (vs tuned baseline)", f"{ours_cpu:.0f}",
                 f"{tuned_cpu:.0f}", f"{ours_cpu / tuned_cpu:.2f}x")]
        notes += [
            f"(a) best of {args.repeats} alternating runs each, all warmed up; per core = "
            f"ours / {workers} worker processes vs baseline / 1 process",
            f"    baseline (naive, default threads): librosa.load + melspectrogram per clip, "
            f"1 process, library thread defaults ({base['threads']}); its first clip took "
            f"{base['cold_first_clip_s']:.1f} s",
            f"    baseline tuned: the same loop with OMP/OPENBLAS/MKL_NUM_THREADS=1 "
            f"({tuned['threads']}); CPU-seconds: user+system of all processes/threads "
            f"(ours: prepare's main process and its workers)"]
    if "loaders" in parts:
        auto = default_num_workers()
        print("measuring loaders ...", file=sys.stderr)
        loaders = {w: _run_part("loader", store=store, workers=w, seconds=args.seconds)
                   for w in sorted({0, 1, 2, auto})}
        naive = _run_part("naive", data=data, workers=auto, seconds=args.seconds)
        mine = loaders[auto]
        rows += [
            _row(f"(b) store loader, utterances/s ({auto} workers = auto)",
                 f"{mine['utt_per_s']:.0f}", f"{naive['utt_per_s']:.0f}",
                 f"{mine['utt_per_s'] / naive['utt_per_s']:.1f}x"),
            _row("(b) store loader, audio-s/s", f"{mine['audio_s_per_s']:.0f}",
                 f"{naive['audio_s_per_s']:.0f}",
                 f"{mine['audio_s_per_s'] / naive['audio_s_per_s']:.1f}x")]
        rows += [_row(f"    ours with {w} worker(s), utterances/s", f"{r['utt_per_s']:.0f}")
                 for w, r in loaders.items() if w != auto]
        notes.append(f"(b) baseline: per-item librosa DataLoader, batch 16, {auto} workers; every "
                     f"loader run >= {args.seconds:.0f} s, several epochs of the same clips")
    if "padding" in parts:
        entries = list(_run_part("padding", store=store).values())
        for entry, size in [(entries[0], "small"), (entries[0], "big"), (entries[1], "big")]:
            eff, shapes, n = entry[size]
            rows.append(_row(f"(c) padding efficiency, {n} utts, num_buckets={entry['num_buckets']}",
                             f"{eff:.3f} / {shapes} shapes"))
    if "loaders" in parts:
        rows.append(_row("(d) loader peak RSS MiB (main process)", f"{mine['rss_mb']:.0f}",
                         f"{naive['rss_mb']:.0f}"))
        rows += [_row(f"    ours with {w} worker(s): main / largest worker",
                      f"{r['rss_mb']:.0f} / {r['worker_rss_mb']:.0f}") for w, r in loaders.items() if w]
    return rows, notes


def _alternate(arms: list[tuple[str, int]], rounds: int, run_one, section: str
               ) -> tuple[dict[tuple[str, int], list[dict]], dict[tuple[str, int], dict], str]:
    """Every ``(kind, workers)`` arm run ``rounds`` times, the order reversed every other round
    (load from other jobs comes and goes), checked to have iterated the same batches: the
    runs per arm, each arm's best run by utterances/s, and the batch plan's digest."""
    runs: dict[tuple[str, int], list[dict]] = {arm: [] for arm in arms}
    for r in range(rounds):
        for arm in arms if r % 2 == 0 else arms[::-1]:
            runs[arm].append(run_one(*arm))
    plans = {run["plan"] for v in runs.values() for run in v}
    if len(plans) != 1:
        raise SystemExit(f"({section}) the loaders did not iterate the same batches: plans {plans}")
    best = {arm: max(v, key=lambda x: x["utt_per_s"]) for arm, v in runs.items()}
    return runs, best, plans.pop()


STORE_WORKERS = (0, 2)
STORAGES = ("lilcom_chunky", "numpy_files")  # lhotse's default feature storage; uncompressed


def _precomputed_section(args: argparse.Namespace, store: Path) -> tuple[list[str], list[str]]:
    """Rows and footnotes of (f): the store loader vs lhotse's precomputed features, the
    same batches (the store's sampler), interleaved rounds; the store loader also with its
    own worker choice (``data.num_workers=-1``)."""
    print("measuring the store loader vs precomputed-feature peers ...", file=sys.stderr)
    kinds = ["store", *(f"lhotse:{s}" for s in STORAGES if args.peer_python)]
    arms = [(k, w) for w in STORE_WORKERS for k in kinds] + [("store", -1)]

    def run_one(kind: str, w: int) -> dict:
        if kind == "store":
            return _run_part("store", store=store, workers=w, seconds=args.seconds)
        return _run_peer(args, "lhotse", w, store=store, storage=kind.split(":")[1])

    runs, best, plan = _alternate(arms, args.rounds, run_one, "f")
    rows: list[str] = []
    for w in STORE_WORKERS:
        o = best["store", w]
        rows.append(_row(f"(f) store loader, utterances/s, {w} workers", f"{o['utt_per_s']:.0f}"))
        for k in kinds[1:]:
            peer = best[k, w]
            rows.append(_row(f"    vs {k}, {w} workers", f"{o['utt_per_s']:.0f}",
                             f"{peer['utt_per_s']:.0f}", f"{o['utt_per_s'] / peer['utt_per_s']:.1f}x"))
    auto = best["store", -1]
    peer_best = max((best[k, w]["utt_per_s"] for k in kinds[1:] for w in STORE_WORKERS), default=0)
    rows.append(_row(f"(f) store loader, its own choice ({auto['workers']} workers), utt/s",
                     f"{auto['utt_per_s']:.0f}", f"{peer_best:.0f}" if peer_best else "",
                     f"{auto['utt_per_s'] / peer_best:.1f}x" if peer_best else ""))
    every = "; ".join(f"{k} {w}w " + "/".join(f"{run['utt_per_s']:.0f}" for run in v)
                      for (k, w), v in runs.items())
    notes = [
        "(f) precomputed peers: lhotse PrecomputedFeatures (collate_features of a CutSet per "
        f"batch; storage {', '.join(STORAGES)}) over the store's own mels, + token ids"
        + ("" if args.peer_python else ": NOT measured, pass --peer-python (an environment "
           "with lhotse)"),
        f"    same {best['store', 0]['utts'] // max(1, best['store', 0]['epochs'])} utterances "
        f"per epoch and the same bucket-sampler batches for every loader (plan {plan}); "
        f"workers persistent, prefetch 2 tasks (the store loader's workers: one stream "
        f"across epochs, cheap batches up to 3 to a task); 1 BLAS thread per process; best "
        f"of {args.rounds} "
        f"alternating runs; lilcom_chunky is lhotse's default feature storage, numpy_files "
        f"its uncompressed one; the own-choice row's baseline is the best peer run",
        f"    utt/s of every run: {every}"]
    return rows, notes


OTF_WORKERS = (0, 2)
PEERS = {"peritem": "naive librosa per-item",  # part -> name; "coqui" needs --peer-python
         "coqui": "Coqui TTS TTSDataset (load + trim in __getitem__, mel in its collate_fn)"}


def _onthefly_section(args: argparse.Namespace, data: Path) -> tuple[list[str], list[str]]:
    """Rows and footnotes of (e): the on-the-fly loader vs per-item loaders, same load."""
    print("measuring on-the-fly vs per-item loaders ...", file=sys.stderr)
    peers = [k for k in PEERS if k != "coqui" or args.peer_python]
    kinds = ["onthefly", *peers]

    def run_one(kind: str, w: int) -> dict:
        if kind == "coqui":
            return _run_peer(args, kind, w, data=data)
        return _run_part(kind, data=data, workers=w, seconds=args.seconds)

    runs, best, plan = _alternate([(k, w) for w in OTF_WORKERS for k in kinds], args.rounds,
                                  run_one, "e")
    rows: list[str] = []
    for w in OTF_WORKERS:
        o = best["onthefly", w]
        peer = max((best[k, w] for k in peers), key=lambda x: x["utt_per_s"])
        rows += [
            _row(f"(e) on-the-fly vs best per-item, utterances/s, {w} workers",
                 f"{o['utt_per_s']:.0f}", f"{peer['utt_per_s']:.0f}",
                 f"{o['utt_per_s'] / peer['utt_per_s']:.2f}x"),
            _row("    audio-s/s", f"{o['audio_s_per_s']:.0f}", f"{peer['audio_s_per_s']:.0f}",
                 f"{o['audio_s_per_s'] / peer['audio_s_per_s']:.2f}x"),
            _row("    CPU-ms per audio-s (lower is better)", f"{o['cpu_per_audio_s'] * 1e3:.2f}",
                 f"{peer['cpu_per_audio_s'] * 1e3:.2f}",
                 f"{o['cpu_per_audio_s'] / peer['cpu_per_audio_s']:.2f}x")]
    o_key = max(((k, w) for k, w in best if k == "onthefly"), key=lambda k: best[k]["utt_per_s"])
    p_key = max(((k, w) for k, w in best if k != "onthefly"), key=lambda k: best[k]["utt_per_s"])
    o, peer = best[o_key], best[p_key]
    ratio = o["utt_per_s"] / peer["utt_per_s"]
    o_cpu = min(best[k]["cpu_per_audio_s"] for k in best if k[0] == "onthefly")
    p_cpu = min(best[k]["cpu_per_audio_s"] for k in best if k[0] != "onthefly")
    rows += [
        _row("(e) overall: best on-the-fly vs best per-item, utt/s",
             f"{o['utt_per_s']:.0f} ({o_key[1]}w)", f"{peer['utt_per_s']:.0f} ({p_key[1]}w)",
             f"{ratio:.2f}x"),
        _row("    lowest CPU-ms per audio-s (lower is better)", f"{o_cpu * 1e3:.2f}",
             f"{p_cpu * 1e3:.2f}", f"{o_cpu / p_cpu:.2f}x"),
        _row("    target: on-the-fly >= 1.5x best per-item utt/s", "met" if ratio >= 1.5 else
             "NOT met", "", f"{ratio:.2f}x")]
    every = "; ".join(f"{'otf' if k == 'onthefly' else k} {w}w "
                      + "/".join(f"{run['utt_per_s']:.0f}" for run in v) for (k, w), v in runs.items())
    first = runs["onthefly", 0][0]
    notes = [
        f"(e) per-item peers: {'; '.join(PEERS[k] for k in peers)}; the naive one: "
        f"librosa.load + melspectrogram in __getitem__, pad per batch"
        + ("" if args.peer_python else "; Coqui's TTSDataset NOT measured: pass --peer-python "
           "(an environment with coqui-tts)")
        + (f"; peers run by {args.peer_python}" if args.peer_python else ""),
        f"    same {first['clips']} train clips and the same bucket-sampler batches, epoch by "
        f"epoch, for every loader (plan {plan}); workers persistent, prefetch 2 (on the "
        f"fly: one stream across epochs); 1 "
        f"BLAS/OpenMP/torch thread per process; one warm-up epoch, then whole epochs for "
        f">= {args.seconds:.0f} s (>= 2); best of {args.rounds} alternating runs by utt/s",
        f"    utt/s of every run: {every}",
        "    CPU = user+system over the timed epochs of the main process (getrusage, all "
        "threads) + each live worker (/proc/PID/stat utime+stime); audio-s = source clips' "
        "header durations of the utterances batched (the same for every loader)",
        f"    on-the-fly log-mels computed in {runs['onthefly', 0][0]['mels_in']} with 0 workers, "
        f"in {runs['onthefly', 2][0]['mels_in']} with 2 workers (clip by clip at each clip's length)",
        "    work differs: on-the-fly also trims silence and computes a reference log-mel crop "
        "(data.ref_frames) per utterance; the per-item peer only the clip's own mel"]
    return rows, notes


def main() -> None:
    from myxtts.system import available_cpus

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=None, help=f"dataset (default {common.DEFAULT_DATA})")
    p.add_argument("--parts", default=",".join(SECTIONS),
                   help=f"comma-separated sections to measure (default: all of {','.join(SECTIONS)})")
    p.add_argument("--workers", type=int, default=None, help="prepare workers (default: all cores)")
    p.add_argument("--seconds", type=float, default=3.0, help="minimum timed seconds per loader run")
    p.add_argument("--repeats", type=int, default=3, help="prepare runs of each kind (best is kept)")
    p.add_argument("--rounds", type=int, default=3,
                   help="(e) alternating runs of each loader and worker count (best is kept)")
    p.add_argument("--peer-python", type=Path, default=None,
                   help="python of a separate environment with coqui-tts and lhotse installed: "
                        "(e) and (f) then measure those peers in it")
    p.add_argument("--part", choices=sorted(PARTS), help=argparse.SUPPRESS)
    p.add_argument("--storage", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--store", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.part:
        print(json.dumps(PARTS[args.part](args)))
        return
    parts = set(args.parts.split(","))
    if not parts or parts - set(SECTIONS):
        raise SystemExit(f"--parts: choose from {','.join(SECTIONS)}, got {args.parts!r}")

    tmp = Path(tempfile.mkdtemp(prefix="myxtts-bench-"))
    args.tmp = tmp
    rows: list[str] = []
    notes: list[str] = []
    try:
        data = common.find_data(args.data, tmp)
        for wav in sorted(data.rglob("*.wav")):  # warm the page cache for everybody
            wav.read_bytes()
        if parts & {"prepare", "loaders", "padding", "precomputed"}:
            rows, notes = _store_section(args, parts, data, tmp)
        if "precomputed" in parts:
            more = _precomputed_section(args, tmp / "store")
            rows, notes = rows + more[0], notes + more[1]
        if "onthefly" in parts:
            more = _onthefly_section(args, data)
            rows, notes = rows + more[0], notes + more[1]
        audio_s = source_audio_s(data)[0]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("\n".join([f"data: {data} ({audio_s / 60:.1f} min of audio), {available_cpus()} CPU "
                     f"cores, load average {os.getloadavg()[0]:.1f}", "",
                     _row("metric", "ours", "baseline", "ratio"), "-" * 93, *rows, *notes]))


if __name__ == "__main__":
    main()
