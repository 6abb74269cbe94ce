"""Training-step benchmark: does the device wait for data? ONE table, measured in one run.

    python benchmarks/train_step.py [--presets tiny,small] [--steps N] [--rounds R]
        [--data DIR | --store DIR] [--skip-compile | --compile-presets LIST]
        [--compile-shapes K] [--batch-frames N] [--threads N] [--flops]
        [--peak-tflops 989] [--set section.key=value ...]

Speed of light
--------------
The *speed of light* of a training step is the throughput the step reaches when data
costs nothing: the batch already sits in device memory when the step asks for it. No
input pipeline can beat it -- same model, same shapes, same kernels, same optimizer -- so
it is the ceiling for the real loader. Here it is measured with the SAME ``TrainStep``
fed pre-staged device batches: one per bucket shape, collected before timing and replayed
in exactly the shape order the loader delivers in the paired window (the sampler's plan
is deterministic, so that order is known ahead, and the table counts any mismatch).

Why the ratio loader / pre-staged tells whether the device waits: ``1 - ratio`` is the
share of the ceiling lost to the input pipeline, whatever the mechanism. The data-wait
meter (``StepTimer``, also reported) only sees the time spent inside ``next(loader)``
(on CUDA: the part of it during which the GPU queue ran dry). Costs that hide elsewhere
-- a host sync that drains the launch queue, a host->device copy serialised on the compute
stream, pinned-memory allocation, loader workers competing with the training thread for
cores, fresh (cache-cold) batch memory -- escape the meter but not the ratio. On a GPU
an asynchronous step with enough queued work hides the loader completely: ratio ~1.00
(target >= 0.99) means the GPU never waits. On a CPU the "device" is the same cores
that load, so every millisecond of loading is a millisecond less of compute; the ratio
then measures the loader's CPU cost per step (target >= 0.97).

What is measured, per preset (each in its own subprocess, so compile caches, counters
and memory of one preset do not leak into the next):

* loader: the trainer's own path -- prepared store -> ``open_train_data`` (``build_loader``)
  -> the training loop's batch stream (``myxtts.train.loop.BatchStream``: ``DevicePrefetcher``
  with the real-frame count) -> ``TrainStep`` -- timed with the loop's ``StepTimer``;
  the host syncs only at the end of each measured window (the loop does so at log steps).
* pre-staged: as above with the pre-staged batches (the speed of light).
  Windows are interleaved A/B, B/A, A/B, ... (the machine may be shared: load comes and
  goes) and the table reports medians over rounds; ratios are per round (paired windows
  measured seconds apart), then the median, with the min-max range.
* eager vs compiled (``torch.compile`` as ``TrainStep`` does it: one static graph per
  bucket shape): step time on the same pre-staged batches, the compile warm-up time
  (cold: a fresh inductor cache unless ``--inductor-cache``), graphs compiled during
  warm-up and any compiled later (recompiles; should be 0).
* graphs over an epoch: TorchDynamo captures the step's forward+loss function (the part
  ``TrainStep`` compiles; backward is derived from it, the optimizer step is eager) over
  one whole training epoch and one validation pass (the trainer's ``validation_loss``),
  with the ``eager`` backend: the same graphs and guards as inductor, without code
  generation. Bound: train bucket shapes (train mode) + validation shapes (eval mode).
* on CUDA also: bf16 autocast (``train.precision=auto``), GPU utilisation sampled with
  NVML during the windows (when ``pynvml`` / ``nvidia-ml-py`` is importable), achieved
  model FLOP/s (``FlopCounterMode`` on one eager step per bucket shape, attention counted
  through the math SDPA kernel so every device counts the same) and MFU against
  ``--peak-tflops`` (default 989: H100/H200 dense bf16), peak memory.

Which compile mode is "the trainer's": ``train.compile=auto`` compiles on CUDA only. The
loader/pre-staged pair is always measured in the trainer's mode; the other mode gets the
same pair when it runs over all bucket shapes, else only the eager-vs-compiled step times
on the ``--compile-shapes`` most frequent shapes.

CPU defaults (2-core machine, default run ~6 min): presets tiny and small with small
batches (``data.batch_frames`` 1500 / 1000: a step of ~0.15 / ~1 s); compile measured
for tiny only and on one bucket shape (the cold inductor compile of one shape takes
~1.5-2.5 minutes there; all shapes: ``--compile-shapes 0``; small too:
``--compile-presets tiny,small``; none: ``--skip-compile``). One torch intra-op thread
(``--threads 1``; ``--threads 0`` = torch's default, as the trainer runs): on a shared
2-core machine torch's 2 threads make a step swing by 10x whenever another process takes
a core (measured: tiny 0.13 s/step with 1 thread vs 0.45-4.2 s with 2 while another job
ran), which no number of rounds averages out; the loader runs on the training thread
either way (0 workers at <= 2 CPUs), so the ratio means the same.
GPU defaults: presets tiny, small, base at the config's ``data.batch_frames`` (12000),
torch's threads, compile on every bucket shape (expect a few minutes of compile per
preset; ``--presets base`` for one).

Data: ``../shared/data/ljspeech-mini`` next to the repository (``--data`` to override),
prepared into a temporary store (``--store DIR`` keeps and reuses it); a generated demo
corpus when the shared data is absent. An epoch of that 100-clip sample is short (tens of
batches on CPU, 6 on a GPU at 12000 frames), so epoch boundaries (a fresh loader pass,
the prefetch queue refilling) are ~100x more frequent than on LJSpeech: a pessimistic
setting for the loader.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "ljspeech-mini"
CPU_BATCH_FRAMES = {"tiny": 1500, "small": 1000, "base": 1000}  # ~0.15-1 s steps on 2 cores
LOADER, STAGED = "loader", "pre-staged"
EAGER, COMPILED = "eager", "compiled"
LABEL = 60  # width of the table's first column


def _say(msg: str) -> None:
    print(f"[train_step {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# ---------------------------------------------------------------- helpers (in the part process)

def _batch_key(batch: dict) -> tuple[int, int, int]:
    """(B, L_text, T_mel): the padded shape, read from tensor metadata (no device sync)."""
    return (int(batch["tokens"].shape[0]), int(batch["tokens"].shape[1]), int(batch["mel"].shape[1]))


def _plan_keys(sampler: Any, epoch: int) -> list[tuple[tuple[int, int, int], int]]:
    """(shape key, real mel frames) of every batch of ``epoch``, in the loader's order."""
    out = []
    for b in sampler.batches(epoch):
        k = int(sampler.bucket_of[b[0]])
        key = (len(b), sampler.text_caps[k], sampler.boundaries[k])
        out.append((key, int(sampler.mel_lengths[b].sum())))
    return out


