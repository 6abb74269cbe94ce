"""Model FLOPs on a meta-device copy equal the real model's; training logs TFLOP/s and MFU
per log interval from them (and GPU utilisation where NVML reads one)."""

from __future__ import annotations

import json

import pytest
import torch

from myxtts.data.batch import BatchShape
from myxtts.model.dummy import worst_case_batch
from myxtts.model.losses import compute_losses
from myxtts.model.xtts import build_model
from myxtts.observe.flops import count_flops
from myxtts.observe.progress import Progress
from myxtts.train.efficiency import IntervalEfficiency, meta_step_counter
from myxtts.train.tts import train
from tests.helpers import micro_config


@pytest.mark.parametrize("self_feed", [0.0, 0.5])
@pytest.mark.slow
def test_meta_count_equals_the_real_models(tmp_path, one_thread, self_feed):
    cfg = micro_config(tmp_path, f"train.self_feed={self_feed}")
    key = (3, 17, 48)
    meta = meta_step_counter(cfg, 40, 2)(key)
    model = build_model(cfg, 40, 2, None, None).train()
    batch = worst_case_batch(BatchShape(3, 17, 48, cfg.data.ref_frames, cfg.audio.n_mels), 40, 2,
                             "cpu")
    extra = {"self_feed": torch.zeros(())} if self_feed else {}
    real = count_flops(lambda: compute_losses(model(batch, **extra), batch, cfg.train)["loss"]
                       .backward())
    assert meta == real > 0
    if self_feed:  # the self-fed second decoder pass is counted
        assert meta > meta_step_counter(micro_config(tmp_path), 40, 2)(key)


def test_interval_figures_on_a_cpu(tmp_path):
    cpu = torch.device("cpu")
    plain = IntervalEfficiency(micro_config(tmp_path), cpu, torch.float32,
                               lambda: meta_step_counter(micro_config(tmp_path), 40, 1))
    plain.add([(2, 10, 48)])
    assert plain.flops is None and plain.collect(1.0) == {}  # no peak, no GPU: nothing to count
    eff = IntervalEfficiency(micro_config(tmp_path, "train.peak_tflops=2.0"), cpu,
                             torch.float32, lambda: meta_step_counter(micro_config(tmp_path), 40, 1))
    eff.add([(2, 10, 48), (2, 10, 48)])
    one = eff.flops((2, 10, 48))
    got = eff.collect(0.5)
    assert got["tflops"] == pytest.approx(2 * one / 0.5 / 1e12)
    assert got["mfu"] == pytest.approx(got["tflops"] / 2.0) and "gpu_util" not in got
    assert eff.collect(1.0) == {}  # a new interval starts empty


@pytest.mark.slow
def test_training_logs_mfu_when_the_peak_is_known(micro_store, tmp_path, one_thread):
    cfg = micro_config(tmp_path, "train.max_steps=4", "train.peak_tflops=0.5")
    train(cfg, micro_store, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in logged] == [2, 4]
    for r in logged:
        assert r["train/tflops"] > 0 and r["train/mfu"] == pytest.approx(r["train/tflops"] / 0.5)
        assert "train/gpu_util" not in r  # a CPU run has no NVML reading


def test_progress_shows_gpu_and_mfu_only_when_measured():
    assert "GPU" not in Progress(10, enabled=False).format({"loss": 1.0})
    text = Progress(10, enabled=False).format({"loss": 1.0, "gpu_util": 87.0, "mfu": 0.312})
    assert text.endswith("| GPU 87% | MFU 31.2%")
