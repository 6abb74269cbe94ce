"""What limits a training run, decided by explicit rules over the profile's figures, with the
evidence and the exact change to try.

Four verdicts, checked in order (input-bound, memory-limited, host/launch-bound,
compute-bound; the rules are on :func:`decide`): the first that holds wins, because fixing a
later one cannot help while an earlier one holds. Every piece of advice names a flag of
``myxtts train`` or a ``--set`` key that exists (``tests/diagnose/test_verdict.py`` checks
each against the parser and the config).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

INPUT_WAIT_SHARE = 0.10
COPY_SHARE = 0.9
MEMORY_FULL = 0.92
BUSY_UTIL = 80.0
HOST_AHEAD = 0.5  # host time under this share of the step: the host is not the limit
ROOMY_MEMORY = 0.5  # below this share of memory in use, a batch can grow
LOW_PADDING_EFFICIENCY = 0.8

INPUT, MEMORY, HOST, COMPUTE = "input-bound", "memory-limited", "host/launch-bound", "compute-bound"


@dataclass
class Figures:
    """What the rules look at (a profile's measurements and the run's settings)."""

    device: str  # "cuda" or "cpu"
    step_s: float  # mean step time
    data_wait_s: float
    copy_s: float | None  # mean side-stream copy per step (GPU); None on a CPU
    host_s: float  # host time to queue (GPU) or run (CPU) one step, mean
    gpu_util: float | None  # NVML mean %, None without NVML
    mem_peak_gib: float
    mem_total_gib: float
    mfu: float | None
    padding_efficiency: float  # real mel frames / padded mel frames
    step_mode: str  # eager / compiled / graphed
    compile_setting: str  # train.compile
    graphs_setting: str  # train.cuda_graphs
    graphs_blocker: str | None  # why graphs cannot run here (None: they can)
    precision: str  # bf16 / fp16 / fp32 (resolved)
    bf16_supported: bool
    batch_frames: str  # data.batch_frames as set ("auto" or a number)
    largest_batch_frames: int  # max over batches of B x T (padded frames per step)
    batch_capped: bool  # some bucket's batch sits at data.max_batch_size
    max_batch_size: int
    auto_batch_memory_share: float
    num_workers: int
    cpus: int
    prefetch_batches: int
    on_the_fly: bool
    max_duration_s: float
    preset: str
    xtts: bool = False  # XTTS-v2 fine-tuning: the model is the folder's (no --model-size)
    num_buckets: int = 16
    recompiles: int = 0
    alloc_retries: int = 0  # the CUDA caching allocator's retries during the window
    worker_note: str | None = None  # store workers that save too little (the loader's rule)


@dataclass
class Verdict:
    kind: str
    evidence: list[str]
    advice: list[str] = field(default_factory=list)  # the first is the change to try first

    def as_dict(self) -> dict:
        return asdict(self)


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def decide(f: Figures) -> Verdict:
    """The verdict for these figures: the first rule that holds wins.

    1. input-bound: data wait >= ``INPUT_WAIT_SHARE`` of the step, or the copy alone
       >= ``COPY_SHARE``; 2. memory-limited: peak within ``MEMORY_FULL`` of the total AND
       the allocator retried, or NVML < ``BUSY_UTIL`` while the batch cannot grow (a full,
       busy GPU is well used); 3. host/launch-bound (GPU): NVML < ``BUSY_UTIL``. The host's
       queueing time proves only one way (well under the step: the host is ahead), so
       without NVML launch- and compute-bound cannot be told apart, and the verdict says so;
       4. compute-bound: none of the above."""
    v = _decide(f)
    if f.worker_note:  # the store loader's own rule (data.feed.loader.choose_workers)
        v.evidence.append(f.worker_note)
        v.advice.insert(0 if v.kind == INPUT else len(v.advice),
                        "--num-workers 0 (what the store loader chooses here by itself)")
    if f.recompiles:
        v.evidence.append(f"{f.recompiles} graph(s) compiled during the window: its timings "
                          f"include compilation; profile again (the kernels are cached now)")
    return v


def _decide(f: Figures) -> Verdict:
    wait = f.data_wait_s / f.step_s if f.step_s > 0 else 0.0
    copy = (f.copy_s or 0.0) / f.step_s if f.step_s > 0 else 0.0
    if wait >= INPUT_WAIT_SHARE or copy >= COPY_SHARE:
        return _input_bound(f, wait, copy)
    mem = f.mem_peak_gib / f.mem_total_gib if f.mem_total_gib > 0 else 0.0
    low_util = f.gpu_util is not None and f.gpu_util < BUSY_UTIL
    if mem >= MEMORY_FULL and (f.device == "cpu" or f.alloc_retries > 0 or low_util):
        return _memory_limited(f, mem)
    if f.device == "cuda" and low_util:
        return _host_bound(f, mem)
    return _compute_bound(f, mem)


def _input_bound(f: Figures, wait: float, copy: float) -> Verdict:
    ev = [f"data wait {_pct(wait)} of the step ({1e3 * f.data_wait_s:.1f} of "
          f"{1e3 * f.step_s:.1f} ms)"]
    if f.copy_s is not None:
        ev.append(f"host->device copy {1e3 * f.copy_s:.1f} ms per step on the side stream "
                  f"({_pct(copy)} of the step)")
    ev.append(f"{f.num_workers} loader workers on {f.cpus} CPUs")
    advice = []
    if f.on_the_fly:
        advice.append("features are computed on the fly: prepare a store once "
                      "(`myxtts prepare DATA --out STORE`) and train on STORE")
    more = min(8, max(2, f.cpus // 2))
    if f.num_workers < more and f.cpus > 2 and not f.worker_note:
        advice.append(f"--num-workers {more}")
    if f.prefetch_batches < 4:
        advice.append(f"--set data.prefetch_batches={max(4, 2 * f.prefetch_batches)}")
    if copy >= COPY_SHARE:
        advice.append("the copy itself is the limit (PCIe): check the GPU's PCIe link "
                      "with `myxtts monitor` (rx MB/s) and `nvidia-smi -q | grep -i width`")
    if not f.on_the_fly:
        advice.append("check the store's read speed: `myxtts doctor STORE` (copy it to a local "
                      "SSD if it is on a network disk)")
    return Verdict(INPUT, ev, advice)


def _memory_limited(f: Figures, mem: float) -> Verdict:
    ev = [f"peak memory {f.mem_peak_gib:.1f} of {f.mem_total_gib:.1f} GiB ({_pct(mem)})"]
    if f.alloc_retries:
        ev.append(f"the allocator freed its cache and retried {f.alloc_retries} time(s)")
    if f.gpu_util is not None:
        ev.append(f"GPU utilisation {f.gpu_util:.0f} %")
    advice = []
    if f.device == "cuda" and f.precision == "fp32" and f.bf16_supported:
        advice.append("--precision bf16 (halves the activations' memory)")
    if f.batch_frames == "auto":
        if f.auto_batch_memory_share > 0.8:
            advice.append(f"--set data.auto_batch_memory_share="
                          f"{round(f.auto_batch_memory_share - 0.1, 2)} (headroom for "
                          f"fragmentation and other processes)")
    else:
        current = int(f.batch_frames)
        advice.append(f"--batch-frames {max(current // 2, int(current * 0.8) // 100 * 100)} "
                      f"(or --set data.batch_frames=auto, the largest batch that fits per bucket)")
    shorter = max(2.0, round(0.75 * f.max_duration_s, 1))
    if f.on_the_fly:
        advice.append(f"--set data.max_duration_s={shorter} (the longest bucket sets the memory "
                      f"ceiling)")
    elif f.xtts:
        advice.append("the longest bucket sets the memory ceiling: leave the longest clips out "
                      "of the dataset and prepare the store again (`myxtts prepare DATA --out "
                      "STORE --xtts XTTS_DIR --force`)")
    else:
        advice.append(f"the longest bucket sets the memory ceiling: rebuild the store without "
                      f"the longest clips (`myxtts prepare DATA --out STORE --force --set "
                      f"data.max_duration_s={shorter}`)")
    if f.device == "cpu":
        advice.append("--num-workers 0 (no worker processes holding batches)")
    return Verdict(MEMORY, ev, advice)


def _host_bound(f: Figures, mem: float) -> Verdict:
    ev = [f"GPU utilisation {f.gpu_util:.0f} % (NVML)",
          f"the host needs {1e3 * f.host_s:.1f} ms to queue a {1e3 * f.step_s:.1f} ms step",
          f"{f.mem_peak_gib:.1f} of {f.mem_total_gib:.0f} GiB in use ({_pct(mem)}); "
          f"{f.step_mode} step"]
    advice = []
    if f.step_mode == "eager":
        if f.compile_setting == "off":
            advice.append("eager step on CUDA: compile is off: --compile")
        else:
            advice.append("the step runs eagerly although compile is not off: torch.compile "
                          "failed (see the warning above); `myxtts doctor` tests it")
    if f.step_mode != "graphed":
        if f.graphs_blocker is None and f.graphs_setting == "off":
            advice.append("--set train.cuda_graphs=auto (one launch per step)")
        elif f.graphs_blocker and "fp16" in f.graphs_blocker and f.bf16_supported:
            advice.append("--precision bf16 (fp16's loss scaler keeps CUDA graphs off)")
    if mem < ROOMY_MEMORY:
        bigger = _bigger_batch(f)
        if bigger:
            advice.append(bigger)
        if f.preset != "base" and not f.xtts:
            advice.append("--model-size base (this GPU has room for a larger model)")
    if not advice:
        advice.append("the step is one graph replay and memory is in use: the GPU waits for "
                      "the host between steps (the 'other' phase); see what the host does "
                      "there in a trace: `myxtts profile DATA --trace DIR`")
    return Verdict(HOST, ev, advice)


def _bigger_batch(f: Figures) -> str | None:
    """The flag that makes each step bigger, or None when no batch knob is left."""
    used = f"{f.mem_peak_gib:.0f} GiB of {f.mem_total_gib:.0f} in use"
    if f.batch_capped and f.max_batch_size > 0:
        return (f"--batch-size {2 * f.max_batch_size} (batches stop at data.max_batch_size="
                f"{f.max_batch_size} with {used}; --batch-size 0 lets memory alone decide)")
    if f.batch_frames != "auto":
        current = int(f.batch_frames)
        factor = min(4.0, 0.85 / max(f.mem_peak_gib / max(f.mem_total_gib, 1e-9), 1e-3))
        new = max(int(f.largest_batch_frames * factor), 2 * current) // 1000 * 1000
        return f"--batch-frames {new} ({used}; or --set data.batch_frames=auto)"
    return None


def _compute_bound(f: Figures, mem: float) -> Verdict:
    ev = []
    if f.gpu_util is not None:
        ev.append(f"GPU utilisation {f.gpu_util:.0f} % (NVML)")
    if f.mfu is not None:
        ev.append(f"MFU {_pct(f.mfu)}")
    ev.append(f"data wait {_pct(f.data_wait_s / f.step_s if f.step_s else 0.0)} of the step")
    ev.append(f"padding efficiency {_pct(f.padding_efficiency)}")
    advice = []
    if f.device == "cpu":
        advice.append("training on a CPU: on a GPU, --device cuda")
        if f.preset != "tiny" and not f.xtts:
            advice.append("--model-size tiny (the CPU preset)")
    else:
        if f.precision == "fp32" and f.bf16_supported:
            advice.append("--precision bf16 (tensor cores at twice the TF32 rate)")
        if f.step_mode == "eager":
            advice.append("--compile (fused kernels)")
    if f.padding_efficiency < LOW_PADDING_EFFICIENCY:
        advice.append(f"--set data.num_buckets={2 * f.num_buckets} (less padding per batch)")
    if f.device == "cuda" and f.gpu_util is None and f.host_s >= HOST_AHEAD * f.step_s:
        ev.append(f"the host needs {1e3 * f.host_s:.1f} ms to queue a {1e3 * f.step_s:.1f} ms "
                  f"step and NVML is missing: launch-bound cannot be ruled out")
        advice.insert(0, "pip install nvidia-ml-py, then profile again (GPU utilisation tells "
                         "launch-bound from compute-bound)")
    if not advice:
        advice.append("nothing to fix in the pipeline: the arithmetic is the limit")
    return Verdict(COMPUTE, ev, advice)
