"""``myxtts doctor``'s environment checks: Python, torch, the GPUs, bf16/TF32, NCCL,
``torch.compile`` and the optional packages.

Every check is a function of plain facts passed in (:class:`TorchFacts`, an importer, the
compile probe), so tests drive each branch without the hardware; :func:`probe_torch`
gathers the real facts. torch is imported inside the functions that need it, so a broken
install is reported, not a traceback.
"""

from __future__ import annotations

import importlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from myxtts.diagnose.doctor.check import Check
from myxtts.system import ALLOC_CONF_KEYS, EXPANDABLE_SEGMENTS

MIN_PYTHON = (3, 10)
MIN_TORCH = (2, 4)
TORCH_INSTALL = "a CUDA build of torch (https://pytorch.org/get-started/locally/)"


@dataclass(frozen=True)
class GpuFacts:
    """One visible CUDA device, as torch sees it."""

    index: int
    name: str
    total_gib: float
    capability: tuple[int, int]

    @property
    def bf16(self) -> bool:
        """Native bf16 and TF32: compute capability 8.0 (Ampere) or newer."""
        return self.capability >= (8, 0)


@dataclass(frozen=True)
class TorchFacts:
    """What the GPU checks need to know about torch and the machine (:func:`probe_torch`).

    ``auto_dtype``: what ``train.precision=auto`` picks on GPU 0 (bf16 where it is native,
    else fp16: ``train.engine.mode.resolve_precision``), None without a GPU."""

    version: str
    cuda: str | None  # torch.version.cuda; None = CPU-only build
    gpus: tuple[GpuFacts, ...] = ()
    nccl: bool = False
    driver: str | None = None
    nvml_note: str | None = None  # why the driver version is unknown
    auto_dtype: str | None = None


def probe_torch() -> TorchFacts:
    """The real :class:`TorchFacts` of this process (imports torch; reads NVML if present)."""
    import torch  # deferred: a broken torch is a check, not a traceback (module doc)

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gpus = []
    for i in range(n):
        p = torch.cuda.get_device_properties(i)
        gpus.append(GpuFacts(i, p.name, p.total_memory / 2**30, (p.major, p.minor)))
    nccl = bool(torch.distributed.is_available() and torch.distributed.is_nccl_available())
    driver = note = None
    if n or torch.version.cuda:
        from myxtts.observe.gpu import driver_version, load_nvml  # deferred: torch

        nvml, note = load_nvml()
        driver = driver_version(nvml) if nvml is not None else None
    auto = None
    if n:
        from myxtts.train.engine import resolve_precision  # deferred: torch

        auto = "bf16" if resolve_precision("auto", torch.device("cuda", 0)) == torch.bfloat16 else "fp16"
    return TorchFacts(torch.__version__, torch.version.cuda, tuple(gpus), nccl, driver, note, auto)


