"""Data pipeline benchmark: prepare throughput, loader throughput, padding, memory.

    python benchmarks/data_pipeline.py [--data DIR] [--workers N] [--seconds S]

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

Each measurement runs in its own subprocess so imports, page-cache warm-up and peak
memory of one do not leak into another.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "ljspeech-mini"
LJSPEECH_SIZE = 13100


def _peak_rss_mb() -> tuple[float, float]:
    """(this process, largest child) peak resident memory in MiB.

    Children still running (persistent loader workers) are read from /proc (VmHWM);
    ``RUSAGE_CHILDREN`` only knows children that have exited.
    """
    scale = 1024 if sys.platform.startswith("linux") else 1024 * 1024
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / scale
    for children in Path("/proc/self/task").glob("*/children"):
        for pid in children.read_text().split():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("VmHWM:"):
                    kids = max(kids, int(line.split()[1]) / 1024)
    return own, kids


def _source_audio_s(data: Path) -> tuple[float, list[str]]:
    from myxtts.audio.io import audio_info
    from myxtts.config import Config
    from myxtts.data.readers import read_dataset

    utts = read_dataset(data, Config()).all
    paths = [str(u.audio_path) for u in utts]
    return sum(audio_info(p).duration_s for p in paths), paths


# ---------------------------------------------------------------- parts (subprocesses)

def part_prepare(args: argparse.Namespace) -> dict:
    import torch  # noqa: F401  (imported before timing: the baseline's imports are not timed either)

    from myxtts.config import Config
    from myxtts.data.prepare import prepare_store

    audio_s, _ = _source_audio_s(args.data)

    def run() -> tuple[float, float]:
        """(wall seconds, CPU seconds of this process and its finished workers)."""
        shutil.rmtree(args.out, ignore_errors=True)
        cpu0 = time.process_time() + _children_cpu_s()
        start = time.perf_counter()
        prepare_store(args.data, args.out, Config(), workers=args.workers, progress=False,
                      echo=lambda s: None)
        return time.perf_counter() - start, time.process_time() + _children_cpu_s() - cpu0

    warm_s, _ = run()  # warm-up, like the baseline's: lazy imports and first-call set-up
    seconds, cpu_s = run()
    return {"seconds": seconds, "cpu_s": cpu_s, "audio_s": audio_s, "cold_s": warm_s}


def _children_cpu_s() -> float:
    """User + system CPU seconds of this process's exited (and reaped) children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _blas_threads() -> str:
    """BLAS/OpenMP threads numpy uses in this process (as threadpoolctl reports them)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:  # optional: only for the table's footnote
        return "?"
    return ",".join(f"{i['internal_api']}={i['num_threads']}" for i in threadpool_info()) or "none"


def part_baseline(args: argparse.Namespace) -> dict:
    import librosa
    import numpy as np

    from myxtts.config import Config

    a = Config().audio
    audio_s, paths = _source_audio_s(args.data)

    def featurize(path: str) -> np.ndarray:
        y, sr = librosa.load(path, sr=a.sample_rate)
        m = librosa.feature.melspectrogram(y=y, sr=sr, n_fft=a.n_fft, hop_length=a.hop_length,
                                           win_length=a.win_length, n_mels=a.n_mels, fmin=a.fmin,
                                           fmax=a.fmax, power=1.0)
        return np.log(np.maximum(m, a.log_floor)).T.astype(np.float16)

    start = time.perf_counter()
    featurize(paths[0])  # librosa's lazy imports and numba JIT happen here
    cold_s = time.perf_counter() - start
    cpu0 = time.process_time()  # every thread of this process (BLAS threads included)
    start = time.perf_counter()
    for p in paths:
        featurize(p)
    return {"seconds": time.perf_counter() - start, "cpu_s": time.process_time() - cpu0,
            "audio_s": audio_s, "cold_first_clip_s": cold_s, "threads": _blas_threads()}


def _drain(loader, seconds: float, frames_per_s: float) -> dict:
    """Iterate epochs for at least ``seconds`` (timed from the first batch)."""
    n_utts = n_frames = batches = 0
    start = None
    while True:
        for batch in loader:
            if start is None:  # worker start-up and the first batch are warm-up
                start = time.perf_counter()
                continue
            n_utts += int(batch["mel_lengths"].shape[0])
            n_frames += int(batch["mel_lengths"].sum())
            batches += 1
        if start is not None and time.perf_counter() - start >= seconds:
            break
    elapsed = time.perf_counter() - start
    own, kids = _peak_rss_mb()
    return {"utt_per_s": n_utts / elapsed, "audio_s_per_s": n_frames / frames_per_s / elapsed,
            "batches": batches, "rss_mb": own, "worker_rss_mb": kids}


def part_loader(args: argparse.Namespace) -> dict:
    from myxtts.config import Config
    from myxtts.data.loader import build_loader

    cfg = Config()
    loader, _ = build_loader(args.store, cfg, num_workers=args.workers)
    out = _drain(loader, args.seconds, cfg.audio.frames_per_second)
    out["workers"] = loader.num_workers
    return out


def part_naive(args: argparse.Namespace) -> dict:
    """The common hand-written loader: decode + librosa mel in __getitem__, pad per batch."""
    import librosa
    import numpy as np
    import torch
    from torch.nn.utils.rnn import pad_sequence
    from torch.utils.data import DataLoader, Dataset

    from myxtts.config import Config
    from myxtts.data.readers import read_dataset

    cfg = Config()
    a = cfg.audio
    utts = read_dataset(args.data, cfg).train

    class NaiveDataset(Dataset):
        def __len__(self) -> int:
            return len(utts)

        def __getitem__(self, i: int) -> dict:
            y, sr = librosa.load(str(utts[i].audio_path), sr=a.sample_rate)
            m = librosa.feature.melspectrogram(y=y, sr=sr, n_fft=a.n_fft, hop_length=a.hop_length,
                                               win_length=a.win_length, n_mels=a.n_mels,
                                               fmin=a.fmin, fmax=a.fmax, power=1.0)
            mel = torch.from_numpy(np.log(np.maximum(m, a.log_floor)).T.copy())  # [T, n_mels]
            tokens = torch.tensor([ord(c) % 256 for c in utts[i].text])
            return {"mel": mel, "tokens": tokens}

    def collate(items: list[dict]) -> dict:
        return {"mel": pad_sequence([it["mel"] for it in items], batch_first=True),
                "mel_lengths": torch.tensor([len(it["mel"]) for it in items]),
                "tokens": pad_sequence([it["tokens"] for it in items], batch_first=True)}

    librosa.feature.melspectrogram(y=np.zeros(4096, np.float32), sr=a.sample_rate)  # JIT warm-up
    loader = DataLoader(NaiveDataset(), batch_size=16, shuffle=True, num_workers=args.workers,
                        collate_fn=collate, persistent_workers=args.workers > 0)
    out = _drain(loader, args.seconds, a.frames_per_second)
    out["workers"] = args.workers
    return out


def part_padding(args: argparse.Namespace) -> dict:
    import numpy as np

    from myxtts.config import Config, load_config
    from myxtts.data.loader import build_sampler
    from myxtts.data.store import FeatureStore

    store = FeatureStore.open(args.store)
    rows = {}
    rng = np.random.default_rng(0)
    pick = rng.integers(0, len(store), LJSPEECH_SIZE)
    jitter = rng.integers(-8, 9, LJSPEECH_SIZE)  # lengths of a bigger corpus are not all equal
    big_mel = np.maximum(store.mel_lengths[pick] + jitter, 1)
    big_tok = store.token_lengths[pick]
    for name, cfg in (("default", Config()),
                      ("16 buckets", load_config(overrides=["data.num_buckets=16"]))):
        small = build_sampler(store.mel_lengths, store.token_lengths, cfg)
        big = build_sampler(big_mel, big_tok, cfg)
        rows[name] = {"small": [small.padding_efficiency(), len(small.shapes()), len(store)],
                      "big": [big.padding_efficiency(), len(big.shapes()), LJSPEECH_SIZE],
                      "num_buckets": cfg.data.num_buckets}
    return rows


PARTS = {"prepare": part_prepare, "baseline": part_baseline, "loader": part_loader,
         "naive": part_naive, "padding": part_padding}


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


def main() -> None:
    from myxtts.data.loader import default_num_workers
    from myxtts.system import available_cpus

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=None, help=f"dataset (default {DEFAULT_DATA})")
    p.add_argument("--workers", type=int, default=None, help="prepare workers (default: all cores)")
    p.add_argument("--seconds", type=float, default=3.0, help="minimum timed seconds per loader run")
    p.add_argument("--repeats", type=int, default=3, help="prepare runs of each kind (best is kept)")
    p.add_argument("--part", choices=sorted(PARTS), help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--store", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.part:
        print(json.dumps(PARTS[args.part](args)))
        return

    cores = available_cpus()
    workers = args.workers or cores
    tmp = Path(tempfile.mkdtemp(prefix="myxtts-bench-"))
    try:
        data = args.data or DEFAULT_DATA
        if not data.exists():
            if args.data:
                raise SystemExit(f"--data {data} does not exist")
            from myxtts.synthetic import make_demo_data

            print(f"{DEFAULT_DATA} not found: using a generated demo corpus", file=sys.stderr)
            data = make_demo_data(tmp / "demo", speakers=4, utterances=40)
        for wav in sorted(data.rglob("*.wav")):  # warm the page cache for everybody
            wav.read_bytes()
        store = tmp / "store"
        print("measuring prepare ...", file=sys.stderr)
        # Alternate the three and keep each one's best run: other jobs on the machine come
        # and go, and a single run of each would compare different load conditions.
        runs: dict[str, list[dict]] = {"ours": [], "base": [], "tuned": []}
        for _ in range(args.repeats):
            runs["ours"].append(_run_part("prepare", data=data, out=store, workers=workers))
            runs["base"].append(_run_part("baseline", default_threads=True, data=data))
            runs["tuned"].append(_run_part("baseline", data=data))
        ours, base, tuned = (min(runs[k], key=lambda r: r["seconds"]) for k in ("ours", "base", "tuned"))
        auto = default_num_workers()
        print("measuring loaders ...", file=sys.stderr)
        loaders = {w: _run_part("loader", store=store, workers=w, seconds=args.seconds)
                   for w in sorted({0, 1, 2, auto})}
        naive = _run_part("naive", data=data, workers=auto, seconds=args.seconds)
        pad = _run_part("padding", store=store)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    ours_rate = ours["audio_s"] / ours["seconds"]
    base_rate = base["audio_s"] / base["seconds"]
    tuned_rate = tuned["audio_s"] / tuned["seconds"]
    # Per CPU-second: what each process actually got to run, so other jobs competing for
    # the cores move it much less than the wall-clock rates (best run of each kind).
    ours_cpu, base_cpu, tuned_cpu = (max(r["audio_s"] / r["cpu_s"] for r in runs[k])
                                     for k in ("ours", "base", "tuned"))
    mine = loaders[auto]

    def row(metric: str, ours_v: str, base_v: str = "", ratio: str = "") -> str:
        return f"{metric:<52} {ours_v:>16} {base_v:>14} {ratio:>8}"

    lines = [
        f"data: {data} ({ours['audio_s'] / 60:.1f} min of audio), {cores} CPU cores, "
        f"load average {os.getloadavg()[0]:.1f}",
        "",
        row("metric", "ours", "baseline", "ratio"),
        "-" * 93,
        row(f"(a) prepare, audio-s/s (ours --workers {workers} vs naive)", f"{ours_rate:.0f}",
            f"{base_rate:.0f}", f"{ours_rate / base_rate:.2f}x"),
        row("(a) prepare, audio-s/s per core (vs naive)", f"{ours_rate / workers:.0f}",
            f"{base_rate:.0f}", f"{ours_rate / workers / base_rate:.2f}x"),
        row("    vs baseline tuned (1 BLAS thread), audio-s/s", f"{ours_rate:.0f}",
            f"{tuned_rate:.0f}", f"{ours_rate / tuned_rate:.2f}x"),
        row("    vs baseline tuned, audio-s/s per core", f"{ours_rate / workers:.0f}",
            f"{tuned_rate:.0f}", f"{ours_rate / workers / tuned_rate:.2f}x"),
        row("    audio-s per CPU-second (vs naive baseline)", f"{ours_cpu:.0f}", f"{base_cpu:.0f}",
            f"{ours_cpu / base_cpu:.2f}x"),
        row("    audio-s per CPU-second (vs tuned baseline)", f"{ours_cpu:.0f}", f"{tuned_cpu:.0f}",
            f"{ours_cpu / tuned_cpu:.2f}x"),
        row(f"(b) store loader, utterances/s ({auto} workers = auto)", f"{mine['utt_per_s']:.0f}",
            f"{naive['utt_per_s']:.0f}", f"{mine['utt_per_s'] / naive['utt_per_s']:.1f}x"),
        row("(b) store loader, audio-s/s", f"{mine['audio_s_per_s']:.0f}",
            f"{naive['audio_s_per_s']:.0f}", f"{mine['audio_s_per_s'] / naive['audio_s_per_s']:.1f}x"),
    ]
    for w, r in loaders.items():
        if w != auto:
            lines.append(row(f"    ours with {w} worker(s), utterances/s", f"{r['utt_per_s']:.0f}"))
    entries = list(pad.values())
    for entry, size in [(entries[0], "small"), (entries[0], "big"), (entries[1], "big")]:
        eff, shapes, n = entry[size]
        lines.append(row(f"(c) padding efficiency, {n} utts, num_buckets={entry['num_buckets']}",
                         f"{eff:.3f} / {shapes} shapes"))
    lines.append(row("(d) loader peak RSS MiB (main process)", f"{mine['rss_mb']:.0f}",
                     f"{naive['rss_mb']:.0f}"))
    for w, r in loaders.items():
        if w:
            lines.append(row(f"    ours with {w} worker(s): main / largest worker",
                             f"{r['rss_mb']:.0f} / {r['worker_rss_mb']:.0f}"))
    lines.append(f"(a) best of {args.repeats} alternating runs each, all warmed up; per core = "
                 f"ours / {workers} worker processes vs baseline / 1 process")
    lines.append(f"    baseline (naive, default threads): librosa.load + melspectrogram per clip, "
                 f"1 process, library thread defaults ({base['threads']}); its first clip took "
                 f"{base['cold_first_clip_s']:.1f} s")
    lines.append(f"    baseline tuned: the same loop with OMP/OPENBLAS/MKL_NUM_THREADS=1 "
                 f"({tuned['threads']}); CPU-seconds: user+system of all processes/threads "
                 f"(ours: prepare's main process and its workers)")
    lines.append(f"(b) baseline: per-item librosa DataLoader, batch 16, {auto} workers; every "
                 f"loader run >= {args.seconds:.0f} s, several epochs of the same clips")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
