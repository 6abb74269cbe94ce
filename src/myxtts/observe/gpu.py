"""GPU readings through NVML: utilisation sampled while work runs, and a snapshot of every
visible GPU (what ``myxtts monitor`` and ``myxtts doctor`` show).

NVML's "utilisation" is the share of a sample period during which at least one kernel
ran on the GPU: the number users see in ``nvidia-smi`` and the first sign of a starving
GPU. It is read by a background thread (``period_s``), so the training thread never
waits for it. NVML comes from ``nvidia-ml-py`` (imported as ``pynvml``), an optional
dependency (``pip install "myxtts[gpu]"``): without it, or without a GPU, the sampler
reports itself unavailable and every reading is None, so callers need no ``if``;
:func:`load_nvml` says in one line which of the two is missing.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from typing import Any

import torch

NVML_MISSING = "NVML is not available: pip install nvidia-ml-py (or \"myxtts[gpu]\")"


def load_nvml() -> tuple[Any, str | None]:
    """``(pynvml, None)`` with NVML initialised, or ``(None, why)``: a one-line reason that
    names what is missing (the package, or a driver/GPU)."""
    try:
        import pynvml  # optional: the gpu extra (nvidia-ml-py)
    except ImportError:
        return None, NVML_MISSING
    try:
        pynvml.nvmlInit()
    except Exception as e:  # no driver, no GPU, a container without the NVML library
        return None, f"NVML found no NVIDIA driver or GPU ({type(e).__name__}: {e})"
    return pynvml, None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class GpuReading:
    """One GPU at one moment. A field NVML cannot read on this GPU is None."""

    index: int
    name: str
    util_pct: float | None
    mem_used_gib: float | None
    mem_total_gib: float | None
    power_w: float | None
    sm_clock_mhz: float | None
    temp_c: float | None
    pcie_rx_mbs: float | None  # MB/s into the GPU (host -> device)
    pcie_tx_mbs: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _try(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:  # a counter this GPU or driver does not expose
        return None


def read_gpu(nvml: Any, index: int) -> GpuReading:
    """Every field of :class:`GpuReading` for NVML device ``index``."""
    h = nvml.nvmlDeviceGetHandleByIndex(index)
    util = _try(nvml.nvmlDeviceGetUtilizationRates, h)
    mem = _try(nvml.nvmlDeviceGetMemoryInfo, h)
    power = _try(nvml.nvmlDeviceGetPowerUsage, h)  # milliwatts
    clock = _try(nvml.nvmlDeviceGetClockInfo, h, getattr(nvml, "NVML_CLOCK_SM", 1))
    temp = _try(nvml.nvmlDeviceGetTemperature, h, getattr(nvml, "NVML_TEMPERATURE_GPU", 0))
    rx = _try(nvml.nvmlDeviceGetPcieThroughput, h, getattr(nvml, "NVML_PCIE_UTIL_RX_BYTES", 1))
    tx = _try(nvml.nvmlDeviceGetPcieThroughput, h, getattr(nvml, "NVML_PCIE_UTIL_TX_BYTES", 0))
    return GpuReading(
        index=index, name=_text(_try(nvml.nvmlDeviceGetName, h) or f"GPU {index}"),
        util_pct=None if util is None else float(util.gpu),
        mem_used_gib=None if mem is None else mem.used / 2**30,
        mem_total_gib=None if mem is None else mem.total / 2**30,
        power_w=None if power is None else power / 1e3,
        sm_clock_mhz=None if clock is None else float(clock),
        temp_c=None if temp is None else float(temp),
        pcie_rx_mbs=None if rx is None else rx / 1e3,  # NVML reports KB/s
        pcie_tx_mbs=None if tx is None else tx / 1e3)


def read_gpus(nvml: Any) -> list[GpuReading]:
    """A reading of every GPU NVML sees (all of the machine's, not only CUDA_VISIBLE_DEVICES)."""
    return [read_gpu(nvml, i) for i in range(int(nvml.nvmlDeviceGetCount()))]


def driver_version(nvml: Any) -> str | None:
    return _try(lambda: _text(nvml.nvmlSystemGetDriverVersion()))


def _nvml_handle(device: torch.device) -> tuple[Any, Any] | None:
    """``(pynvml module, handle)`` of ``device``, or None when NVML cannot be used."""
    pynvml, _ = load_nvml()
    if pynvml is None:
        return None
    try:
        props = torch.cuda.get_device_properties(device)
        try:  # CUDA_VISIBLE_DEVICES may renumber devices: match by UUID where torch has it
            return pynvml, pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{props.uuid}")
        except Exception:
            return pynvml, pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
    except Exception:  # no pynvml, no driver, no CUDA device
        return None


class GpuUtilSampler:
    """Mean NVML GPU utilisation (%) between ``start()`` and ``stop()``.

    The first sample is taken at ``start`` so even a window shorter than one period gets
    a value. ``stop()`` returns None when NVML is unavailable.
    """

    def __init__(self, device: torch.device | str, period_s: float = 0.05) -> None:
        self.device = torch.device(device)
        self.period_s = float(period_s)
        found = _nvml_handle(self.device) if self.device.type == "cuda" else None
        self._nvml, self._handle = found if found is not None else (None, None)
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return self._handle is not None

    def read(self) -> float:
        """One utilisation reading now (%); only when ``available``."""
        return float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)

    def _run(self) -> None:
        while True:
            try:
                self.samples.append(self.read())
            except Exception:  # NVML went away (driver reset, GPU lost): stop sampling quietly
                self.samples = []
                return
            if self._stop.wait(self.period_s):
                return

    def start(self) -> None:
        if not self.available:
            return
        self.samples, self._stop = [], threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-util", daemon=True)
        self._thread.start()

    def stop(self) -> float | None:
        if self._thread is None:
            return None
        self._stop.set()
        self._thread.join()
        self._thread = None
        return sum(self.samples) / len(self.samples) if self.samples else None