def _version_tuple(text: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def check_python(version: tuple[int, ...]) -> Check:
    """Python >= 3.10."""
    text = ".".join(str(v) for v in version[:3])
    if tuple(version[:2]) < MIN_PYTHON:
        return Check("python", "fail", f"{text} (myxtts needs >= 3.10)",
                     "install Python 3.10 or newer and reinstall myxtts into it")
    return Check("python", "ok", text)


def check_torch(facts: TorchFacts) -> Check:
    """torch >= 2.4, and whether it is a CPU-only build."""
    build = "CPU-only build" if facts.cuda is None else f"CUDA {facts.cuda} build"
    found = f"{facts.version} ({build})"
    if _version_tuple(facts.version) < MIN_TORCH:
        return Check("torch", "fail", f"{found}; myxtts needs >= 2.4",
                     "pip install --upgrade 'torch>=2.4' (" + TORCH_INSTALL + ")")
    return Check("torch", "ok", found)


def training_device(setting: str, n_gpus: int) -> str:
    """The device ``train.device`` trains on with ``n_gpus`` visible (``cpu`` or
    ``cuda:N``), as the trainer resolves it; an impossible setting is a ValueError."""
    if setting == "auto":
        return "cuda:0" if n_gpus else "cpu"
    if setting == "cpu":
        return "cpu"
    m = re.fullmatch(r"cuda(?::(\d+))?", setting)
    if not m:
        raise ValueError(f"train.device={setting!r} is not a device; use auto, cpu, cuda or cuda:N")
    index = int(m.group(1) or 0)
    if index >= n_gpus:
        raise ValueError(f"train.device={setting!r} but {n_gpus} CUDA GPU(s) are visible")
    return f"cuda:{index}"


def check_gpus(facts: TorchFacts, device_setting: str, env: dict[str, str] | None = None
               ) -> list[Check]:
    """CUDA version, driver, every visible GPU. No GPU is a warning (CPU training works),
    a fail when ``train.device`` asks for CUDA; so is a device index that does not exist."""
    env = {} if env is None else env
    driver = facts.driver or (f"unknown ({facts.nvml_note})" if facts.nvml_note else "unknown")
    if not facts.gpus:
        if facts.cuda is None:
            found = f"none: torch {facts.version} is a CPU-only build"
            fix = f"install {TORCH_INSTALL}"
        else:
            visible = env.get("CUDA_VISIBLE_DEVICES")
            found = (f"none visible (torch CUDA {facts.cuda}, driver {driver}"
                     + (f", CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else "") + ")")
            fix = "check `nvidia-smi` and CUDA_VISIBLE_DEVICES"
        if device_setting.startswith("cuda"):
            return [Check("GPU", "fail", f"{found}; train.device={device_setting} needs one",
                          f"{fix}, or train on the CPU: --set train.device=cpu")]
        return [Check("GPU", "warn", f"{found}; training runs on the CPU (slowly)", fix)]
    out = [Check("CUDA", "ok", f"torch CUDA {facts.cuda}, driver {driver}")]
    out += [Check(f"GPU {g.index}", "ok", f"{g.name}, {g.total_gib:.1f} GiB, compute capability "
                                          f"{g.capability[0]}.{g.capability[1]}")
            for g in facts.gpus]
    try:
        training_device(device_setting, len(facts.gpus))
    except ValueError as e:
        out.append(Check("train.device", "fail", str(e),
                         f"--set train.device=auto (or cuda:0..cuda:{len(facts.gpus) - 1}, cpu)"))
    return out


def check_precision(facts: TorchFacts, precision: str) -> Check:
    """bf16 and TF32 need compute capability >= 8.0; without them, what ``train.precision``
    does instead. Skipped without a GPU."""
    if not facts.gpus:
        return Check("bf16/TF32", "skip", "no GPU")
    lacking = [g for g in facts.gpus if not g.bf16]
    if not lacking:
        caps = sorted({f"{g.capability[0]}.{g.capability[1]}" for g in facts.gpus})
        return Check("bf16/TF32", "ok", f"supported on every GPU (compute capability "
                                        f"{', '.join(caps)})")
    which = ", ".join(f"GPU {g.index} ({g.name}, compute capability {g.capability[0]}."
                      f"{g.capability[1]})" for g in lacking)
    found = f"{which}: no native bf16 or TF32"
    if precision in ("fp16", "fp32"):
        return Check("bf16/TF32", "ok", f"{found}; train.precision={precision} does not need them")
    if precision == "auto" and facts.auto_dtype == "fp16":
        return Check("bf16/TF32", "warn", f"{found}; fp16 with a loss scaler will be used "
                                          f"(train.precision=auto)",
                     "nothing to change to train; bf16 and TF32 need a GPU of compute "
                     "capability >= 8.0 (Ampere or newer)")
    return Check("bf16/TF32", "warn", f"{found}; train.precision={precision} runs bf16 emulated "
                                      f"(slow)",
                 "--set train.precision=fp16 (fp16 with a loss scaler)")


def check_nccl(facts: TorchFacts) -> Check:
    """NCCL with several GPUs. Its absence is a warning, not a fail: single-GPU training
    (the default without torchrun) is unaffected; only multi-GPU runs need it."""
    if len(facts.gpus) < 2:
        return Check("NCCL", "skip", "one GPU or none: not needed")
    if facts.nccl:
        return Check("NCCL", "ok", f"available for multi-GPU training ({len(facts.gpus)} GPUs)")
    return Check("NCCL", "warn", f"{len(facts.gpus)} GPUs but this torch has no NCCL: multi-GPU "
                                 f"training (torchrun) cannot start; one GPU still trains",
                 f"install {TORCH_INSTALL}; Linux CUDA wheels include NCCL")


def check_allocator(facts: TorchFacts, env: dict[str, str], defaulted: bool) -> Check:
    """How torch's CUDA caching allocator is configured: expandable segments resist the
    fragmentation that hours of mixed bucket shapes, prefetched batches and validation cause
    (``defaulted``: the myxtts command set them, the user had set nothing)."""
    if not facts.gpus:
        return Check("CUDA allocator", "skip", "no GPU")
    key, value = next(((k, env[k]) for k in ALLOC_CONF_KEYS if env.get(k)), (None, None))
    if key is None:
        return Check("CUDA allocator", "warn", "torch's default segments: long runs of mixed "
                     "bucket shapes can fragment GPU memory",
                     f"run through the myxtts command (it sets PYTORCH_CUDA_ALLOC_CONF="
                     f"{EXPANDABLE_SEGMENTS} when unset) or set it yourself")
    if defaulted:
        return Check("CUDA allocator", "ok", f"expandable segments: myxtts set {key}="
                     f"{value} (it was unset; set it yourself to choose otherwise)")
    if EXPANDABLE_SEGMENTS in value.replace(" ", ""):
        return Check("CUDA allocator", "ok", f"{key}={value} (yours)")
    return Check("CUDA allocator", "warn", f"{key}={value} (yours, without expandable segments): "
                 f"long runs of mixed bucket shapes can fragment GPU memory",
                 f"add {EXPANDABLE_SEGMENTS} to {key}")


def compile_probe(device: str) -> float:
    """Compile a tiny function with ``torch.compile`` on ``device``, run it, check it
    against eager; returns the seconds of compile + first run. Raises on any failure."""
    import torch  # deferred: a broken torch is a check, not a traceback (module doc)

    def fn(x: Any) -> Any:
        return torch.sin(x) * 2 + x

    x = torch.linspace(-3.0, 3.0, 64, device=device)
    start = time.perf_counter()
    out = torch.compile(fn, dynamic=False)(x)
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    if not torch.allclose(out, fn(x), rtol=1e-5, atol=1e-5):
        raise RuntimeError(f"compiled result differs from eager (max difference "
                           f"{float((out - fn(x)).abs().max()):.3g})")
    return seconds


def check_compile(device: str, mode: str, probe: Callable[[str], float]) -> Check:
    """Whether ``torch.compile`` works on the training device (``probe``: :func:`compile_probe`)."""
    if mode == "off":
        return Check("torch.compile", "skip", "train.compile=off: training runs eagerly")
    try:
        seconds = probe(device)
    except Exception as e:  # noqa: BLE001 - any compiler failure is the finding
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        fix = "--set train.compile=off trains eagerly"
        if device == "cpu":
            fix += "; on CPU inductor needs a C++ compiler: install gcc/g++"
        return Check("torch.compile", "warn", f"fails on {device}: {type(e).__name__}: {first}",
                     fix)
    note = " (train.compile=auto trains eagerly on CPU)" if mode == "auto" and device == "cpu" else ""
    return Check("torch.compile", "ok", f"works on {device}: compiled and ran a test function in "
                                        f"{seconds:.1f} s{note}")


def _import_error(importer: Callable[[str], Any], name: str) -> tuple[Any, str | None]:
    try:
        return importer(name), None
    except (ImportError, OSError) as e:  # soundfile raises OSError without libsndfile
        return None, f"{type(e).__name__}: {e}"


def check_packages(n_gpus: int, tensorboard: bool,
                   importer: Callable[[str], Any] = importlib.import_module,
                   nvml_note: str | None = None) -> list[Check]:
    """soundfile and soxr (required), tensorboard (for ``train.tensorboard``), NVML (GPU
    utilisation, only with a GPU; ``nvml_note``: why NVML failed to start, if it did)."""
    out = []
    sf, err = _import_error(importer, "soundfile")
    if sf is None:
        out.append(Check("soundfile", "fail", f"missing ({err})", "pip install soundfile"))
    else:
        out.append(Check("soundfile", "ok", f"{getattr(sf, '__version__', '?')}, libsndfile "
                                            f"{getattr(sf, '__libsndfile_version__', '?')}"))
    soxr, err = _import_error(importer, "soxr")
    out.append(Check("soxr", "ok", getattr(soxr, "__version__", "installed")) if soxr is not None
               else Check("soxr", "fail", f"missing ({err})", "pip install soxr"))
    tb, _ = _import_error(importer, "tensorboard")
    if tb is not None:
        out.append(Check("tensorboard", "ok", getattr(tb, "__version__", "installed")))
    elif not tensorboard:
        out.append(Check("tensorboard", "ok", "not installed; not used (train.tensorboard=false)"))
    else:
        out.append(Check("tensorboard", "warn", "not installed: training logs no TensorBoard "
                                                "curves", 'pip install tensorboard (or '
                                                          '"myxtts[tensorboard]")'))
    nvml, _ = _import_error(importer, "pynvml")
    if nvml is not None and n_gpus and nvml_note:
        out.append(Check("NVML", "warn", f"nvidia-ml-py installed but {nvml_note}: no GPU "
                                         f"utilisation readings",
                         "check the NVIDIA driver with `nvidia-smi` (a container needs the "
                         "driver's NVML library mounted: --gpus all)"))
    elif nvml is not None:
        out.append(Check("NVML", "ok", "nvidia-ml-py installed (GPU utilisation readings)"))
    elif n_gpus:
        out.append(Check("NVML", "warn", "nvidia-ml-py not installed: no GPU utilisation readings",
                         'pip install nvidia-ml-py (or "myxtts[gpu]")'))
    else:
        out.append(Check("NVML", "ok", "not installed; not needed without a GPU"))
    return out