def _upcoming(sampler: Any, epoch: int, consumed: int, n: int) -> list[tuple[tuple, int]]:
    """The next ``n`` batches the trainer stream will yield, given its (epoch, consumed)."""
    out: list[tuple[tuple, int]] = []
    while len(out) < n:
        plan = _plan_keys(sampler, epoch)
        if consumed >= len(plan):
            epoch, consumed = epoch + 1, 0
            continue
        take = plan[consumed:consumed + n - len(out)]
        out += take
        consumed += len(take)
    return out


@contextlib.contextmanager
def _compile_backend(backend: str):
    """Make ``TrainStep``'s own ``torch.compile(...)`` call use ``backend`` (its limits and
    options stay exactly as the trainer sets them)."""
    import torch

    real = torch.compile
    torch.compile = functools.partial(real, backend=backend)
    try:
        yield
    finally:
        torch.compile = real


def _dynamo_counts() -> tuple[int, int]:
    """(unique graphs captured, graph breaks) so far in this process."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"]), int(sum(counters["graph_break"].values()))


class GpuUtilSampler:
    """NVML GPU utilisation (% of time a kernel was running) sampled by a thread."""

    def __init__(self, device: Any, period_s: float = 0.05) -> None:
        self.period_s, self.handle, self.samples = period_s, None, []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            import pynvml
            import torch

            pynvml.nvmlInit()
            self.nvml = pynvml
            props = torch.cuda.get_device_properties(device)
            try:  # CUDA_VISIBLE_DEVICES may renumber: match by UUID when torch reports it
                self.handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{props.uuid}")
            except Exception:
                self.handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        except Exception:  # no pynvml / no NVML: the column is skipped
            self.handle = None

    @property
    def available(self) -> bool:
        return self.handle is not None

    def _run(self) -> None:
        while True:  # sample first: even a window shorter than one period gets a value
            self.samples.append(float(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu))
            if self._stop.wait(self.period_s):
                return

    def start(self) -> None:
        if self.available:
            self.samples, self._stop = [], threading.Event()
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()

    def stop(self) -> float | None:
        if not self.available or self._thread is None:
            return None
        self._stop.set()
        self._thread.join()
        return sum(self.samples) / len(self.samples) if self.samples else None


# ---------------------------------------------------------------- the measurement part

class Bench:
    """Everything one preset needs: the trainer's data, models, steps, staged batches."""

    def __init__(self, job: dict) -> None:
        import torch

        from myxtts.config import load_config
        from myxtts.model.xtts import build_model
        from myxtts.train.data import open_train_data
        from myxtts.train.distributed import DistInfo
        from myxtts.train.loop import resolve_device, seed_everything
        from myxtts.train.step import resolve_compile

        self.job, self.t0 = job, time.perf_counter()
        if job["threads"]:
            torch.set_num_threads(job["threads"])
        overrides = [f"data.batch_frames={job['batch_frames']}"] + list(job["set"])
        self.cfg = cfg = load_config(preset=job["preset"], overrides=overrides)
        self.device = device = resolve_device(cfg.train.device)
        self.cuda = device.type == "cuda"
        if self.cuda:  # as train() does
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        seed_everything(cfg.train.seed)
        self.data = open_train_data(cfg, job["store"], device, DistInfo(), None)
        self.model = build_model(cfg, self.data.vocab_size, len(self.data.languages),
                                 self.data.mel_mean, self.data.mel_std).to(device)
        self.spare = copy.deepcopy(self.model)  # same initial weights, for the other mode
        self.fps = cfg.audio.frames_per_second
        self.accum = cfg.train.grad_accum_steps
        self.trainer_compiles = resolve_compile(cfg.train.compile, device)
        self.mismatches = 0
        self.flops: dict[tuple, float] = {}

    def say(self, msg: str) -> None:
        _say(f"{self.job['preset']}: {msg} (+{time.perf_counter() - self.t0:.0f} s)")

    def sync(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize(self.device)

    def make_step(self, model: Any, compiled: bool) -> Any:
        from myxtts.train.optim import build_optimizer, build_scheduler
        from myxtts.train.step import TrainStep

        opt, fused = build_optimizer(model, self.cfg.train)
        model.train()
        return TrainStep(model, opt, build_scheduler(opt, self.cfg.train), self.cfg, self.device,
                         fused, compile_model=compiled)

    # ------------------------------------------------------------ staging

    def stage(self) -> None:
        """One device batch per bucket shape, from a separate loader (the trainer's sampler
        and stream stay untouched)."""
        from myxtts.data.loader import build_loader

        loader, sampler = build_loader(self.job["store"], self.cfg, device=self.device, num_workers=0)
        self.aux_loader, self.aux_sampler = loader, sampler
        wanted = set(self.data.sampler.shapes())
        self.staged: dict[tuple, tuple[dict, int]] = {}
        for epoch in range(4):  # every bucket has batches in every epoch; guard anyway
            sampler.set_epoch(epoch)
            for batch in loader:
                key = _batch_key(batch)
                if key not in self.staged:
                    moved = {k: v.to(self.device) for k, v in batch.items()}
                    self.staged[key] = (moved, int(batch["mel_lengths"].sum()))
                if len(self.staged) == len(wanted):
                    break
            if len(self.staged) == len(wanted):
                break
        missing = wanted - set(self.staged)
        if missing:
            raise RuntimeError(f"no batch of shape(s) {sorted(missing)} in 4 epochs of the loader")
        self.sync()
        counts = Counter(k for k, _ in _plan_keys(self.data.sampler, 0))
        self.by_frequency = [k for k, _ in counts.most_common()]

    # ------------------------------------------------------------ graphs over an epoch

    def count_graphs(self) -> dict:
        """Dynamo capture (eager backend) over one train epoch (forward+loss, the compiled
        part) and one validation pass; then reset dynamo for the real compiles."""
        import torch

        from myxtts.data.prefetch import DevicePrefetcher
        from myxtts.train.validate import validation_loss

        start = time.perf_counter()
        model = copy.deepcopy(self.spare)
        with _compile_backend("eager"):
            step = self.make_step(model, compiled=True)
        g0, b0 = _dynamo_counts()
        self.aux_sampler.set_epoch(0)  # the same epoch-0 batches the trainer's loader yields
        batches = 0
        for batch in DevicePrefetcher(self.aux_loader, self.device, self.cfg.data.prefetch_batches):
            step.loss(batch)  # grad enabled, train mode: exactly the training graphs
            batches += 1
        g1, _ = _dynamo_counts()
        validation_loss(model, step, self.data, self.device)
        g2, b2 = _dynamo_counts()
        ok = step.compiled
        del step, model
        torch._dynamo.reset()
        val_shapes = len(self.data.val_sampler.shapes()) if self.data.val_sampler else 0
        return {"train": g1 - g0, "eval": g2 - g1, "breaks": b2 - b0, "ok": ok,
                "bound_train": len(self.data.sampler.shapes()), "bound_eval": val_shapes,
                "batches": batches, "seconds": time.perf_counter() - start}

    # ------------------------------------------------------------ FLOPs

    def count_flops(self, eager_step: Any) -> None:
        """Model FLOPs of one forward+backward per staged shape (eager, math attention)."""
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.utils.flop_counter import FlopCounterMode

        for key, (batch, _) in self.staged.items():
            with sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as counter:
                eager_step.loss(batch)["loss"].backward()
            eager_step.model.zero_grad(set_to_none=True)
            self.flops[key] = float(counter.get_total_flops())

    # ------------------------------------------------------------ windows

    def window(self, step: Any, fetch: Any, gpu: GpuUtilSampler | None) -> dict:
        """``steps`` optimizer steps exactly as the training loop runs them; one sync at the end."""
        from myxtts.observe.meters import StepTimer

        self.sync()  # the previous window's queued work is not this window's
        keys: list[tuple] = []
        if gpu is not None:
            gpu.start()
        timer = StepTimer(self.device)
        for _ in range(self.job["steps"]):
            micro, frames = [], 0
            for _ in range(self.accum):
                timer.wait_begin()
                batch, n_frames = fetch()
                timer.wait_end()
                micro.append(batch)
                frames += n_frames
            step(micro)
            timer.step_end(sum(int(b["mel_lengths"].shape[0]) for b in micro), frames / self.fps)
            keys += [_batch_key(b) for b in micro]
        iv = timer.collect()
        util = gpu.stop() if gpu is not None else None
        step.read()  # the loop's log-step read-back (accumulators), outside the timing
        out = {"steps_per_s": iv.steps_per_s, "utt_per_s": iv.utterances_per_s,
               "audio_s_per_s": iv.audio_s_per_s, "wait_share": iv.data_wait_share,
               "seconds": iv.seconds}
        if self.flops:
            out["tflops"] = sum(self.flops[k] for k in keys) / iv.seconds / 1e12
        if util is not None:
            out["gpu_util"] = util
        return out

    def loader_fetch(self, stream: Any, expected: list[tuple[tuple, int]]) -> Any:
        it = iter(expected)

        def fetch() -> tuple[dict, int]:
            batch, frames = next(stream)
            key, plan_frames = next(it)
            if _batch_key(batch) != key or frames != plan_frames:
                self.mismatches += 1
            return batch, frames

        return fetch

    def staged_fetch(self, sequence: list[tuple[tuple, int]]) -> Any:
        it = iter(sequence)

        def fetch() -> tuple[dict, int]:
            key, frames = next(it)
            return self.staged[key][0], frames

        return fetch

    def rounds(self, arms: list[dict], stream: Any, ctx: Any, subset: list | None,
               gpu: GpuUtilSampler | None) -> None:
        """Interleaved windows: arm order alternates forward/backward every round. Loader
        arms take consecutive chunks of the stream; a pre-staged arm replays the chunk of
        the loader arm of its mode (or a fixed cycle over ``subset`` shapes)."""
        n = self.job["steps"] * self.accum
        for r in range(self.job["rounds"]):
            order = arms if r % 2 == 0 else arms[::-1]
            loaders = [a for a in order if a["source"] == LOADER]
            ahead = _upcoming(self.data.sampler, ctx.epoch, ctx.consumed, n * len(loaders))
            chunks = {a["name"]: ahead[i * n:(i + 1) * n] for i, a in enumerate(loaders)}
            by_mode = {a["mode"]: chunks[a["name"]] for a in loaders}
            for arm in order:
                if arm["source"] == LOADER:
                    fetch = self.loader_fetch(stream, chunks[arm["name"]])
                elif subset is not None:
                    seq = [(k, self.staged[k][1]) for k in subset]
                    fetch = self.staged_fetch([seq[i % len(seq)] for i in range(n)])
                else:
                    fetch = self.staged_fetch(by_mode.get(arm["mode"], next(iter(chunks.values()))))
                arm["windows"].append(self.window(arm["step"], fetch, gpu))
            self.say(f"round {r + 1}/{self.job['rounds']}: " + ", ".join(
                f"{a['name']} {a['windows'][-1]['steps_per_s']:.2f} steps/s" for a in arms))

    def warm(self, step: Any, keys: list[tuple]) -> float:
        """One step per shape (compiles each on a compiled step); returns the seconds."""
        start = time.perf_counter()
        for key in keys:
            step([self.staged[key][0]])
        self.sync()
        return time.perf_counter() - start


def part_measure(job: dict) -> dict:
    import torch

    from myxtts.train.loop import BatchStream

    b = Bench(job)
    cfg, data = b.cfg, b.data
    b.say(f"{sum(p.numel() for p in b.model.parameters()) / 1e6:.1f} M parameters on {b.device}")
    b.stage()
    all_keys = sorted(b.staged)
    may_compile = job["compile"]
    main_mode = COMPILED if b.trainer_compiles and may_compile else EAGER
    k = job["compile_shapes"]
    full_other = main_mode == COMPILED or k <= 0 or k >= len(all_keys)
    other_mode = None
    if main_mode == COMPILED:
        other_mode = EAGER
    elif may_compile:
        other_mode = COMPILED
    result: dict[str, Any] = {"preset": job["preset"], "device": str(b.device),
                              "threads": torch.get_num_threads(), "main_mode": main_mode,
                              "trainer_compiles": b.trainer_compiles,
                              "compile_setting": cfg.train.compile,
                              "params_m": sum(p.numel() for p in b.model.parameters()) / 1e6,
                              "batch_frames": cfg.data.batch_frames, "grad_accum": b.accum,
                              "shapes": len(all_keys), "batches_per_epoch": len(data.sampler),
                              "padding": data.sampler.padding_efficiency(),
                              "workers": data.loader.num_workers,
                              "prefetch": cfg.data.prefetch_batches}

    if may_compile:
        b.say("counting graphs over one epoch + validation (dynamo capture, eager backend)")
        result["graphs"] = b.count_graphs()

    steps = {main_mode: b.make_step(b.model, main_mode == COMPILED)}
    result["precision"] = str(steps[main_mode].dtype).replace("torch.", "")
    if other_mode is not None:
        steps[other_mode] = b.make_step(b.spare, other_mode == COMPILED)
    compile_keys = all_keys if full_other else b.by_frequency[:k]
    warm: dict[str, Any] = {}
    g_before, _ = _dynamo_counts()
    for mode, step in steps.items():
        keys = compile_keys if mode == COMPILED else all_keys
        b.say(f"warm-up {mode} on {len(keys)} shape(s)")
        warm[mode] = b.warm(step, keys)
        if mode == COMPILED:
            b.warm(step, keys)  # a second call per shape: anything still lazy happens now
    g_after, _ = _dynamo_counts()
    if COMPILED in steps:
        result["compile"] = {"warmup_s": warm[COMPILED], "shapes": len(compile_keys),
                             "graphs_warmup": g_after - g_before,
                             "ok": steps[COMPILED].compiled}
    eager_step = steps[EAGER] if EAGER in steps else None
    if eager_step is not None and (b.cuda or job["flops"]):
        b.say("counting model FLOPs per shape")
        b.count_flops(eager_step)
        plan = _plan_keys(data.sampler, 0)
        per_batch = sum(b.flops[key] for key, _ in plan) / len(plan)
        result["gflop_per_step"] = per_batch * b.accum / 1e9
    if b.cuda:
        torch.cuda.reset_peak_memory_stats(b.device)

    ctx = BatchStream(cfg, data, b.device)
    stream = iter(ctx)
    gpu = GpuUtilSampler(b.device) if b.cuda else None
    gpu = gpu if gpu is not None and gpu.available else None
    # Loader warm-up: first batches of the stream (worker start, page cache, pinned pool).
    for mode in ([main_mode, other_mode] if full_other and other_mode else [main_mode]):
        for _ in range(job["warmup"]):
            batch, _ = next(stream)
            steps[mode]([batch])
    b.sync()

    arms = [{"name": f"{main_mode}/{LOADER}", "mode": main_mode, "source": LOADER},
            {"name": f"{main_mode}/{STAGED}", "mode": main_mode, "source": STAGED}]
    if other_mode is not None and full_other:
        arms += [{"name": f"{other_mode}/{LOADER}", "mode": other_mode, "source": LOADER},
                 {"name": f"{other_mode}/{STAGED}", "mode": other_mode, "source": STAGED}]
    for arm in arms:
        arm.update(step=steps[arm["mode"]], windows=[])
    b.say("measuring " + ", ".join(a["name"] for a in arms))
    b.rounds(arms, stream, ctx, None, gpu)
    sub_arms: list[dict] = []
    if other_mode is not None and not full_other:
        sub_arms = [{"name": f"{m}/{STAGED} subset", "mode": m, "source": STAGED,
                     "step": steps[m], "windows": []} for m in (EAGER, COMPILED)]
        b.say(f"measuring eager vs compiled on {len(compile_keys)} shape(s) {compile_keys}")
        b.rounds(sub_arms, stream, ctx, compile_keys, None)
    g_end, _ = _dynamo_counts()
    if "compile" in result:
        result["compile"]["graphs_later"] = g_end - g_after
        result["compile"]["ok"] = steps[COMPILED].compiled
        result["compile"]["subset_keys"] = [list(key) for key in compile_keys]

    def summary(arm: dict) -> dict:
        ws = arm["windows"]
        metrics = {m for w in ws for m in w}
        return {m: _median([w[m] for w in ws if m in w]) for m in sorted(metrics)}

    result["arms"] = {a["name"]: summary(a) for a in arms + sub_arms}
    ratios = {}
    for mode in {a["mode"] for a in arms}:
        ld = next(a for a in arms if a["mode"] == mode and a["source"] == LOADER)
        st = next(a for a in arms if a["mode"] == mode and a["source"] == STAGED)
        per_round = [x["steps_per_s"] / y["steps_per_s"] for x, y in zip(ld["windows"], st["windows"])]
        ratios[mode] = [_median(per_round), min(per_round), max(per_round)]
    result["ratios"] = ratios
    pair = sub_arms or [a for a in arms if a["source"] == STAGED]
    if len(pair) == 2:
        eager = next(a for a in pair if a["mode"] == EAGER)
        comp = next(a for a in pair if a["mode"] == COMPILED)
        per_round = [c["steps_per_s"] / e["steps_per_s"] for e, c in zip(eager["windows"], comp["windows"])]
        result["speedup"] = [_median(per_round), min(per_round), max(per_round)]
        result["eager_ms"] = 1e3 / _median([w["steps_per_s"] for w in eager["windows"]])
        result["compiled_ms"] = 1e3 / _median([w["steps_per_s"] for w in comp["windows"]])
        result["speedup_subset"] = bool(sub_arms)
    result["mismatches"] = b.mismatches
    if b.cuda:
        result["max_mem_gb"] = torch.cuda.max_memory_allocated(b.device) / 2**30
        result["gpu_name"] = torch.cuda.get_device_name(b.device)
    result["nvml"] = gpu is not None
    result["elapsed_s"] = time.perf_counter() - b.t0
    b.say(f"done in {result['elapsed_s']:.0f} s")
    return result


# ---------------------------------------------------------------- driver

def _run_part(job: dict, env: dict) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--part-job", json.dumps(job)]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env)  # stderr: progress
    if r.returncode != 0:
        raise SystemExit(f"benchmark of preset {job['preset']} failed (exit {r.returncode}); "
                         f"see the messages above")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _fmt_ratio(r: list[float] | None) -> str:
    return "-" if r is None else f"{r[0]:.3f} [{r[1]:.2f}-{r[2]:.2f}]"


def _table(results: list[dict], header: list[str], peak_tflops: float) -> str:
    names = [r["preset"] for r in results]
    width = max(22, *(len(n) for n in names))

    def row(label: str, cells: list[str]) -> str:
        return f"{label:<{LABEL}}" + "".join(f"{c:>{width}}" for c in cells)

    def cells(fn: Any) -> list[str]:
        out = []
        for r in results:
            try:
                v = fn(r)
            except (KeyError, TypeError, StopIteration, ZeroDivisionError):
                v = None
            out.append("-" if v is None else v)
        return out

    def arm(r: dict, name: str, metric: str, fmt: str) -> str | None:
        a = r["arms"].get(name)
        return None if a is None or metric not in a else format(a[metric], fmt)

    def both(r: dict, mode: str, metric: str, fmt: str, scale: float = 1.0) -> str | None:
        a, b = r["arms"].get(f"{mode}/{LOADER}"), r["arms"].get(f"{mode}/{STAGED}")
        if a is None or b is None or metric not in a or metric not in b:
            return None
        return f"{format(a[metric] / scale, fmt)} / {format(b[metric] / scale, fmt)}"

    lines = header + ["", row("preset", names), "-" * (LABEL + width * len(names))]
    lines.append(row("parameters (M)", cells(lambda r: f"{r['params_m']:.1f}")))
    lines.append(row("device / precision / threads",
                     cells(lambda r: f"{r['device']} {r['precision']} {r['threads']}t")))
    lines.append(row("data.batch_frames / shapes / batches per epoch",
                     cells(lambda r: f"{r['batch_frames']} / {r['shapes']} / {r['batches_per_epoch']}")))
    lines.append(row("padding efficiency / loader workers / prefetch",
                     cells(lambda r: f"{r['padding']:.3f} / {r['workers']} / {r['prefetch']}")))
    lines.append(row("trainer's step mode (train.compile setting)",
                     cells(lambda r: f"{COMPILED if r['trainer_compiles'] else EAGER} "
                                     f"({r['compile_setting']})")))
    modes = sorted({m for r in results for m in r["ratios"]}, key=lambda m: m != results[0]["main_mode"])
    for mode in modes:
        tag = f"[{mode}]"
        for src in (LOADER, STAGED):
            name = f"{mode}/{src}"
            lines.append(row(f"{tag} {src}: steps/s", cells(lambda r, n=name: arm(r, n, "steps_per_s", ".2f"))))
            lines.append(row(f"{tag} {src}: utterances/s", cells(lambda r, n=name: arm(r, n, "utt_per_s", ".1f"))))
            lines.append(row(f"{tag} {src}: audio-s/s", cells(lambda r, n=name: arm(r, n, "audio_s_per_s", ".1f"))))
        lines.append(row(f"{tag} RATIO loader / pre-staged, median [min-max]",
                         cells(lambda r, m=mode: _fmt_ratio(r["ratios"].get(m)))))
        lines.append(row(f"{tag} data-wait share: loader / pre-staged",
                         cells(lambda r, m=mode: both(r, m, "wait_share", ".2%"))))
        if any("gpu_util" in a for r in results for a in r["arms"].values()):
            lines.append(row(f"{tag} GPU utilisation % (NVML): loader / pre-staged",
                             cells(lambda r, m=mode: both(r, m, "gpu_util", ".0f"))))
        if any("tflops" in a for r in results for a in r["arms"].values()):
            lines.append(row(f"{tag} achieved TFLOP/s: loader / pre-staged",
                             cells(lambda r, m=mode: both(r, m, "tflops", ".3g"))))
            if any(r["device"].startswith("cuda") for r in results):
                lines.append(row(f"{tag} MFU (peak {peak_tflops:g} TFLOP/s): loader / pre-staged",
                                 cells(lambda r, m=mode: both(r, m, "tflops", ".1%", peak_tflops))))
    lines.append(row("model GFLOP per step (epoch mean, fwd+bwd)",
                     cells(lambda r: f"{r['gflop_per_step']:.1f}" if "gflop_per_step" in r else None)))
    lines.append(row("peak GPU memory GiB", cells(lambda r: f"{r['max_mem_gb']:.1f}" if "max_mem_gb" in r else None)))
    lines.append(row("pre-staged step ms: eager / compiled",
                     cells(lambda r: f"{r['eager_ms']:.0f} / {r['compiled_ms']:.0f}"
                           + (" (subset)" if r["speedup_subset"] else ""))))
    lines.append(row("compiled speed-up (eager / compiled time), median",
                     cells(lambda r: _fmt_ratio(r.get("speedup")) if "speedup" in r else None)))
    lines.append(row("compile warm-up s (cold, shapes compiled)",
                     cells(lambda r: f"{r['compile']['warmup_s']:.0f} ({r['compile']['shapes']} shapes)"
                           + ("" if r["compile"]["ok"] else " FAILED"))))
    lines.append(row("graphs compiled: warm-up / later (recompiles)",
                     cells(lambda r: f"{r['compile']['graphs_warmup']} / {r['compile']['graphs_later']}")))
    lines.append(row("graphs over 1 epoch + val: train+eval / bound",
                     cells(lambda r: f"{r['graphs']['train']}+{r['graphs']['eval']} / "
                                     f"{r['graphs']['bound_train']}+{r['graphs']['bound_eval']}")))
    lines.append(row("graph breaks (epoch + val) / capture seconds",
                     cells(lambda r: f"{r['graphs']['breaks']} / {r['graphs']['seconds']:.0f}")))
    lines.append(row("shape-order mismatches loader vs plan", cells(lambda r: str(r["mismatches"]))))
    lines.append(row("seconds for this preset", cells(lambda r: f"{r['elapsed_s']:.0f}")))
    return "\n".join(lines)


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", default=None,
                   help="comma-separated model presets (default: tiny,small on CPU; tiny,small,base on CUDA)")
    p.add_argument("--data", type=Path, default=None, help=f"dataset (default {DEFAULT_DATA})")
    p.add_argument("--store", type=Path, default=None,
                   help="prepared store folder to use or create and keep (default: a temporary one)")
    p.add_argument("--steps", type=int, default=None,
                   help="measured optimizer steps per window (default 8 on CPU, 40 on CUDA)")
    p.add_argument("--rounds", type=int, default=6, help="interleaved windows per arm (medians over them)")
    p.add_argument("--warmup", type=int, default=2, help="untimed loader steps before the rounds")
    p.add_argument("--batch-frames", type=int, default=None,
                   help="data.batch_frames for every preset (default: CPU tiny 1500, small/base 1000; "
                        "CUDA the config default)")
    p.add_argument("--skip-compile", action="store_true", help="no torch.compile measurements at all")
    p.add_argument("--compile-presets", default=None,
                   help="presets whose compiled step is measured (default: tiny on CPU, all on CUDA)")
    p.add_argument("--compile-shapes", type=int, default=None,
                   help="bucket shapes to compile, most frequent first; 0 = all (default: 1 on CPU, "
                        "0 on CUDA). With all shapes, the compiled loader/pre-staged pair is measured too")
    p.add_argument("--inductor-cache", type=Path, default=None,
                   help="TORCHINDUCTOR_CACHE_DIR to use (default: a fresh one, so warm-up is a cold compile)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads; 0 = torch's default (what the trainer uses). Default: "
                        "1 on CPU (see the docstring: a shared small machine makes 2 threads swing "
                        "10x), 0 on CUDA")
    p.add_argument("--flops", action="store_true", help="count model FLOPs also on CPU (always on CUDA)")
    p.add_argument("--peak-tflops", type=float, default=989.0,
                   help="peak dense TFLOP/s of the GPU at the training precision, for MFU (989: H100/H200 bf16)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="config override for every preset, e.g. data.num_workers=2 (repeatable)")
    p.add_argument("--part-job", help=argparse.SUPPRESS)
    return p.parse_args()


def _prepare(args: argparse.Namespace, tmp: Path) -> tuple[Path, Path]:
    from myxtts.config import Config
    from myxtts.data.prepare import prepare_store

    data = args.data or DEFAULT_DATA
    if not data.exists():
        if args.data:
            raise SystemExit(f"--data {data} does not exist; pass a dataset folder")
        from myxtts.synthetic import make_demo_data

        _say(f"{DEFAULT_DATA} not found: using a generated demo corpus")
        data = make_demo_data(tmp / "demo", speakers=4, utterances=40)
    store = args.store or tmp / "store"
    _say(f"preparing {data} -> {store}")
    prepare_store(data, store, Config(), progress=False, echo=lambda s: None)
    return data, store


def main() -> None:
    args = _parse()
    if args.part_job:
        print(json.dumps(part_measure(json.loads(args.part_job))))
        return
    import torch

    cuda = torch.cuda.is_available()
    presets = (args.presets or ("tiny,small,base" if cuda else "tiny,small")).split(",")
    compile_presets = set() if args.skip_compile else set(
        (args.compile_presets or (",".join(presets) if cuda else "tiny")).split(","))
    compile_shapes = args.compile_shapes if args.compile_shapes is not None else (0 if cuda else 1)
    steps = args.steps or (40 if cuda else 8)
    threads = args.threads if args.threads is not None else (0 if cuda else 1)
    tmp = Path(tempfile.mkdtemp(prefix="myxtts-bench-step-"))
    env = {**os.environ, "PYTHONWARNINGS": "ignore",
           "TORCHINDUCTOR_CACHE_DIR": str(args.inductor_cache or tmp / "inductor")}
    load_start = os.getloadavg()[0]
    try:
        data, store = _prepare(args, tmp)
        from myxtts.config import Config
        from myxtts.data.store import FeatureStore

        train = FeatureStore.open(store, "train", Config())
        audio_min = float(train.mel_lengths.sum()) / Config().audio.frames_per_second / 60
        n_train = len(train)
        results = []
        for preset in presets:
            bf = args.batch_frames or (Config().data.batch_frames if cuda else CPU_BATCH_FRAMES[preset])
            job = {"preset": preset, "store": str(store), "tmp": str(tmp), "batch_frames": bf,
                   "steps": steps, "rounds": args.rounds, "warmup": args.warmup,
                   "compile": preset in compile_presets, "compile_shapes": compile_shapes,
                   "threads": threads, "flops": args.flops, "set": args.set}
            results.append(_run_part(job, env))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    header = [
        f"data: {data} ({n_train} train utterances, {audio_min:.1f} min); store "
        f"{store if args.store else '(temporary)'}",
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, load average {load_start:.1f} at start / "
        f"{os.getloadavg()[0]:.1f} at end" + (f", GPU {results[0].get('gpu_name')}" if cuda else ""),
        f"windows: {steps} optimizer steps each, {args.rounds} rounds per arm, interleaved "
        f"A/B then B/A; {args.warmup} untimed loader steps; medians over rounds"
        + (f"; config overrides {args.set}" if args.set else ""),
    ]
    print(_table(results, header, args.peak_tflops))
    notes = [
        "RATIO = loader steps/s / pre-staged steps/s of the paired windows (same shapes, same order);",
        "  1 - RATIO is the share of the step's speed of light lost to the input pipeline.",
        "data-wait share: StepTimer (time in next(loader); on CUDA only while the GPU queue was dry).",
    ]
    if any(r.get("speedup_subset") for r in results):
        notes.append("(subset): eager vs compiled on the --compile-shapes most frequent bucket "
                     "shape(s) only; --compile-shapes 0 compiles all and adds the compiled pair.")
    if any("graphs" in r for r in results):
        notes.append("graphs over 1 epoch + val: dynamo capture (eager backend) of the compiled "
                     "function over a train epoch (train mode) and a validation pass (eval mode).")
    print("\n".join(notes))


if __name__ == "__main__":
    main()
