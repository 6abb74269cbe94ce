"""The measured parts of ``data_pipeline.py`` (each runs in a subprocess of its own:
``data_pipeline.py --part NAME``) and what they measure with: CPU seconds and peak memory of
a process and its loader workers, timed epochs, and the per-item librosa loader peers use."""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from _peer_specs import part_coqui_spec, part_lhotse_spec
from _plans import digest, otf_config, raw_train, store_plan

LJSPEECH_SIZE = 13100


def source_audio_s(data: Path) -> tuple[float, list[str]]:
    from myxtts.audio.io import audio_info
    from myxtts.config import Config
    from myxtts.data.prepare.readers import read_dataset

    utts = read_dataset(data, Config()).all
    paths = [str(u.audio_path) for u in utts]
    return sum(audio_info(p).duration_s for p in paths), paths


# ---------------------------------------------------------------- parts (subprocesses)

def part_prepare(args: argparse.Namespace) -> dict:
    import torch  # noqa: F401  (imported before timing: the baseline's imports are not timed either)

    from myxtts.config import Config
    from myxtts.data.prepare.build import prepare_store

    audio_s, _ = source_audio_s(args.data)

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
    import librosa  # noqa: F401  (imported before timing: the first clip times librosa's JIT)
    import numpy as np

    from myxtts.config import Config

    a = Config().audio
    audio_s, paths = source_audio_s(args.data)

    def featurize(path: str) -> np.ndarray:
        return librosa_logmel(path, a).astype(np.float16)

    start = time.perf_counter()
    featurize(paths[0])  # librosa's lazy imports and numba JIT happen here
    cold_s = time.perf_counter() - start
    cpu0 = time.process_time()  # every thread of this process (BLAS threads included)
    start = time.perf_counter()
    for p in paths:
        featurize(p)
    return {"seconds": time.perf_counter() - start, "cpu_s": time.process_time() - cpu0,
            "audio_s": audio_s, "cold_first_clip_s": cold_s, "threads": _blas_threads()}


def part_loader(args: argparse.Namespace) -> dict:
    from myxtts.config import Config
    from myxtts.data.feed.loader import build_loader

    cfg = Config()
    loader, _ = build_loader(args.store, cfg, num_workers=args.workers)
    out = drain(loader, args.seconds, cfg.audio.frames_per_second)
    out["workers"] = loader.num_workers
    return out


def part_naive(args: argparse.Namespace) -> dict:
    """The common hand-written loader (``librosa_loader``): batch 16, shuffled."""
    from myxtts.config import Config
    from myxtts.data.prepare.readers import read_dataset

    cfg = Config()
    clips = [(u.audio_path, [ord(c) % 256 for c in u.text]) for u in read_dataset(args.data, cfg).train]
    loader = librosa_loader(clips, cfg.audio, batch_size=16, shuffle=True,
                            num_workers=args.workers, persistent_workers=args.workers > 0)
    out = drain(loader, args.seconds, cfg.audio.frames_per_second)
    out["workers"] = args.workers
    return out


def part_onthefly(args: argparse.Namespace) -> dict:
    """``build_onthefly_loader`` over the raw clips: decode + trim in workers, log-mels batched."""
    from myxtts.data.feed.onthefly import build_onthefly_loader

    cfg = otf_config()
    splits, raw, _, durations, plan = raw_train(args.data, cfg)
    loader, sampler = build_onthefly_loader(args.data, cfg, num_workers=args.workers,
                                            raw_splits=splits)
    if [sampler.batches(e) for e in range(3)] != plan:
        raise RuntimeError("the on-the-fly sampler's batches differ from the peers' plan")
    out = timed_epochs(loader, args.seconds, durations, cfg.audio.n_mels)
    in_workers = args.workers > 0 and getattr(loader, "workers_featurize", False)
    return {**out, "workers": args.workers, "plan": digest(plan), "clips": len(raw.paths),
            "mels_in": "the workers' collate" if in_workers else "the main process"}


