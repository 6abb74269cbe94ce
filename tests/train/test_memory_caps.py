"""Memory caps per GPU role: which combinations are refused (one line naming the key), what
each device's process cap becomes, and the auto batch budget planning within the training
share. The caps themselves are CUDA calls: tests marked ``gpu`` check them on a GPU."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from myxtts.config import ConfigError
from myxtts.train.distributed import DistInfo
from myxtts.train.engine.budget import auto_batch_sizes
from myxtts.train.errors import TrainError
from myxtts.train.memory import MemoryCaps, check_feature_memory, resolve_caps
from tests.helpers import MICRO_MODEL, micro_config
from tests.train.test_budget import SHAPES, FakeMemory
from tests.train.test_graphs import N_MELS, engine_for

CPU, GPU0, GPU1 = torch.device("cpu"), torch.device("cuda", 0), torch.device("cuda", 1)


def caps(train: float, data: float, train_device=GPU0, data_device=None) -> MemoryCaps:
    cfg = micro_config(".", f"train.device_memory_cap={train}",
                       f"data.data_device_memory_cap={data}")
    return resolve_caps(cfg, train_device, data_device)


def test_two_gpus_get_one_cap_each_and_a_shared_gpu_gets_the_sum():
    two = caps(0.9, 0.3, GPU0, GPU1)
    assert two.per_device() == {GPU0: 0.9, GPU1: 0.3} and two.training_share() == 0.9
    one = caps(0.7, 0.2, GPU0, GPU0)
    assert one.shared and one.per_device() == {GPU0: pytest.approx(0.9)}
    assert one.training_share() == 0.7  # training plans within its own share
    assert caps(0.0, 0.0, GPU0, GPU1).per_device() == {} and caps(0, 0).training_share() == 1.0
    assert caps(0.0, 0.4, GPU0, GPU1).per_device() == {GPU1: 0.4}  # only the data GPU capped


@pytest.mark.parametrize("train, data, train_device, data_device, message", [
    (0.5, 0.0, CPU, None, r"train.device_memory_cap=0.5 caps a GPU's memory, but training runs "
                          r"on cpu"),
    (0.0, 0.3, GPU0, None, r"data.data_device_memory_cap=0.3 .* reads a prepared store"),
    (0.0, 0.3, GPU0, CPU, r"data.data_device_memory_cap=0.3 .* data.data_device is cpu"),
    (0.7, 0.4, GPU0, GPU0, r"0.7 \+ data.data_device_memory_cap=0.4 = 1.1 > 1.0 on cuda:0"),
    (0.0, 0.2, GPU0, GPU0, r"data.data_device_memory_cap=0.2 on the training GPU .* needs "
                           r"train.device_memory_cap too"),
])
def test_impossible_caps_are_one_line_errors(train, data, train_device, data_device, message):
    with pytest.raises(ConfigError, match=message) as err:
        caps(train, data, train_device, data_device)
    assert "\n" not in str(err.value)


def test_a_share_outside_0_1_is_a_config_error():
    with pytest.raises(ConfigError, match=r"train.device_memory_cap is a share .* got 1.5"):
        micro_config(".", "train.device_memory_cap=1.5")
    with pytest.raises(ConfigError, match=r"data.ring_slots must be >= 2"):
        micro_config(".", "data.ring_slots=1")


class BigPeak(FakeMemory):
    """Every size peaks at 11 GiB of a 24 GiB GPU: within 85 % of it, not within 85 % of half."""

    def peak(self) -> int:
        return 11 * 2**30


def test_the_auto_budget_plans_within_the_training_share(tmp_path, one_thread):
    uncapped = micro_config(tmp_path / "a", f"audio.n_mels={N_MELS}")
    step = engine_for(uncapped)
    sizes = auto_batch_sizes(step, SHAPES, [4, 4, 4], uncapped, tmp_path / "a",
                             step.task.worst_case, DistInfo(), memory=BigPeak(),
                             echo=lambda s: None)
    assert all(s >= 1 for s in sizes)
    capped = micro_config(tmp_path / "b", f"audio.n_mels={N_MELS}", "train.device_memory_cap=0.5")
    with pytest.raises(TrainError, match=r"not even one utterance fits in 10.2 GiB \(42% of Fake "
                                         r"GPU 24GB, 24.0 GiB, capped at "
                                         r"train.device_memory_cap=0.5\)"):
        step = engine_for(capped)
        auto_batch_sizes(step, SHAPES, [4, 4, 4], capped, tmp_path / "b", step.task.worst_case,
                         DistInfo(), memory=BigPeak(), echo=lambda s: None)


@pytest.mark.slow
def test_the_cli_refuses_a_cap_on_cpu_training_in_one_line(micro_store, tmp_path):
    cmd = [sys.executable, "-m", "myxtts.cli.main", "train", str(micro_store), "--quiet",
           "--output-dir", str(tmp_path / "run"), "--max-steps", "1"]
    for item in [*MICRO_MODEL, "train.device=cpu", "train.device_memory_cap=0.5"]:
        cmd += ["--set", item]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert lines == ["myxtts train: error: train.device_memory_cap=0.5 caps a GPU's memory, but "
                     "training runs on cpu; remove it (or train on a GPU)"], out.stderr


@pytest.mark.gpu
def test_a_data_share_too_small_for_the_features_is_refused_on_a_gpu():
    from myxtts.config import load_config
    from myxtts.data.feed.features import Featurizer
    from myxtts.data.feed.protocol import FeatureWork

    cfg = load_config(overrides=["data.data_device_memory_cap=0.000001", "train.device=cuda:0",
                                 "data.data_device=cuda:0", "train.device_memory_cap=0.9"])
    cap = resolve_caps(cfg, GPU0, GPU0)
    b, n = 16, 22050 * 10
    raw = {"wav": torch.zeros(b, n), "wav_lengths": torch.full((b,), n),
           "ref_wav": torch.zeros(b, 70000), "ref_wav_lengths": torch.full((b,), 70000),
           "ref_first": torch.full((b,), 2), "ref_frames": torch.full((b,), 256),
           "tokens": torch.ones(b, 50, dtype=torch.long), "token_lengths": torch.full((b,), 50),
           "speaker_ids": torch.zeros(b, dtype=torch.long),
           "language_ids": torch.zeros(b, dtype=torch.long),
           "indices": torch.zeros(b, dtype=torch.long), "n_frames": torch.tensor(1 + n // 256)}
    featurize = Featurizer(cfg.audio, 256)
    work = FeatureWork(GPU0, lambda: featurize(dict(raw), GPU0))
    with pytest.raises(ConfigError, match="raise data.data_device_memory_cap"):
        check_feature_memory(work, cap)
    roomy = resolve_caps(load_config(overrides=["data.data_device_memory_cap=0.5",
                                                "train.device_memory_cap=0.4"]), GPU0, GPU0)
    assert 0 < check_feature_memory(work, roomy) < 0.5 * 2**40
