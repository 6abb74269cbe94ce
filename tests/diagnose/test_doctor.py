"""`myxtts doctor`: every branch of every check from faked machine facts, and real runs
(this CPU machine, a healthy and a corrupted store, datasets, a missing path) through
the CLI entry point."""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import pytest

from myxtts.cli.main import main
from myxtts.config import load_config
from myxtts.diagnose.doctor import data as dd
from myxtts.diagnose.doctor import environment as env
from myxtts.diagnose.doctor.check import Check, exit_code, format_checks
from myxtts.diagnose.doctor.environment import GpuFacts, TorchFacts
from myxtts.diagnose.doctor.run import run_checks

MIB = 2**20
H100 = GpuFacts(0, "NVIDIA H100 80GB HBM3", 79.1, (9, 0))
V100 = GpuFacts(0, "Tesla V100-SXM2-32GB", 31.7, (7, 0))
CPU_TORCH = TorchFacts("2.13.0+cpu", None)


def _cuda(*gpus: GpuFacts, nccl: bool = True, auto: str = "bf16") -> TorchFacts:
    gpus = tuple(GpuFacts(i, g.name, g.total_gib, g.capability) for i, g in enumerate(gpus))
    return TorchFacts("2.5.1+cu124", "12.4", gpus, nccl, "550.54.15", None, auto)


def _fast_compile(device: str) -> float:
    return 0.25


def _importer_without(*missing: str):
    def imp(name: str):
        if name in missing:
            raise ImportError(f"No module named {name!r}")
        return importlib.import_module(name)
    return imp


def _doctor(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["doctor", *[str(a) for a in argv]])
    out, err = capsys.readouterr()
    return rc, out, err


def _line(out: str, name: str) -> str:
    return next(ln for ln in out.splitlines() if ln[2:].startswith(f"{name}:"))


@pytest.fixture
def no_compile(monkeypatch):
    """The real compile check costs seconds: every CLI run but the compile test fakes it."""
    monkeypatch.setattr(env, "compile_probe", _fast_compile)


# ---------------------------------------------------------------- versions and GPUs

def test_python_and_torch_versions():
    assert env.check_python((3, 9, 18)).status == "fail"
    assert env.check_python((3, 11, 7)) == Check("python", "ok", "3.11.7")
    old = env.check_torch(TorchFacts("2.3.1+cu121", "12.1"))
    assert old.status == "fail" and "torch>=2.4" in old.fix
    cpu = env.check_torch(CPU_TORCH)
    assert cpu.status == "ok" and "2.13.0+cpu (CPU-only build)" in cpu.found
    assert "CUDA 12.4 build" in env.check_torch(_cuda(H100)).found


def test_no_gpu_warns_unless_the_config_asks_for_cuda():
    [auto] = env.check_gpus(CPU_TORCH, "auto")
    assert auto.status == "warn" and "CPU-only build" in auto.found and "CUDA build" in auto.fix
    [asked] = env.check_gpus(CPU_TORCH, "cuda:0")
    assert asked.status == "fail" and "--set train.device=cpu" in asked.fix
    [hidden] = env.check_gpus(_cuda(), "auto", {"CUDA_VISIBLE_DEVICES": ""})
    assert hidden.status == "warn" and "CUDA_VISIBLE_DEVICES=''" in hidden.found
    assert "nvidia-smi" in hidden.fix


def test_gpus_are_listed_and_a_missing_device_index_blocks():
    checks = env.check_gpus(_cuda(H100), "auto")
    assert [c.status for c in checks] == ["ok", "ok"]
    assert "CUDA 12.4" in checks[0].found and "550.54.15" in checks[0].found
    assert "H100" in checks[1].found and "79.1 GiB" in checks[1].found and "9.0" in checks[1].found
    bad = env.check_gpus(_cuda(H100), "cuda:1")[-1]
    assert bad.name == "train.device" and bad.status == "fail" and "cuda:0" in bad.fix
    assert env.training_device("auto", 0) == "cpu"
    assert env.training_device("auto", 2) == "cuda:0"
    assert env.training_device("cuda", 1) == "cuda:0"
    with pytest.raises(ValueError, match="not a device"):
        env.training_device("tpu", 1)