def part_peritem(args: argparse.Namespace) -> dict:
    """The per-item peer under the same load: ``librosa_loader`` (librosa.load +
    melspectrogram in ``__getitem__``, padded per batch) over the on-the-fly loader's own
    batches (same clips, same utterances per batch, epoch by epoch), same worker count."""
    from myxtts.data.feed.loader import worker_init

    cfg = otf_config()
    _, raw, sampler, durations, plan = raw_train(args.data, cfg)
    extra = (dict(persistent_workers=True, prefetch_factor=2, worker_init_fn=worker_init)
             if args.workers else {})
    loader = librosa_loader(list(zip(raw.paths, raw.tokens)), cfg.audio,
                            batch_sampler=sampler, num_workers=args.workers, **extra)
    out = timed_epochs(loader, args.seconds, durations, cfg.audio.n_mels)
    return {**out, "workers": args.workers, "plan": digest(plan), "clips": len(raw.paths)}


def part_padding(args: argparse.Namespace) -> dict:
    import numpy as np

    from myxtts.config import Config, load_config
    from myxtts.data.feed.loader import build_sampler
    from myxtts.data.store import FeatureStore

    store = FeatureStore.open(args.store)
    rows = {}
    rng = np.random.default_rng(0)
    pick = rng.integers(0, len(store), LJSPEECH_SIZE)
    jitter = rng.integers(-8, 9, LJSPEECH_SIZE)  # lengths of a bigger corpus are not all equal
    big_mel = np.maximum(store.mel_lengths[pick] + jitter, 1)
    big_tok = store.token_lengths[pick]
    for name, cfg in (("default", Config()),
                      ("8 buckets", load_config(overrides=["data.num_buckets=8"]))):
        small = build_sampler(store.mel_lengths, store.token_lengths, cfg)
        big = build_sampler(big_mel, big_tok, cfg)
        rows[name] = {"small": [small.padding_efficiency(), len(small.shapes()), len(store)],
                      "big": [big.padding_efficiency(), len(big.shapes()), LJSPEECH_SIZE],
                      "num_buckets": cfg.data.num_buckets}
    return rows


def part_store(args: argparse.Namespace) -> dict:
    """``build_loader`` over the store, timed like the peers (``timed_epochs``) on the
    batches ``_plans.store_plan`` gives them."""
    from myxtts.config import Config
    from myxtts.data.feed.loader import build_loader

    cfg = Config()
    _, _, plan, frames = store_plan(args.store, cfg)
    workers = None if args.workers < 0 else args.workers  # -1: the loader's own choice
    loader, sampler = build_loader(args.store, cfg, num_workers=workers)
    if [sampler.batches(e) for e in range(3)] != plan:
        raise RuntimeError("the store sampler's batches differ from the peers' plan")
    out = timed_epochs(loader, args.seconds, frames / cfg.audio.frames_per_second,
                       cfg.audio.n_mels)
    return {**out, "workers": loader.num_workers, "plan": digest(plan)}


PARTS = {"prepare": part_prepare, "baseline": part_baseline, "loader": part_loader,
         "naive": part_naive, "padding": part_padding, "onthefly": part_onthefly,
         "peritem": part_peritem, "store": part_store, "coqui_spec": part_coqui_spec,
         "lhotse_spec": part_lhotse_spec}


# ---------------------------------------------------------------- measurement

def live_children() -> list[int]:
    """Pids of this process's live children (every thread's), e.g. persistent loader workers."""
    return [int(pid) for f in Path("/proc/self/task").glob("*/children") for pid in f.read_text().split()]


def peak_rss_mb() -> tuple[float, float]:
    """(this process, largest child) peak resident memory in MiB.

    Children still running (persistent loader workers) are read from /proc (VmHWM);
    ``RUSAGE_CHILDREN`` only knows children that have exited.
    """
    scale = 1024 if sys.platform.startswith("linux") else 1024 * 1024
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / scale
    for pid in live_children():
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                kids = max(kids, int(line.split()[1]) / 1024)
    return own, kids


def cpu_seconds() -> tuple[float, dict[int, float]]:
    """CPU seconds (user + system) of this process, all its threads, and of each live child.

    Self from ``getrusage(RUSAGE_SELF)``; children from ``/proc/<pid>/stat`` (utime + stime,
    clock ticks): ``RUSAGE_CHILDREN`` only counts children that have exited and been reaped,
    and persistent loader workers do neither while they are measured.
    """
    own = resource.getrusage(resource.RUSAGE_SELF)
    tick = os.sysconf("SC_CLK_TCK")
    kids: dict[int, float] = {}
    for pid in live_children():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kids[pid] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return own.ru_utime + own.ru_stime, kids


