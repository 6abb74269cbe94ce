"""``myxtts profile``: run the real training setup for a measured window and say what limits it.

The run is the recipe ``myxtts train`` runs on the data (``profile.subject``: the TTS
model's ``train.tts.TTSRecipe``, or on a store of ``myxtts prepare --xtts`` XTTS-v2's
``train.xtts.recipe.XttsRecipe``), set up exactly as ``myxtts train`` sets it up (loader, model, precision, compile mode, CUDA graphs, the measured batch sizes,
the warm-up of every bucket shape), its steps run by the recipe's own loop
(``Recipe.run_steps``, fed by the trainer's input path) without the events: it never
writes a checkpoint. After ``WARMUP_STEPS`` untimed steps (loader workers started, the
prefetch queue full, the allocator warm), ``steps`` steps are timed phase by phase
(``profile.phases``) while NVML samples the GPU; then the figures go to the rules of
``profile.verdict``. ``trace_dir``: a few more steps under ``torch.profiler``, written as a
Chrome trace that TensorBoard's profiler plugin and Perfetto open.
"""

from __future__ import annotations

import os
import resource
import socket
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity
from torch.profiler import profile as torch_profile

from myxtts.config import Config, ConfigError, resolve_device
from myxtts.diagnose.profile.phases import COPY, PhaseClock, copy_seconds, phase_stats
from myxtts.diagnose.profile.subject import Subject, subject
from myxtts.diagnose.profile.verdict import Figures, decide
from myxtts.observe.flops import achieved_tflops
from myxtts.observe.gpu import GpuUtilSampler
from myxtts.system import available_cpus
from myxtts.train.efficiency import resolve_peak
from myxtts.train.engine import compiled_graphs, native_bf16
from myxtts.train.errors import TrainError
from myxtts.train.recipe import Recipe

WARMUP_STEPS = 5
TRACE_STEPS = 5
# On a GPU the window lasts at least this long (more steps than asked if need be): NVML
# averages utilisation over its own sample period (1/6 s to 1 s by GPU), so a window of a
# few fast graphed steps would mostly read the time before it.
MIN_GPU_WINDOW_S = 2.0
_PRECISION = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def profile(cfg: Config, data_path: str | Path, steps: int, trace_dir: Path | None = None,
            echo: Any = print, resume: Path | None = None,
            init_from: str | Path | None = None) -> dict[str, Any]:
    """Everything the report shows, as a JSON-ready dict (``report.format_report`` prints it).
    ``resume``: a checkpoint whose weights (and model settings) are profiled; ``init_from``:
    on an XTTS store, the XTTS-v2 folder a new fine-tuning run starts from."""
    if steps < 1:
        raise ConfigError(f"--steps must be at least 1, got {steps}")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise TrainError("myxtts profile measures one process: run it without torchrun")
    started = time.perf_counter()
    cuda = resolve_device(cfg.train.device, "train.device").type == "cuda"
    copy_log: list | None = [] if cuda else None
    subj = subject(cfg, data_path, resume, Path(init_from) if init_from else None, copy_log)
    run = subj.recipe
    try:
        run.setup()
        return _measure(subj, data_path, steps, time.perf_counter() - started, trace_dir, echo)
    finally:
        run.cleanup()


class _Window:
    """The measured window's view of each step (``train.recipe.StepWatch``): the phase
    clock around the fetch, the host's time in the step, the shapes and frames."""

    def __init__(self, clock: PhaseClock, subj: Subject) -> None:
        self.clock, self.subject = clock, subj
        self.host: list[float] = []
        self.keys: list[tuple] = []
        self.utterances = self.real_frames = self.padded_frames = 0
        self._h0 = 0.0

    def fetching(self) -> None:
        self.clock.start()

    def fetched(self) -> None:
        self.clock.fetched()
        self._h0 = time.perf_counter()

    def stepped(self, micro: list[dict], frames: int) -> None:
        self.host.append(time.perf_counter() - self._h0)
        self.real_frames += frames
        for batch in micro:
            key = self.subject.key(batch)
            self.keys.append(key)
            self.utterances += key[0]
            self.padded_frames += key[0] * key[2]


