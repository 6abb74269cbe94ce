"""Config checks: impossible values are refused naming the key; devices resolve or explain."""

import pytest
import torch

from myxtts.config import ConfigError, load_config, resolve_device


@pytest.mark.parametrize("sigma", [0.05, 0.7])
def test_guided_sigma_outside_the_exact_range_is_refused(sigma):
    with pytest.raises(ConfigError, match=rf"train.guided_attn_sigma must be in \[0.1, 0.6\].*{sigma}"):
        load_config(overrides=[f"train.guided_attn_sigma={sigma}"])
    assert load_config(overrides=["train.guided_attn_sigma=0.6"]).train.guided_attn_sigma == 0.6


def test_devices_resolve():
    assert resolve_device("cpu", "train.device") == torch.device("cpu")
    auto = resolve_device("auto", "train.device")
    assert auto.type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ConfigError, match="train.device='gpu0' is not a device"):
        resolve_device("gpu0", "train.device")


def test_a_cuda_device_always_carries_its_index(monkeypatch):
    """``torch.cuda.set_device`` (training setup) rejects an index-less ``cuda``: auto and
    ``cuda`` resolve to the current GPU. Simulated, so it runs without a GPU as well."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert resolve_device("auto", "train.device") == torch.device("cuda", 1)
    assert resolve_device("cuda", "train.device") == torch.device("cuda", 1)
    assert resolve_device("cuda:0", "train.device") == torch.device("cuda", 0)
    assert resolve_device("cpu", "train.device") == torch.device("cpu")


@pytest.mark.gpu
def test_the_resolved_gpu_is_accepted_by_set_device():
    device = resolve_device("auto", "train.device")
    torch.cuda.set_device(device)  # raised "Expected a torch.device with a specified index" before
    assert device.index == torch.cuda.current_device()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without CUDA")
def test_cuda_without_cuda_names_the_key_and_the_fix():
    with pytest.raises(ConfigError, match=r"data.data_device='cuda:0' but no CUDA GPU.*--set data.data_device=cpu"):
        resolve_device("cuda:0", "data.data_device")
    with pytest.raises(ConfigError, match="--device cpu"):  # a CLI flag, not a config key
        resolve_device("cuda", "--device")


@pytest.mark.gpu
def test_a_gpu_that_does_not_exist_is_named():
    n = torch.cuda.device_count()
    with pytest.raises(ConfigError, match=f"only {n} CUDA GPU"):
        resolve_device(f"cuda:{n}", "train.device")


def test_batch_frames_is_a_positive_integer_or_auto():
    assert load_config().data.batch_frames == "auto"
    assert load_config(overrides=["data.batch_frames=24000"]).data.batch_frames == 24000
    with pytest.raises(ConfigError, match=r"data.batch_frames: expected an integer or one of "
                                          r"'auto', got str 'lots'"):
        load_config(overrides=["data.batch_frames=lots"])
    with pytest.raises(ConfigError, match="data.batch_frames must be > 0, got 0"):
        load_config(overrides=["data.batch_frames=0"])
    for bad in (0, 1.5):
        with pytest.raises(ConfigError, match=rf"data.auto_batch_memory_share .* got {bad}"):
            load_config(overrides=[f"data.auto_batch_memory_share={bad}"])


def test_cuda_graphs_resolve_per_device_and_explain_when_forced():
    from myxtts.train.engine.mode import resolve_graphs

    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert resolve_graphs("auto", cuda, torch.bfloat16, False, True)
    assert not resolve_graphs("off", cuda, torch.bfloat16, False, True)
    for args, why in (((cpu, torch.float32, False, True), "training runs on cpu"),
                      ((cuda, torch.bfloat16, True, True), "several processes"),
                      ((cuda, torch.float16, False, True), "fp16"),
                      ((cuda, torch.float32, False, False), "fused AdamW")):
        assert not resolve_graphs("auto", *args)
        with pytest.raises(ConfigError, match=f"train.cuda_graphs=on but .*{why}"):
            resolve_graphs("on", *args)


@pytest.mark.parametrize("override, key", [
    ("train.lr=nan", "train.lr"), ("audio.fmax=inf", "audio.fmax"),
    ("train.grad_clip=-inf", "train.grad_clip"),
    ("data.data_device_memory_cap=.nan", "data.data_device_memory_cap"),
    ("vocoder.mel_weight=.inf", "vocoder.mel_weight"),
])
def test_non_finite_numbers_are_refused_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=rf"^{key} must be a finite number, got"):
        load_config(overrides=[override])
