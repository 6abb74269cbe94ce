"""The profiler's verdict rules on synthetic figures: each verdict is reachable, the order of
the rules holds, and every piece of advice names a flag or config key that exists."""

from __future__ import annotations

import dataclasses
import itertools
import re
import shlex

import pytest

from myxtts.cli.common import config_from_args
from myxtts.cli.main import build_parser
from myxtts.cli.train import run_overrides
from myxtts.diagnose.profile.verdict import COMPUTE, HOST, INPUT, MEMORY, Figures, decide


def healthy(**changes) -> Figures:
    """An H100 run that the rules call compute-bound; each test changes what it studies."""
    base = Figures(
        device="cuda", step_s=0.100, data_wait_s=0.001, copy_s=0.004, host_s=0.010,
        gpu_util=98.0, mem_peak_gib=60.0, mem_total_gib=80.0, mfu=0.45,
        padding_efficiency=0.93, step_mode="graphed", compile_setting="auto",
        graphs_setting="auto", graphs_blocker=None, precision="bf16", bf16_supported=True,
        batch_frames="auto", largest_batch_frames=40000, batch_capped=False, max_batch_size=64,
        auto_batch_memory_share=0.85, num_workers=2, cpus=16, prefetch_batches=2,
        on_the_fly=False, max_duration_s=20.0, preset="base")
    return dataclasses.replace(base, **changes)


def test_compute_bound_when_nothing_else_holds():
    v = decide(healthy())
    assert v.kind == COMPUTE
    assert any("MFU 45 %" in e for e in v.evidence)


def test_data_wait_makes_it_input_bound_with_more_workers_first():
    # data wait 30 % with 2 workers on 16 CPUs -> --num-workers 8
    v = decide(healthy(data_wait_s=0.030, gpu_util=60.0))
    assert v.kind == INPUT
    assert v.advice[0] == "--num-workers 8"
    assert any("data wait 30 %" in e for e in v.evidence)
    assert any("2 loader workers on 16 CPUs" in e for e in v.evidence)


def test_store_workers_that_cost_more_than_they_save_are_named_with_the_fix():
    note = "2 loader workers make this store's batches cost the training process more"
    v = decide(healthy(data_wait_s=0.030, gpu_util=60.0, worker_note=note))
    assert v.kind == INPUT and v.advice[0].startswith("--num-workers 0")
    assert note in v.evidence and not any(a == "--num-workers 8" for a in v.advice)
    fine = decide(healthy(worker_note=note))  # compute-bound: still said, after the rest
    assert note in fine.evidence and fine.advice[-1].startswith("--num-workers 0")


def test_on_the_fly_input_is_told_to_prepare_a_store():
    v = decide(healthy(data_wait_s=0.05, on_the_fly=True))
    assert v.kind == INPUT and "myxtts prepare" in v.advice[0]


def test_a_copy_as_long_as_the_step_is_input_bound():
    v = decide(healthy(copy_s=0.095))
    assert v.kind == INPUT and any("PCIe" in a for a in v.advice)


def test_just_under_the_wait_threshold_is_not_input_bound():
    assert decide(healthy(data_wait_s=0.0099)).kind == COMPUTE
    assert decide(healthy(data_wait_s=0.0101)).kind == INPUT


def test_full_memory_is_memory_limited_only_when_it_hurts():
    v = decide(healthy(mem_peak_gib=76.0, gpu_util=70.0))
    assert v.kind == MEMORY
    assert "76.0 of 80.0 GiB" in v.evidence[0]
    # full and busy: batch_frames=auto fills the GPU on purpose, that is not a limit
    assert decide(healthy(mem_peak_gib=76.0)).kind == COMPUTE
    retried = decide(healthy(mem_peak_gib=76.0, alloc_retries=3))
    assert retried.kind == MEMORY and any("retried 3" in e for e in retried.evidence)
    fp32 = decide(healthy(mem_peak_gib=76.0, gpu_util=50.0, precision="fp32"))
    assert fp32.advice[0].startswith("--precision bf16")
    fixed = decide(healthy(mem_peak_gib=76.0, gpu_util=50.0, batch_frames="20000"))
    assert fixed.advice[0].startswith("--batch-frames 16000")
    small = decide(healthy(mem_peak_gib=76.0, gpu_util=50.0, batch_frames="1000"))
    assert int(small.advice[0].split()[1]) < 1000  # advice to shrink never grows the batch
    store = decide(healthy(mem_peak_gib=76.0, gpu_util=50.0))
    assert any("myxtts prepare DATA --out STORE --force --set data.max_duration_s=15.0" in a
               for a in store.advice)


def test_input_wins_over_memory_and_memory_over_launch():
    assert decide(healthy(data_wait_s=0.02, mem_peak_gib=79.0, gpu_util=30.0)).kind == INPUT
    assert decide(healthy(mem_peak_gib=79.0, gpu_util=30.0)).kind == MEMORY


def test_low_utilisation_with_room_is_launch_bound_and_says_how_big_a_batch():
    # 6 GiB of 80 in use and utilisation 35 %: raise --batch-frames
    v = decide(healthy(gpu_util=35.0, mem_peak_gib=6.0, batch_frames="12000",
                       largest_batch_frames=12000))
    assert v.kind == HOST
    assert any("GPU utilisation 35 %" in e for e in v.evidence)
    raise_it = next(a for a in v.advice if a.startswith("--batch-frames"))
    assert int(raise_it.split()[1]) == 48000  # x4 at most, in whole thousands