def drain(loader: Any, seconds: float, frames_per_s: float) -> dict:
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
    own, kids = peak_rss_mb()
    return {"utt_per_s": n_utts / elapsed, "audio_s_per_s": n_frames / frames_per_s / elapsed,
            "batches": batches, "rss_mb": own, "worker_rss_mb": kids}


def timed_epochs(loader: Any, seconds: float, durations: Any, n_mels: int) -> dict:
    """One warm-up epoch (worker start-up, librosa's JIT, first-call set-up), then whole
    epochs until ``seconds`` have passed (at least two): rates and CPU per audio second.
    ``durations``: source seconds per utterance index (batches carry ``indices``)."""
    import torch

    for i, batch in enumerate(loader):  # warm-up; the loader must really produce log-mels
        mel = batch["mel"]
        assert mel.ndim == 3 and mel.shape[-1] == n_mels and mel.numel() > 0, tuple(mel.shape)
        if i == 0 and not bool(torch.isfinite(mel).all()):
            raise RuntimeError("the loader produced non-finite mels")
    own0, kids0 = cpu_seconds()
    start = time.perf_counter()
    utts = batches = epochs = 0
    audio_s = 0.0
    while epochs < 2 or time.perf_counter() - start < seconds:
        for batch in loader:
            idx = batch["indices"].numpy()
            utts += len(idx)
            audio_s += float(durations[idx].sum())
            batches += 1
            assert batch["mel"].shape[-1] == n_mels
        epochs += 1
    elapsed = time.perf_counter() - start
    own1, kids1 = cpu_seconds()
    if set(kids1) != set(kids0):  # a worker came or went: its CPU time would be lost
        raise RuntimeError(f"loader workers changed while timed: {sorted(kids0)} -> {sorted(kids1)}")
    cpu_s = own1 - own0 + sum(kids1[p] - kids0[p] for p in kids1)
    return {"utt_per_s": utts / elapsed, "audio_s_per_s": audio_s / elapsed,
            "cpu_per_audio_s": cpu_s / audio_s, "cpu_s": cpu_s, "seconds": elapsed,
            "epochs": epochs, "batches": batches, "utts": utts, "workers_seen": len(kids1)}


def librosa_logmel(path: str, a: Any) -> Any:
    """``librosa.load`` + ``librosa.feature.melspectrogram`` of one clip: the log-mel
    [T, n_mels] (a transposed view) a hand-written pipeline computes. ``a``: an AudioConfig."""
    import librosa
    import numpy as np

    y, sr = librosa.load(path, sr=a.sample_rate)
    m = librosa.feature.melspectrogram(y=y, sr=sr, n_fft=a.n_fft, hop_length=a.hop_length,
                                       win_length=a.win_length, n_mels=a.n_mels, fmin=a.fmin,
                                       fmax=a.fmax, power=1.0)
    return np.log(np.maximum(m, a.log_floor)).T


def librosa_loader(clips: list[tuple[str, Any]], audio: Any, **loader_kw: Any) -> Any:
    """The common hand-written loader: ``librosa.load`` + ``librosa.feature.melspectrogram``
    in ``__getitem__`` (log-mel [T, n_mels]), zero-padded per batch. ``clips``: (wav path,
    token ids) per utterance; ``audio``: an AudioConfig; the rest goes to the DataLoader."""
    import librosa
    import numpy as np
    import torch
    from torch.nn.utils.rnn import pad_sequence
    from torch.utils.data import DataLoader, Dataset

    class LibrosaItems(Dataset):
        def __len__(self) -> int:
            return len(clips)

        def __getitem__(self, i: int) -> dict:
            return {"mel": torch.from_numpy(librosa_logmel(str(clips[i][0]), audio).copy()),
                    "tokens": torch.as_tensor(np.asarray(clips[i][1], np.int64)), "index": i}

    def collate(items: list[dict]) -> dict:
        return {"mel": pad_sequence([it["mel"] for it in items], batch_first=True),
                "mel_lengths": torch.tensor([len(it["mel"]) for it in items]),
                "tokens": pad_sequence([it["tokens"] for it in items], batch_first=True),
                "indices": torch.tensor([it["index"] for it in items])}

    librosa.feature.melspectrogram(y=np.zeros(4096, np.float32), sr=audio.sample_rate)  # JIT warm-up
    return DataLoader(LibrosaItems(), collate_fn=collate, **loader_kw)