def _measure(subj: Subject, data_path: str | Path, steps: int, setup_s: float,
             trace_dir: Path | None, echo: Any) -> dict[str, Any]:
    run = subj.recipe
    cfg, device, engine = run.cfg, run.device, run.engine
    cuda = device.type == "cuda"
    copy_log = subj.copy_log
    accum = cfg.train.grad_accum_steps
    echo(f"profile: {WARMUP_STEPS} untimed steps, then {steps} measured"
         + (f" (at least {MIN_GPU_WINDOW_S:g} s)" if cuda else ""))
    run.run_steps(WARMUP_STEPS)
    retries0 = 0
    if cuda:
        torch.cuda.synchronize(device)
        copy_log.clear()
        torch.cuda.reset_peak_memory_stats(device)
        retries0 = torch.cuda.memory_stats(device).get("num_alloc_retries", 0)
    graphs0 = compiled_graphs()
    gpu = GpuUtilSampler(device)
    clock = PhaseClock(device)
    window = _Window(clock, subj)
    gpu.start()
    wall0 = time.perf_counter()
    done = 0
    with engine.timed(clock.mark):
        while done < steps or (cuda and time.perf_counter() - wall0 < MIN_GPU_WINDOW_S):
            run.run_steps(1, watch=window)
            done += 1
        clock.finish()
    wall = time.perf_counter() - wall0
    util = gpu.stop()
    recompiles = compiled_graphs() - graphs0
    engine.read()  # the loop's log-step read-back: the sums start clean for what follows
    copies = copy_seconds(copy_log) if copy_log is not None else []
    retries = torch.cuda.memory_stats(device).get("num_alloc_retries", 0) - retries0 if cuda else 0

    keys, host = window.keys, window.host
    utterances, real_frames, padded_frames = (window.utterances, window.real_frames,
                                              window.padded_frames)
    stats = phase_stats(clock.steps(), copies)
    fps = run.frames_per_second()
    flops = subj.flops()
    tflops = achieved_tflops(flops.total(keys), wall) if flops is not None else None
    peak = resolve_peak(cfg, device, engine.dtype)
    memory = _memory(device)
    out: dict[str, Any] = {
        "device": _device_info(device),
        "setup": _setup_info(subj, data_path, setup_s),
        "timing": "CUDA events on the compute stream" if cuda
                  else "wall clock, synchronous CPU execution",
        "warmup_steps": WARMUP_STEPS, "steps": done, "seconds": wall,
        "phases": {k: {**v.as_dict(), "share": _share(k, v.mean, stats["step"].mean, accum)}
                   for k, v in stats.items()},
        "host_s": sum(host) / len(host),
        "throughput": {"steps_per_s": done / wall, "utterances_per_s": utterances / wall,
                       "audio_s_per_s": real_frames / fps / wall},
        "gpu_util": util, "tflops": tflops, "peak_tflops": peak,
        "mfu": tflops / peak if peak and tflops is not None else None,
        "memory": memory,
        "padding_efficiency": real_frames / padded_frames if padded_frames else 1.0,
        "frames": subj.frames, "shape_axes": subj.shape_axes,
        "shapes": [{"batch": k[0], "text": k[1], "frames": k[2], "batches": n}
                   for k, n in sorted(Counter(keys).items(), key=lambda kv: -kv[1])],
        "recompiles": recompiles, "alloc_retries": retries,
    }
    figures = _figures(out, subj, keys, stats)
    out["verdict"] = decide(figures).as_dict()
    out["trace"] = str(_trace(run, trace_dir)) if trace_dir is not None else None
    return out


def _share(phase: str, mean: float, step: float, accum: int) -> float:
    """A phase's share of the step (the copy is per batch: a step copies ``accum``)."""
    per_step = mean * accum if phase == COPY else mean
    return per_step / step if step > 0 else 0.0


def _device_info(device: torch.device) -> dict[str, Any]:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return {"type": device.type, "name": name, "torch": torch.__version__,
            "cpus": available_cpus()}


