"""How much of the device a run uses: model FLOPs per step, achieved TFLOP/s, MFU and NVML
GPU utilisation, the same figures for training logs, ``myxtts profile`` and the benchmarks.

FLOPs are counted on a copy of the model on the ``meta`` device (``meta_step_counter``):
shapes only, no memory, no arithmetic, no random numbers drawn, so a count never changes
the run it describes and costs well under a second per bucket shape, once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from myxtts.config import Config
from myxtts.data.batch import BatchShape
from myxtts.model.xtts import build_model
from myxtts.observe.flops import StepFlops, achieved_tflops, count_flops, peak_tflops
from myxtts.observe.gpu import GpuUtilSampler
from myxtts.train.engine import TTSTask


def meta_step_counter(cfg: Config, n_tokens: int, n_languages: int) -> Callable[[tuple], float]:
    """``count((B, L_text, T_mel))``: forward + backward FLOPs of one training micro-batch of
    that padded shape (with the self-fed second decoder pass when ``train.self_feed`` > 0):
    the TTS model's task (``engine.TTSTask``) on its worst case, as the step runs it."""
    with torch.device("meta"):
        model = build_model(cfg, n_tokens, n_languages, None, None)
    model.train()
    task = TTSTask(cfg, n_tokens, n_languages)
    self_feed = torch.zeros((), device="meta") if cfg.train.self_feed > 0 else None

    def count(key: tuple) -> float:
        b, text, frames = key
        shape = BatchShape(int(b), int(text), int(frames), cfg.data.ref_frames, cfg.audio.n_mels)
        batch = {k: v.to("meta") for k, v in task.worst_case(shape, "cpu").items()}

        def step() -> None:
            task.losses(model, batch, self_feed)["loss"].backward()

        try:
            return count_flops(step)
        finally:
            model.zero_grad(set_to_none=True)

    return count


def resolve_peak(cfg: Config, device: torch.device, dtype: torch.dtype) -> float | None:
    """Peak TFLOP/s for MFU: ``train.peak_tflops``, else the table's figure for this GPU at
    this precision, else None (a CPU, or a GPU the table does not know)."""
    if cfg.train.peak_tflops > 0:
        return float(cfg.train.peak_tflops)
    if device.type != "cuda":
        return None
    return peak_tflops(torch.cuda.get_device_name(device), dtype)


class IntervalEfficiency:
    """GPU utilisation, TFLOP/s and MFU per log interval of the training loop.

    ``add(keys)`` after each step records its micro-batches' shape keys (tensor metadata:
    no sync); ``collect(seconds)`` at a log step returns the interval's figures and starts
    the next interval. The NVML sampler runs in a background thread. FLOPs are counted only
    where they lead somewhere: when a peak is known (MFU) or on a GPU (TFLOP/s)."""

    def __init__(self, cfg: Config, device: torch.device, dtype: torch.dtype,
                 make_counter: Callable[[], Callable[[tuple], float]],
                 sample_period_s: float = 0.2) -> None:
        """``make_counter()``: the model's FLOP counter of a micro-batch shape key (e.g.
        :func:`meta_step_counter`), built only when FLOPs are counted."""
        self.peak = resolve_peak(cfg, device, dtype)
        counting = self.peak is not None or device.type == "cuda"
        self.flops = StepFlops(make_counter()) if counting else None
        self.gpu = GpuUtilSampler(device, period_s=sample_period_s)
        self._keys: list[tuple] = []
        self.gpu.start()

    def count_ahead(self, keys: list[tuple]) -> None:
        """Count these shapes now (before step 1) rather than at the first log step."""
        if self.flops is not None:
            for k in keys:
                self.flops(k)

    def add(self, keys: list[tuple]) -> None:
        if self.flops is not None:
            self._keys.extend(keys)

    def collect(self, seconds: float) -> dict[str, float]:
        """``gpu_util`` (%), ``tflops`` and ``mfu`` (0-1) of the interval, where known."""
        out: dict[str, Any] = {}
        util = self.gpu.stop()
        if util is not None:
            out["gpu_util"] = util
            self.gpu.start()
        if self.flops is not None and self._keys:
            tflops = achieved_tflops(self.flops.total(self._keys), seconds)
            out["tflops"] = tflops
            if self.peak:
                out["mfu"] = tflops / self.peak
        self._keys = []
        return out

    def close(self) -> None:
        self.gpu.stop()
