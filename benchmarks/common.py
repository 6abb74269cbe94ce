"""What the training benchmarks share: the data, the trainer's parts, staged batches, timed
windows and the table. ``input_ratio.py`` and ``train_step.py`` import it, and
``data_pipeline.py`` its loader-measurement helpers (at the end); run them as
``python benchmarks/NAME.py``: this folder is then on the import path.

A *window* is ``steps`` optimizer steps run exactly as the training loop runs them
(``StepTimer`` around each fetch, one host sync at the end, then the loop's log-step
read-back outside the timing). *Pre-staged* batches sit in device memory before timing:
one per bucket shape, replayed in whatever shape order a window asks for -- the step's
speed of light, since no input pipeline can beat data that costs nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "ljspeech-mini"
CPU_BATCH_FRAMES = {"tiny": 1500, "small": 1000, "base": 1000}  # ~0.15-1 s steps on 2 cores
LABEL = 56  # width of a table's first column


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options both training benchmarks take."""
    p.add_argument("--presets", help="comma-separated (default: tiny,small on CPU; tiny,small,base on CUDA)")
    p.add_argument("--data", type=Path, help="dataset to prepare (default: ../shared/data/ljspeech-mini)")
    p.add_argument("--store", type=Path, help="prepared store to use or create and keep")
    p.add_argument("--steps", type=int, help="optimizer steps per window (default 8 on CPU; on CUDA "
                   "30 in train_step.py, 40 in input_ratio.py)")
    p.add_argument("--rounds", type=int, help="windows per arm, interleaved (default 6 on CPU, "
                   "3 on CUDA)")
    p.add_argument("--batch-frames", type=int, help="data.batch_frames (default: CPU 1500 tiny, "
                   "1000 small/base; CUDA the config's)")
    p.add_argument("--threads", type=int, help="torch threads; 0 = torch's default (default: 1 on "
                   "CPU, 0 on CUDA)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="config override for every preset (repeatable)")


def say(msg: str) -> None:
    print(f"[{Path(sys.argv[0]).stem} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def spread(values: list[float]) -> str:
    """``median [min-max]`` of per-round ratios."""
    return f"{median(values):.3f} [{min(values):.2f}-{max(values):.2f}]" if values else "-"


def prepare(data: Path | None, store: Path | None, tmp: Path) -> tuple[Path, Path]:
    """A store of ``data`` (default: the LJSpeech sample beside the repository, else a
    generated demo corpus), kept at ``store`` or made in ``tmp``."""
    from myxtts.config import Config
    from myxtts.data.prepare import prepare_store

    if data is None:
        data = DEFAULT_DATA
        if not data.exists():
            from myxtts.synthetic import make_demo_data

            say(f"{DEFAULT_DATA} not found: using a generated demo corpus")
            data = make_demo_data(tmp / "demo", speakers=4, utterances=40)
    elif not data.exists():
        raise SystemExit(f"--data {data} does not exist; pass a dataset folder")
    store = store or tmp / "store"
    say(f"preparing {data} -> {store}")
    prepare_store(data, store, Config(), progress=False, echo=lambda s: None)
    return data, store


def header(data: Path, store: Path, extra: str) -> list[str]:
    import torch

    from myxtts.config import Config
    from myxtts.data.store import FeatureStore

    train = FeatureStore.open(store, "train", Config())
    minutes = float(train.mel_lengths.sum()) / Config().audio.frames_per_second / 60
    gpu = f", GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    return [f"data: {data} ({len(train)} train utterances, {minutes:.1f} min)",
            f"torch {torch.__version__}, {os.cpu_count()} CPUs, load average "
            f"{os.getloadavg()[0]:.1f}{gpu}", extra]


class Trainer:
    """The trainer's own parts for one preset: config, device, data (the real loader),
    model; ``step()`` builds a ``TrainStep`` on a copy of the initial weights."""

    def __init__(self, store: Path, preset: str, batch_frames: int | None, overrides: list[str],
                 threads: int) -> None:
        import torch

        from myxtts.config import load_config, resolve_device
        from myxtts.model.xtts import build_model
        from myxtts.train.checkpoint import TrainingProgress
        from myxtts.train.data import open_train_data
        from myxtts.train.distributed import DistInfo
        from myxtts.train.run import seed_everything

        if threads:
            torch.set_num_threads(threads)
        sets = ([f"data.batch_frames={batch_frames}"] if batch_frames else []) + list(overrides)
        self.cfg = cfg = load_config(preset=preset, overrides=sets)
        self.device = resolve_device(cfg.train.device, "train.device")
        self.cuda = self.device.type == "cuda"
        if self.cuda:  # as train() does
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        seed_everything(cfg.train.seed)
        self.record = TrainingProgress()
        self.data = open_train_data(cfg, store, self.device, DistInfo(), None)
        self.batch_sizes: list[int] | None = None  # per bucket, once fit_auto() measured them
        self.data.continue_from(None, self.record)
        self.initial = build_model(cfg, self.data.vocab_size, len(self.data.languages),
                                   self.data.mel_mean, self.data.mel_std).state_dict()
        self.params_m = sum(v.numel() for k, v in self.initial.items()
                            if not k.startswith(("mel_mean", "mel_std"))) / 1e6
        self.fps = cfg.audio.frames_per_second

    @property
    def auto(self) -> bool:
        """The trainer would measure the batch sizes (``data.batch_frames=auto`` on CUDA)."""
        return self.cuda and self.cfg.data.batch_frames == "auto"

    def fit_auto(self, step: Any, run_dir: Path) -> list[int]:
        """What ``train()`` does before step 1 with ``batch_frames=auto``: measure each
        bucket's batch size with ``step`` (or read ``run_dir``'s cache), rebuild the loader."""
        from myxtts.train.budget import auto_batch_sizes
        from myxtts.train.data import bucket_shapes
        from myxtts.train.distributed import DistInfo

        planned = bucket_shapes(self.data.sampler, self.cfg)
        self.batch_sizes = auto_batch_sizes(step, planned, [s.batch for s in planned], self.cfg,
                                            run_dir, self.data.vocab_size,
                                            len(self.data.languages), DistInfo(), echo=say)
        self.data.set_batch_sizes(self.batch_sizes)
        self.record.epoch = self.record.batches_consumed = 0
        self.data.continue_from(None, self.record)
        return self.batch_sizes

    def shapes(self) -> list[Any]:
        """The bucket shapes of the current plan (``BatchShape``), longest first."""
        from myxtts.train.data import bucket_shapes

        return sorted(set(bucket_shapes(self.data.sampler, self.cfg)), key=lambda s: -s.frames)

    def warm_up(self, step: Any, graphs: bool) -> Any:
        """The trainer's warm-up: every shape through ``step`` (compiling it), captured as
        CUDA graphs with ``graphs``; returns the ``WarmupReport``."""
        from myxtts.train.graphs import CudaCapture
        from myxtts.train.warmup import warm_up

        return warm_up(step, self.shapes(), self.data.vocab_size, len(self.data.languages),
                       capture=CudaCapture(self.device) if graphs else None, echo=say)

    def step(self, compiled: bool) -> Any:
        from myxtts.model.xtts import build_model
        from myxtts.train.optim import build_optimizer, build_scheduler
        from myxtts.train.step import TrainStep

        model = build_model(self.cfg, self.data.vocab_size, len(self.data.languages), None, None)
        model.load_state_dict(self.initial)
        model.to(self.device).train()
        opt, fused = build_optimizer(model, self.cfg.train)
        return TrainStep(model, opt, build_scheduler(opt, self.cfg.train), self.cfg, self.device,
                         fused, compile_model=compiled)

    def sync(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize(self.device)

    def stage(self, loader: Any = None, sampler: Any = None) -> dict[tuple, tuple[dict, int]]:
        """One device batch per bucket shape, from a loader of its own (the trainer's
        sampler and stream stay untouched): shape key -> (batch, real frames). ``loader`` /
        ``sampler``: another source of the same plan (default: the store's)."""
        from myxtts.data.batch import to_model_dtypes
        from myxtts.data.loader import build_loader
        from myxtts.observe.flops import batch_key

        if loader is None:
            loader, sampler = build_loader(self.data.loader.dataset.store, self.cfg,
                                           device=self.device, num_workers=0,
                                           batch_sizes=self.batch_sizes)
        wanted, staged = set(self.data.sampler.shapes()), {}
        for epoch in range(4):  # every bucket has batches in every epoch; guard anyway
            sampler.set_epoch(epoch)
            for batch in loader:
                key = batch_key(batch)
                if key in wanted and key not in staged:
                    staged[key] = (to_model_dtypes({k: v.to(self.device) for k, v in batch.items()}),
                                   int(batch["mel_lengths"].sum()))
            if len(staged) == len(wanted):
                break
        if set(staged) != wanted:
            raise RuntimeError(f"no batch of shape(s) {sorted(wanted - set(staged))} in 4 epochs")
        self.sync()
        return staged

    def upcoming(self, n: int) -> list[tuple[tuple, int]]:
        """(shape key, real frames) of the next ``n`` batches the trainer's stream yields,
        from the sampler's deterministic plan and the stream's position in ``record``."""
        s, epoch, pos = self.data.sampler, self.record.epoch, self.record.batches_consumed
        out: list[tuple[tuple, int]] = []
        while len(out) < n:
            plan = [((len(b), s.text_caps[s.bucket_of[b[0]]], s.boundaries[s.bucket_of[b[0]]]),
                     int(s.mel_lengths[b].sum())) for b in s.batches(epoch)]
            out += plan[pos:pos + n - len(out)]
            epoch, pos = epoch + 1, 0
        return out

    def window(self, step: Any, fetch: Callable[[], tuple[dict, int]], n_steps: int,
               flops: Any = None, gpu: Any = None) -> dict[str, float]:
        """``n_steps`` optimizer steps as the loop runs them; one sync at the end."""
        from myxtts.observe.flops import achieved_tflops, batch_key
        from myxtts.observe.meters import StepTimer

        self.sync()  # the previous window's queued work is not this window's
        keys: list[tuple] = []
        if gpu is not None:
            gpu.start()
        timer = StepTimer(self.device)
        for _ in range(n_steps):
            micro, frames = [], 0
            for _ in range(self.cfg.train.grad_accum_steps):
                timer.wait_begin()
                batch, n_frames = fetch()
                timer.wait_end()
                micro.append(batch)
                frames += n_frames
            step(micro)
            timer.step_end(sum(int(b["mel_lengths"].shape[0]) for b in micro), frames / self.fps)
            keys += [batch_key(b) for b in micro]
        iv = timer.collect()
        util = gpu.stop() if gpu is not None else None
        step.read()  # the loop's log-step read-back, outside the timing
        out = {"steps_per_s": iv.steps_per_s, "utt_per_s": iv.utterances_per_s,
               "audio_s_per_s": iv.audio_s_per_s, "frames_per_s": iv.audio_s_per_s * self.fps,
               "wait_share": iv.data_wait_share, "seconds": iv.seconds}
        if flops is not None:
            out["tflops"] = achieved_tflops(flops.total(keys), iv.seconds)
        if util is not None:
            out["gpu_util"] = util
        return out


def loader_ratio(t: Trainer, step: Any, staged: dict[tuple, tuple[dict, int]], steps: int,
                 rounds: int, warmup: int, name: str) -> dict[str, Any]:
    """The trainer's real input path (``BatchStream``: loader -> side-stream prefetch) against
    the same ``step`` fed pre-staged batches in the same shape order, in interleaved windows
    (A/B, B/A, ...): per-round ratios of steps/s, medians per arm, shape-order mismatches."""
    from myxtts.observe.flops import batch_key
    from myxtts.train.loop import BatchStream

    stream = iter(BatchStream(t.cfg, t.data, t.device, t.record))
    accum = t.cfg.train.grad_accum_steps
    mismatches = 0

    def loader_fetch(expected: list[tuple[tuple, int]]) -> Callable[[], tuple[dict, int]]:
        it = iter(expected)

        def fetch() -> tuple[dict, int]:
            nonlocal mismatches
            batch, frames = next(stream)
            if (batch_key(batch), frames) != next(it):
                mismatches += 1
            return batch, frames

        return fetch

    t.window(step, loader_fetch(t.upcoming(warmup * accum)), warmup)
    arms: dict[str, list[dict]] = {"loader": [], "pre-staged": []}
    for r in range(rounds):
        plan = t.upcoming(steps * accum)
        for arm in (["loader", "pre-staged"] if r % 2 == 0 else ["pre-staged", "loader"]):
            fetch = loader_fetch(plan) if arm == "loader" else staged_fetch(staged, [k for k, _ in plan])
            arms[arm].append(t.window(step, fetch, steps))
        say(f"{name}: round {r + 1}/{rounds}: " + ", ".join(
            f"{a} {arms[a][-1]['steps_per_s']:.2f} steps/s" for a in arms))
    out: dict[str, Any] = {"ratios": [a["steps_per_s"] / b["steps_per_s"]
                                      for a, b in zip(arms["loader"], arms["pre-staged"])],
                           "mismatches": mismatches}
    for arm, windows in arms.items():
        out[arm] = {k: median([w[k] for w in windows]) for k in windows[0]}
    return out


def staged_fetch(staged: dict[tuple, tuple[dict, int]], keys: list[tuple]) -> Callable:
    it: Iterator[tuple] = iter(keys)

    def fetch() -> tuple[dict, int]:
        return staged[next(it)]

    return fetch


def table(names: list[str], rows: list[tuple[str, list[str]]], head: list[str]) -> str:
    width = max(22, *(len(n) for n in names))
    line = lambda label, cells: f"{label:<{LABEL}}" + "".join(f"{c:>{width}}" for c in cells)  # noqa: E731
    out = head + ["", line("preset", names), "-" * (LABEL + width * len(names))]
    return "\n".join(out + [line(label, cells) for label, cells in rows])


# ---------------------------------------------------------------- loader measurement
# (data_pipeline.py: CPU and memory accounting of a process and its loader workers)

def live_children() -> list[int]:
    """Pids of this process's live children (every thread's), e.g. persistent loader workers."""
    return [int(pid) for f in Path("/proc/self/task").glob("*/children") for pid in f.read_text().split()]


def peak_rss_mb() -> tuple[float, float]:
    """(this process, largest child) peak resident memory in MiB.

    Children still running (persistent loader workers) are read from /proc (VmHWM);
    ``RUSAGE_CHILDREN`` only knows children that have exited.
    """
    import resource

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
    import resource

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
            a = audio
            y, sr = librosa.load(str(clips[i][0]), sr=a.sample_rate)
            m = librosa.feature.melspectrogram(y=y, sr=sr, n_fft=a.n_fft, hop_length=a.hop_length,
                                               win_length=a.win_length, n_mels=a.n_mels,
                                               fmin=a.fmin, fmax=a.fmax, power=1.0)
            return {"mel": torch.from_numpy(np.log(np.maximum(m, a.log_floor)).T.copy()),
                    "tokens": torch.as_tensor(np.asarray(clips[i][1], np.int64)), "index": i}

    def collate(items: list[dict]) -> dict:
        return {"mel": pad_sequence([it["mel"] for it in items], batch_first=True),
                "mel_lengths": torch.tensor([len(it["mel"]) for it in items]),
                "tokens": pad_sequence([it["tokens"] for it in items], batch_first=True),
                "indices": torch.tensor([it["index"] for it in items])}

    librosa.feature.melspectrogram(y=np.zeros(4096, np.float32), sr=audio.sample_rate)  # JIT warm-up
    return DataLoader(LibrosaItems(), collate_fn=collate, **loader_kw)