def _setup_info(subj: Subject, data_path: str | Path, seconds: float) -> dict[str, Any]:
    run = subj.recipe
    cfg, engine = run.cfg, run.engine
    shapes = sorted(set(subj.shapes()), key=lambda s: s.frames)
    return {"seconds": seconds, "data": str(data_path), "on_the_fly": subj.on_the_fly(),
            "kind": "xtts_v2" if subj.xtts else "tts",
            "preset": None if subj.xtts else cfg.model.preset, "model": subj.model(),
            "parameters": sum(p.numel() for p in engine.model.parameters()),
            "step_mode": engine.mode,
            "precision": _PRECISION.get(engine.dtype, str(engine.dtype)),
            "compile": cfg.train.compile, "cuda_graphs": cfg.train.cuda_graphs,
            "batch_frames": cfg.data.batch_frames, "grad_accum_steps": cfg.train.grad_accum_steps,
            "batch_sizes": [{"frames": s.frames, "batch": s.batch} for s in shapes],
            "num_workers": subj.workers(), "prefetch_batches": cfg.data.prefetch_batches}


def _memory(device: torch.device) -> dict[str, Any]:
    """Peak memory of the window against the device's total (a CPU: this process's peak
    resident set against the machine's RAM)."""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        return {"kind": "GPU", "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30,
                "reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30,
                "total_gib": total / 2**30}
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"kind": "host RAM, peak RSS", "peak_gib": rss_kib / 2**20,
            "reserved_gib": rss_kib / 2**20, "total_gib": total / 2**30}


def _figures(out: dict[str, Any], subj: Subject, keys: list[tuple], stats: dict) -> Figures:
    run = subj.recipe
    cfg, setup, mem = run.cfg, out["setup"], out["memory"]
    cuda = run.device.type == "cuda"
    per_step_copy = stats[COPY].mean * cfg.train.grad_accum_steps if COPY in stats else None
    batches = [s.batch for s in subj.shapes()]
    return Figures(
        device=run.device.type, step_s=stats["step"].mean,
        data_wait_s=stats["data wait"].mean if "data wait" in stats else 0.0,
        copy_s=per_step_copy if cuda else None, host_s=out["host_s"], gpu_util=out["gpu_util"],
        mem_peak_gib=mem["reserved_gib"], mem_total_gib=mem["total_gib"], mfu=out["mfu"],
        padding_efficiency=out["padding_efficiency"], step_mode=setup["step_mode"],
        compile_setting=cfg.train.compile, graphs_setting=cfg.train.cuda_graphs,
        graphs_blocker=run.engine.graphs_blocker(), precision=setup["precision"],
        bf16_supported=cuda and native_bf16(),
        batch_frames=str(cfg.data.batch_frames),
        largest_batch_frames=max(b * t for b, _, t in keys),
        batch_capped=cfg.data.max_batch_size > 0 and max(batches) >= cfg.data.max_batch_size,
        max_batch_size=cfg.data.max_batch_size,
        auto_batch_memory_share=cfg.data.auto_batch_memory_share, num_workers=setup["num_workers"],
        cpus=available_cpus(), prefetch_batches=cfg.data.prefetch_batches,
        on_the_fly=setup["on_the_fly"], max_duration_s=cfg.data.max_duration_s,
        preset=cfg.model.preset, xtts=subj.xtts, num_buckets=cfg.data.num_buckets, recompiles=out["recompiles"],
        alloc_retries=out["alloc_retries"], worker_note=subj.worker_note())


def _trace(run: Recipe, trace_dir: Path) -> Path:
    """``TRACE_STEPS`` steps under ``torch.profiler``, after the measured window (the
    profiler's own overhead must not colour the figures), as one Chrome trace file."""
    trace_dir = Path(trace_dir)
    trace_dir.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU]
    if run.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with torch_profile(activities=activities) as prof:
        run.run_steps(TRACE_STEPS)
        if run.device.type == "cuda":
            torch.cuda.synchronize(run.device)
    run.engine.read()
    # the file name TensorBoard's profiler plugin looks for: WORKER.TIMESTAMP.pt.trace.json
    path = trace_dir / f"{socket.gethostname()}_{os.getpid()}.{int(time.time() * 1e3)}.pt.trace.json"
    tmp = path.with_name(path.name + ".tmp")
    prof.export_chrome_trace(str(tmp))
    os.replace(tmp, path)
    return path