def test_bf16_tf32_by_compute_capability_and_precision():
    assert env.check_precision(CPU_TORCH, "auto").status == "skip"
    assert env.check_precision(_cuda(H100), "auto").status == "ok"
    scaled = env.check_precision(_cuda(V100, auto="fp16"), "auto")
    assert scaled.status == "warn" and "fp16 with a loss scaler will be used" in scaled.found
    assert scaled.fix
    emulated = env.check_precision(_cuda(V100, auto="bf16"), "auto")
    assert emulated.status == "warn" and "--set train.precision=fp16" in emulated.fix
    assert env.check_precision(_cuda(V100), "fp16").status == "ok"


def test_nccl_only_matters_with_several_gpus():
    assert env.check_nccl(_cuda(H100, nccl=False)).status == "skip"
    assert env.check_nccl(_cuda(H100, H100)).status == "ok"
    missing = env.check_nccl(_cuda(H100, H100, nccl=False))
    assert missing.status == "warn" and "NCCL" in missing.fix and "one GPU still trains" in missing.found


def test_the_allocator_check_says_whether_segments_expand_and_who_chose():
    from myxtts.system import default_allocator_settings

    assert env.check_allocator(CPU_TORCH, {}, False).status == "skip"
    unset = env.check_allocator(_cuda(H100), {}, False)
    assert unset.status == "warn" and "expandable_segments:True" in unset.fix
    ours: dict[str, str] = {}
    assert default_allocator_settings(ours) and ours == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    said = env.check_allocator(_cuda(H100), ours, True)
    assert said.status == "ok" and "myxtts set" in said.found
    theirs = {"PYTORCH_ALLOC_CONF": "max_split_size_mb:128"}
    assert not default_allocator_settings(theirs) and len(theirs) == 1  # the user's stays
    mine = env.check_allocator(_cuda(H100), theirs, False)
    assert mine.status == "warn" and "yours" in mine.found and "expandable" in mine.fix
    good = env.check_allocator(_cuda(H100), {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,"
                                             "garbage_collection_threshold:0.6"}, False)
    assert good.status == "ok" and "yours" in good.found


def test_compile_check_branches():
    ok = env.check_compile("cpu", "auto", _fast_compile)
    assert ok.status == "ok" and "0.2 s" in ok.found and "eagerly on CPU" in ok.found

    def broken(device: str) -> float:
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found\nlong details")

    cpu = env.check_compile("cpu", "on", broken)
    assert cpu.status == "warn" and "No working C++ compiler" in cpu.found
    assert "long details" not in cpu.found
    assert "train.compile=off" in cpu.fix and "g++" in cpu.fix
    gpu = env.check_compile("cuda:0", "auto", broken)
    assert "train.compile=off" in gpu.fix and "g++" not in gpu.fix
    assert env.check_compile("cpu", "off", broken).status == "skip"  # probe never called


def test_compile_probe_really_compiles_on_this_machine():
    check = env.check_compile("cpu", "on", env.compile_probe)
    assert check.status == "ok", check


# ---------------------------------------------------------------- packages

def test_missing_packages():
    by_name = {c.name: c for c in env.check_packages(
        1, True, _importer_without("soundfile", "soxr", "tensorboard", "pynvml"))}
    assert by_name["soundfile"].status == "fail" and "pip install soundfile" in by_name["soundfile"].fix
    assert by_name["soxr"].status == "fail" and "pip install soxr" in by_name["soxr"].fix
    assert by_name["tensorboard"].status == "warn" and "tensorboard" in by_name["tensorboard"].fix
    assert by_name["NVML"].status == "warn" and "nvidia-ml-py" in by_name["NVML"].fix
    quiet = {c.name: c for c in env.check_packages(0, False, _importer_without("tensorboard",
                                                                                 "pynvml"))}
    assert quiet["tensorboard"].status == "ok" and quiet["NVML"].status == "ok"
    import soundfile

    assert soundfile.__libsndfile_version__ in quiet["soundfile"].found


# ---------------------------------------------------------------- workers and /dev/shm

