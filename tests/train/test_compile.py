"""Regional compilation over an epoch: one graph per block type, whatever the number of
bucket shapes, and none after the first epoch nor for validation."""

from __future__ import annotations

import torch

from myxtts.data.batch import to_model_dtypes
from myxtts.data.prefetch import DevicePrefetcher
from myxtts.model.xtts import build_model
from myxtts.train.checkpoint import TrainingProgress
from myxtts.train.compile import BLOCK_TYPES
from myxtts.train.data import open_train_data
from myxtts.train.distributed import DistInfo
from myxtts.train.optim import build_optimizer, build_scheduler
from myxtts.train.step import TrainStep
from myxtts.train.validate import validation_loss
from tests.helpers import micro_config


def test_blocks_compile_once_per_type_not_once_per_shape(micro_store, tmp_path, one_thread):
    """Only transformer blocks are compiled, each block type once: its graph (batch and
    sequence axes dynamic) serves every instance and every bucket shape. A second epoch
    compiles nothing, and validation (eval mode) runs the blocks eagerly. Captured with a
    counting backend (the same graphs and guards as inductor, without code generation), on
    the CPU."""
    graphs: list[str] = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm.code)
        return gm.forward

    torch._dynamo.reset()
    cfg = micro_config(tmp_path, "train.compile=on", "data.num_buckets=4")
    device = torch.device("cpu")
    data = open_train_data(cfg, micro_store, device, DistInfo(), None)
    data.continue_from(None, TrainingProgress())
    model = build_model(cfg, data.vocab_size, len(data.languages), data.mel_mean, data.mel_std)
    opt, fused = build_optimizer(model, cfg.train)
    step = TrainStep(model, opt, build_scheduler(opt, cfg.train), cfg, device, fused,
                     compile_model=True, compile_backend=counting_backend)
    assert step.compiled and step.mode == "compiled"
    n_types = len({type(m) for m in model.modules() if isinstance(m, BLOCK_TYPES)})
    try:
        train_shapes = set(data.sampler.shapes())
        assert len(train_shapes) >= 3  # enough shapes for per-shape compiling to show
        model.train()
        for epoch in range(2):
            for batch in DevicePrefetcher(data.loader, device, transform=to_model_dtypes):
                step([batch])
            if epoch == 0:
                after_first_epoch = len(graphs)
        assert after_first_epoch == n_types == 3  # encoder, resampler, decoder layers
        assert len(graphs) == after_first_epoch  # the second epoch compiled nothing
        validation_loss(model, step, data, device)
        assert len(graphs) == after_first_epoch  # eval mode: eager blocks
        assert step.compiled  # never fell back to eager
    finally:
        torch._dynamo.reset()