def test_eager_step_on_cuda_with_compile_off_is_told_to_compile_first():
    v = decide(healthy(gpu_util=40.0, step_mode="eager", compile_setting="off",
                       graphs_setting="off"))
    assert v.kind == HOST
    assert v.advice[0] == "eager step on CUDA: compile is off: --compile"
    assert "--set train.cuda_graphs=auto (one launch per step)" in v.advice


def test_without_nvml_a_busy_host_is_named_but_not_called_launch_bound():
    # once CUDA's launch queue is full the host waits inside launches of a GPU-bound step
    # too: host time close to the step time does not prove launch-bound
    v = decide(healthy(gpu_util=None, host_s=0.095, step_mode="compiled"))
    assert v.kind == COMPUTE and v.advice[0].startswith("pip install nvidia-ml-py")
    assert any("cannot be ruled out" in e for e in v.evidence)
    ahead = decide(healthy(gpu_util=None, host_s=0.01))
    assert ahead.kind == COMPUTE and not any("nvidia-ml-py" in a for a in ahead.advice)


def test_launch_bound_always_has_something_to_try():
    v = decide(healthy(gpu_util=40.0, mem_peak_gib=60.0, step_mode="graphed", preset="base"))
    assert v.kind == HOST and v.advice and "other" in v.advice[0]


def test_a_bigger_batch_is_always_bigger_than_now():
    v = decide(healthy(gpu_util=40.0, mem_peak_gib=5.0, batch_frames="20000",
                       largest_batch_frames=4000))
    raise_it = next(a for a in v.advice if a.startswith("--batch-frames"))
    assert int(raise_it.split()[1]) >= 40000


def test_recompiles_in_the_window_are_flagged():
    v = decide(healthy(recompiles=2))
    assert any("2 graph(s) compiled during the window" in e for e in v.evidence)


def test_capped_auto_batches_are_told_to_lift_the_cap():
    v = decide(healthy(gpu_util=50.0, mem_peak_gib=10.0, batch_capped=True))
    assert v.kind == HOST and any(a.startswith("--batch-size 128") for a in v.advice)


def test_a_cpu_run_is_never_launch_bound():
    v = decide(healthy(device="cpu", gpu_util=None, host_s=0.1, copy_s=None, mfu=None,
                       mem_total_gib=24.0, mem_peak_gib=2.0, step_mode="eager"))
    assert v.kind == COMPUTE and v.advice[0] == "training on a CPU: on a GPU, --device cuda"


# --------------------------------------------------------------- every advice is real
def _variants() -> list[Figures]:
    out = []
    for device, mode, compile_, graphs, blocker, precision, bf, capped, workers, fly in (
            itertools.product(["cuda", "cpu"], ["eager", "compiled", "graphed"], ["auto", "off"],
                              ["auto", "off"], [None, "train.precision is fp16 (x)"],
                              ["bf16", "fp16", "fp32"], ["auto", "12000"], [False, True],
                              [0, 2], [False, True])):
        common = dict(device=device, step_mode=mode, compile_setting=compile_, graphs_setting=graphs,
                      graphs_blocker=blocker, precision=precision, batch_frames=bf,
                      batch_capped=capped, num_workers=workers, on_the_fly=fly,
                      preset="small", auto_batch_memory_share=0.9, padding_efficiency=0.7)
        out += [healthy(**common),
                healthy(**common, data_wait_s=0.05),
                healthy(**common, copy_s=0.2),
                healthy(**common, mem_peak_gib=79.0, alloc_retries=1),
                healthy(**common, gpu_util=None, host_s=0.099),
                healthy(**common, gpu_util=20.0, mem_peak_gib=5.0)]
    return out


def _commands(advice: str) -> list[list[str]]:
    """The myxtts command lines an advice names: each backticked `myxtts ...` command, and
    the bare flags (with their values) as flags of `myxtts train DATA`."""
    commands, bare = [], advice
    for quoted in re.findall(r"`([^`]*)`", advice):
        bare = bare.replace(f"`{quoted}`", "")
        if quoted.startswith("myxtts "):
            commands.append(shlex.split(quoted)[1:])
    flags = []
    for flag, value in re.findall(r"(--[a-z][a-z-]*)(?:[ =]([^\s,()]+))?", bare):
        flags += [flag] + ([value] if value and not value.startswith("--") else [])
    if flags:
        commands.append(["train", "DATA", *flags])
    return commands


def test_every_advice_names_a_flag_or_key_that_exists():
    parser = build_parser()
    seen: set[str] = set()
    for f in _variants():
        for advice in decide(f).advice:
            seen.add(advice)
    assert len(seen) > 15
    checked = 0
    for advice in sorted(seen):
        for argv in _commands(advice):
            try:
                args = parser.parse_args(argv)
            except SystemExit:
                pytest.fail(f"advice names a flag myxtts does not take: {advice!r} -> {argv}")
            if argv[0] == "train":
                config_from_args(args, base_overrides=run_overrides(args))  # unknown keys raise
            checked += 1
    assert checked >= 15
    # advice that is no myxtts command is the exception, and one of these
    prose = {"nothing to fix in the pipeline: the arithmetic is the limit",
             "pip install nvidia-ml-py, then profile again (GPU utilisation tells launch-bound "
             "from compute-bound)"}
    assert {a for a in seen if not _commands(a)} <= prose


def test_the_flag_checker_catches_a_made_up_flag():
    with pytest.raises(SystemExit):
        build_parser().parse_args(_commands("--turbo 3")[0])