def test_workers_against_cpus():
    cfg = load_config()  # data.num_workers = -1
    assert dd.resolve_workers(cfg, 16) == (2, "auto for 16 CPUs")
    assert dd.resolve_workers(cfg, 2)[0] == 0
    assert dd.resolve_workers(cfg, 8, on_the_fly=True)[0] == 7
    assert dd.resolve_workers(load_config(overrides=["data.num_workers=4"]), 16) == \
        (4, "data.num_workers=4")
    assert dd.check_workers(4, "data.num_workers=4", 16).status == "ok"
    many = dd.check_workers(8, "data.num_workers=8", 8)
    assert many.status == "warn" and many.fix == "--num-workers 2"
    assert dd.check_workers(4, "data.num_workers=4", 2).fix == "--num-workers 0"


def test_store_workers_are_weighed_against_the_batch_cost():
    cheap = (1e-3, 5_000_000)  # builds in 1 ms, a GPU run's hand-over of it ~1.2 ms
    slower = dd.check_store_workers(2, cheap)
    assert slower.status == "warn" and slower.fix.startswith("--num-workers 0")
    assert "save the training process too little" in slower.found and "1.00 ms" in slower.found
    assert dd.check_store_workers(0, cheap).status == "ok"
    assert dd.check_store_workers(2, (30e-3, 5_000_000)).status == "ok"
    assert dd.resolve_workers(load_config(), 16, batch_cost=cheap)[0] == 0
    assert dd.resolve_workers(load_config(), 16, batch_cost=(30e-3, 5_000_000))[0] == 2


def test_shm_too_small_for_four_workers():
    small = dd.check_shm(10 * MIB, 4, "estimate", workers=4, free=64 * MIB)
    assert small.status == "fail" and "160 MiB" in small.found
    assert "--num-workers 0" in small.fix and "--shm-size" in small.fix
    assert dd.check_shm(10 * MIB, 4, "estimate", workers=4, free=1024 * MIB).status == "ok"
    ranks = dd.check_shm(10 * MIB, 4, "estimate", workers=4, free=200 * MIB, ranks=2)
    assert ranks.status == "fail" and "x 2 ranks" in ranks.found
    assert dd.check_shm(10 * MIB, 4, "x", workers=0, free=0).status == "ok"
    assert dd.check_shm(10 * MIB, 4, "x", workers=2, free=None).status == "skip"
    assert dd.shm_free_bytes(Path("/no/such/dir")) is None


def test_shm_need_is_exact_with_a_store_and_an_estimate_without(micro_store):
    from myxtts.data.feed.loader import MAX_GROUP, batches_per_task, build_sampler
    from myxtts.data.feed.slots import slot_bytes, slots_per_worker
    from myxtts.data.store import FeatureStore

    cfg = load_config()
    checks, plan = dd.check_data(cfg, micro_store)
    assert [c.status for c in checks] == ["ok", "ok"] and plan.table is not None
    store = FeatureStore.open(micro_store, "train", cfg)
    table = build_sampler(store.mel_lengths, store.token_lengths, cfg).plan
    for transfer in (False, True):
        assert dd.shm_per_worker(cfg, plan, transfer) == (
            slot_bytes(table, store.n_mels, cfg.data.ref_frames, transfer=transfer),
            slots_per_worker(batches_per_task(plan.batch_cost[0])), "this store")
    est, slots, how = dd.shm_per_worker(cfg, dd.DataPlan(), transfer=False)
    assert how.startswith("estimate") and slots == slots_per_worker(MAX_GROUP)
    assert dd.shm_per_worker(cfg, dd.DataPlan(), transfer=True)[0] < est  # float16 mels
    assert dd.shm_per_worker(cfg, dd.DataPlan(on_the_fly=True), False)[2].startswith("estimate")


def test_read_speed_branches(micro_store, monkeypatch):
    fast = dd.check_read_speed(micro_store)  # a tiny file: timed, but not judged
    assert fast.status == "ok" and "MB/s" in fast.found and "too small" in fast.found
    monkeypatch.setattr(dd, "read_file", lambda path, limit: (200_000_000, 10.0))
    slow = dd.check_read_speed(micro_store)
    assert slow.status == "warn" and "20 MB/s" in slow.found and "local SSD" in slow.fix
    monkeypatch.setattr(dd, "read_file", lambda path, limit: (200_000_000, 0.5))
    assert dd.check_read_speed(micro_store).status == "ok"


