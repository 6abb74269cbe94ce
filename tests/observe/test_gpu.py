"""NVML sampling: a background thread averages readings; without NVML it reports nothing."""

from __future__ import annotations

import itertools
import time
from types import SimpleNamespace

import pytest
import torch

from myxtts.observe.gpu import GpuUtilSampler


def test_without_a_gpu_every_reading_is_none():
    sampler = GpuUtilSampler("cpu")
    assert not sampler.available
    sampler.start()
    assert sampler.stop() is None


def test_samples_are_averaged_over_the_window():
    readings = itertools.chain([10.0, 30.0, 50.0], itertools.repeat(50.0))  # never runs dry
    fake_nvml = SimpleNamespace(
        nvmlDeviceGetUtilizationRates=lambda handle: SimpleNamespace(gpu=next(readings)))
    sampler = GpuUtilSampler("cpu", period_s=0.001)
    sampler._nvml, sampler._handle = fake_nvml, object()  # as if NVML had found the device
    assert sampler.available
    sampler.start()
    deadline = time.monotonic() + 5
    while len(sampler.samples) < 3 and time.monotonic() < deadline:
        time.sleep(0.005)
    mean = sampler.stop()
    n = len(sampler.samples)
    assert n >= 3 and mean == sum(sampler.samples) / n
    assert sampler.samples[:3] == [10.0, 30.0, 50.0]
    assert sampler.stop() is None  # stopped already: nothing new


@pytest.mark.gpu
def test_a_real_gpu_reads_a_percentage():
    sampler = GpuUtilSampler(torch.device("cuda", 0))
    if not sampler.available:
        pytest.skip("NVML (nvidia-ml-py) is not installed")
    sampler.start()
    time.sleep(0.1)
    assert 0.0 <= sampler.stop() <= 100.0
