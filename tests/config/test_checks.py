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


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without CUDA")
def test_cuda_without_cuda_names_the_key_and_the_fix():
    with pytest.raises(ConfigError, match=r"data.data_device='cuda:0' but no CUDA GPU.*--set data.data_device=cpu"):
        resolve_device("cuda:0", "data.data_device")
    with pytest.raises(ConfigError, match="--device cpu"):  # a CLI flag, not a config key
        resolve_device("cuda", "--device")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_gpu_that_does_not_exist_is_named():
    n = torch.cuda.device_count()
    with pytest.raises(ConfigError, match=f"only {n} CUDA GPU"):
        resolve_device(f"cuda:{n}", "train.device")