def test_interrupted_store_says_resume(micro_store, tmp_path):
    store = Path(shutil.copytree(micro_store, tmp_path / "store"))
    (store / ".partial").touch()
    [check], plan = dd.check_data(load_config(), store)
    assert check.status == "fail" and "incomplete store" in check.found
    assert "resume" in check.fix and plan.table is None


# ---------------------------------------------------------------- format, exit code, run_checks

def test_format_fixes_summary_and_exit_code():
    checks = [Check("a", "ok", "fine"), Check("b", "warn", "slow", "--fix-b"),
              Check("c", "warn", "slower", "--fix-c"), Check("d", "fail", "broken", "--fix-d"),
              Check("e", "skip", "n/a")]
    text = format_checks(checks)
    assert text.splitlines() == ["✔ a: fine", "⚠ b: slow — --fix-b", "⚠ c: slower — --fix-c",
                                 "✗ d: broken — --fix-d", "- e: skipped (n/a)",
                                 "4 checks: 1 ok, 2 warnings, 1 blocking (1 skipped)"]
    assert format_checks(checks, ascii_only=True).splitlines()[3] == "[XX] d: broken - --fix-d"
    assert exit_code(checks) == 1
    assert exit_code(checks[:3]) == 0  # warnings never block


def test_a_faked_multi_gpu_machine_with_every_problem():
    cfg = load_config(overrides=["data.num_workers=4"])
    checks = run_checks(
        cfg, None, facts=_cuda(V100, V100, nccl=False, auto="fp16"), python=(3, 11, 7), cpus=4,
        shm_probe=lambda: 64 * MIB, compile_fn=_fast_compile, importer=_importer_without("soxr", "pynvml"))
    status = {c.name: c.status for c in checks}
    assert status.pop("CUDA allocator") in ("ok", "warn")  # by this shell's environment
    assert status == {"python": "ok", "torch": "ok", "CUDA": "ok", "GPU 0": "ok", "GPU 1": "ok",
                      "bf16/TF32": "warn", "NCCL": "warn", "torch.compile": "ok",
                      "soundfile": "ok", "soxr": "fail", "tensorboard": "ok", "NVML": "warn",
                      "CPUs": "warn", "/dev/shm": "fail", "GPU roles": "ok"}
    assert "torchrun --nproc_per_node=2" in next(c for c in checks if c.name == "GPU roles").found
    assert "x 2 ranks" in next(c for c in checks if c.name == "/dev/shm").found
    assert all(c.fix for c in checks if c.status in ("warn", "fail"))
    assert exit_code(checks) == 1


# ---------------------------------------------------------------- real runs through the CLI

def test_real_run_on_this_machine(capsys, no_compile):
    import torch

    rc, out, err = _doctor(capsys)
    lines = out.splitlines()
    assert torch.__version__ in _line(out, "torch")
    assert "0.2 s" in _line(out, "torch.compile")
    assert all(ln[0] in "✔⚠✗-" for ln in lines[:-1]) and " checks: " in lines[-1]
    assert all(" — " in ln for ln in lines if ln[0] in "⚠✗")
    assert rc == (1 if "✗" in out else 0) and not err


def test_healthy_store(capsys, no_compile, micro_store):
    rc, out, _ = _doctor(capsys, micro_store)
    assert _line(out, "store").startswith("✔") and "verified" in _line(out, "store")
    speed = _line(out, "store read speed")
    assert speed.startswith("✔") and "MB/s" in speed
    assert rc == (1 if "✗" in out else 0)


