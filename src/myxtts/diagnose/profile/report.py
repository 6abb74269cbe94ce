"""The profile as a person reads it: the per-phase table, the device figures, the verdict.

Input is the dict ``diagnose.profile.run.profile`` returns (also what ``--json`` prints), so
the text and the JSON can never disagree.
"""

from __future__ import annotations

from typing import Any

from myxtts.diagnose.profile.phases import COPY, TIMELINE


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:8.2f}"


def _flops_line(p: dict[str, Any]) -> str:
    if p["tflops"] is None:
        return "model FLOPs: not counted for this model; MFU left out"
    return (f"model FLOPs: {p['tflops']:.3f} TFLOP/s achieved; MFU "
            + (f"{100 * p['mfu']:.1f}% of {p['peak_tflops']:g} TFLOP/s" if p["mfu"] is not None
               else "unknown (no peak for this device: --set train.peak_tflops=N)"))


def format_report(p: dict[str, Any]) -> str:
    dev, setup, mem = p["device"], p["setup"], p["memory"]
    axis = p["shape_axes"].rsplit(" x ", 1)[-1]
    lines = [
        f"myxtts profile: {setup['data']} on {dev['name']} ({dev['type']}, torch {dev['torch']}, "
        f"{dev['cpus']} CPUs)",
        f"setup: model {setup['model']} ({setup['parameters'] / 1e6:.1f} M parameters), "
        f"{setup['precision']}, {setup['step_mode']} step "
        f"(train.compile={setup['compile']}, train.cuda_graphs={setup['cuda_graphs']}), "
        f"data.batch_frames={setup['batch_frames']}, {setup['num_workers']} loader workers, "
        f"grad_accum_steps={setup['grad_accum_steps']}; ready in {setup['seconds']:.1f} s",
        f"batch sizes per bucket ({axis}:batch): "
        + " ".join(f"{b['frames']}:{b['batch']}" for b in setup["batch_sizes"]),
        f"window: {p['steps']} steps after {p['warmup_steps']} untimed, {p['seconds']:.2f} s; "
        f"timing: {p['timing']}",
        "",
        f"{'phase':<34}{'mean ms':>9}{'p10 ms':>9}{'p90 ms':>9}{'share':>8}",
    ]
    phases = p["phases"]
    for name in [*TIMELINE, "step"]:
        if name in phases:
            ph = phases[name]
            label = "step (sum of the above)" if name == "step" else name
            lines.append(f"{label:<34}{_ms(ph['mean_s'])} {_ms(ph['p10_s'])} {_ms(ph['p90_s'])}"
                         f"{100 * ph['share']:7.1f}%")
    if COPY in phases:
        ph = phases[COPY]
        lines.append(f"{COPY + ' (side stream, per batch)':<34}{_ms(ph['mean_s'])} "
                     f"{_ms(ph['p10_s'])} {_ms(ph['p90_s'])}   overlapped")
    else:
        lines.append(f"{COPY:<34}   none: the batches are already in the training device's "
                     f"memory (CPU)")
    lines.append(f"{'host time to queue/run a step':<34}{_ms(p['host_s'])}")
    t = p["throughput"]
    lines += [
        "",
        f"throughput: {t['steps_per_s']:.2f} steps/s, {t['utterances_per_s']:.1f} utterances/s, "
        f"{t['audio_s_per_s']:.1f} audio-s/s",
        "GPU utilisation (NVML): " + (
            f"{p['gpu_util']:.0f}%" if p["gpu_util"] is not None
            else "no GPU" if dev["type"] != "cuda"
            else "not measured (NVML unavailable: pip install nvidia-ml-py)"),
        _flops_line(p),
        f"peak memory ({mem['kind']}): {mem['peak_gib']:.2f} GiB"
        + (f" allocated, {mem['reserved_gib']:.2f} GiB reserved" if mem["kind"] == "GPU" else "")
        + f" of {mem['total_gib']:.1f} GiB",
        f"padding efficiency: {100 * p['padding_efficiency']:.1f}% of the padded {p['frames']} "
        + ("are the clips' codes" if setup["kind"] == "xtts_v2" else "are speech"),
        f"shapes seen ({p['shape_axes']}: batches): " + ", ".join(
            f"{s['batch']}x{s['text']}x{s['frames']}: {s['batches']}" for s in p["shapes"]),
        f"recompiles during the window: {p['recompiles']}"
        + (f"; allocator retries: {p['alloc_retries']}" if dev["type"] == "cuda" else ""),
    ]
    v = p["verdict"]
    lines += ["", f"verdict: {v['kind'].upper()}"]
    lines += [f"  because {e}" for e in v["evidence"]]
    lines += [f"  try: {a}" if i == 0 else f"  then: {a}" for i, a in enumerate(v["advice"])]
    if p.get("trace"):
        lines += ["", f"trace: {p['trace']} (open in https://ui.perfetto.dev, or `tensorboard "
                      f"--logdir` on its folder with the torch-tb-profiler plugin)"]
    return "\n".join(lines)
