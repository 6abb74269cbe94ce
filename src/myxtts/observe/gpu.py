"""GPU utilisation sampled through NVML while work runs.

NVML's "utilisation" is the share of a sample period during which at least one kernel
ran on the GPU: the number users see in ``nvidia-smi`` and the first sign of a starving
GPU. It is read by a background thread (``period_s``), so the training thread never
waits for it. NVML comes from ``nvidia-ml-py`` (imported as ``pynvml``), an optional
dependency: without it, or without a GPU, the sampler reports itself unavailable and
every reading is None, so callers need no ``if``.
"""

from __future__ import annotations

import threading
from typing import Any

import torch


def _nvml_handle(device: torch.device) -> tuple[Any, Any] | None:
    """``(pynvml module, handle)`` of ``device``, or None when NVML cannot be used."""
    try:
        import pynvml

        pynvml.nvmlInit()
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
            self.samples.append(self.read())
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