def test_corrupted_store_blocks(capsys, no_compile, micro_store, tmp_path):
    store = Path(shutil.copytree(micro_store, tmp_path / "store"))
    mel = store / "train" / "mel.f16"
    blob = bytearray(mel.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    mel.write_bytes(bytes(blob))
    rc, out, err = _doctor(capsys, store)
    line = _line(out, "store")
    assert line.startswith("✗") and "sha256" in line and "--force" in line
    assert rc == 1 and "Traceback" not in err


def test_datasets_usable_with_problems_and_unreadable(capsys, no_compile, tmp_path):
    from myxtts.synthetic import make_demo_data

    data = make_demo_data(tmp_path / "data", speakers=2, utterances=4)
    rc, out, _ = _doctor(capsys, data)
    line = _line(out, "dataset")
    assert line.startswith(f"✔ dataset: {data}: 8 utterances, ") and "h, 2 speakers, no problems" in line
    assert "on the fly" in _line(out, "CPUs")
    next(iter(sorted((data / "wavs").glob("*.wav")))).unlink()
    rc, out, _ = _doctor(capsys, data)
    line = _line(out, "dataset")
    assert line.startswith("⚠") and "missing audio 1" in line and "inspect-data" in line
    (tmp_path / "empty").mkdir()
    rc, out, err = _doctor(capsys, tmp_path / "empty")
    assert _line(out, "dataset").startswith("✗") and rc == 1 and "Traceback" not in err


def test_missing_path_and_bad_config(capsys, no_compile, tmp_path):
    rc, out, err = _doctor(capsys, tmp_path / "nope")
    assert rc == 1 and _line(out, "data").startswith("✗") and "does not exist" in out
    assert "Traceback" not in err
    rc, out, err = _doctor(capsys, "--set", "data.no_such_key=1")
    assert rc == 2 and err.count("\n") == 1 and "no_such_key" in err


def test_nvml_that_cannot_start_with_a_gpu_warns():
    fake = lambda name: object()  # noqa: E731 - every package importable
    checks = env.check_packages(1, True, fake, nvml_note="NVML found no NVIDIA driver")
    nvml = next(c for c in checks if c.name == "NVML")
    assert nvml.status == "warn" and "no NVIDIA driver" in nvml.found and "nvidia-smi" in nvml.fix
    ok = next(c for c in env.check_packages(1, True, fake) if c.name == "NVML")
    assert ok.status == "ok"


def test_a_torch_that_cannot_import_is_a_blocking_line(monkeypatch):
    def broken():
        raise OSError("libcudart.so.12: cannot open shared object file")

    monkeypatch.setattr(env, "probe_torch", broken)
    checks = run_checks(load_config())
    assert [c.name for c in checks] == ["python", "torch"]
    assert checks[1].status == "fail" and "libcudart" in checks[1].found
    assert exit_code(checks) == 1


def test_an_unreadable_store_file_is_a_failed_check(micro_store, tmp_path, monkeypatch):
    store = tmp_path / "store"
    shutil.copytree(micro_store, store)

    def unreadable(*a, **k):
        raise PermissionError(13, "Permission denied", str(store / "train"))

    monkeypatch.setattr(dd, "check_store", unreadable)
    checks, _ = dd.check_data(load_config(), store)
    assert len(checks) == 1 and checks[0].status == "fail"
    assert "PermissionError" in checks[0].found and "prepare --verify" in checks[0].fix


# ---------------------------------------------------------------- which multi-GPU mode


@pytest.mark.parametrize("gpus, sets, status, words", [
    (2, ["data.data_device=cpu"], "warn", ["myxtts prepare", "--data-device cuda:1"]),
    (1, ["data.data_device=cpu"], "ok", ["--data-device cuda:0"]),
    (2, ["data.data_device=cuda:1"], "ok", ["its own GPU", "3 slots"]),
    (1, ["data.data_device=cuda:0"], "ok", ["a second stream of the training GPU"]),
    (1, ["data.data_device=cuda:3"], "fail", ["1 GPU(s) are visible"]),
    (1, ["data.data_device=cuda:0", "train.device_memory_cap=0.8",
         "data.data_device_memory_cap=0.3"],
     "fail", ["1.1 > 1.0"]),
])
def test_the_doctor_says_which_gpu_mode_fits_raw_audio(gpus, sets, status, words):
    from myxtts.diagnose.doctor.data import DataPlan, check_roles

    checks = check_roles(load_config(overrides=sets), DataPlan(on_the_fly=True), gpus, "cuda:0")
    assert [c.status for c in checks] == [status]
    text = checks[0].found + " " + checks[0].fix
    assert all(w in text for w in words), text
    assert checks[0].fix or status == "ok"
