"""The compiled step over an epoch: one graph per bucket shape, then no recompiles."""

from __future__ import annotations

import functools

import torch

from myxtts.data.prefetch import DevicePrefetcher
from myxtts.model.xtts import build_model
from myxtts.train.checkpoint import TrainingProgress
from myxtts.train.data import open_train_data
from myxtts.train.distributed import DistInfo
from myxtts.train.optim import build_optimizer, build_scheduler
from myxtts.train.step import TrainStep
from myxtts.train.validate import validation_loss
from tests.helpers import micro_config


def test_an_epoch_and_validation_compile_once_per_shape_and_never_again(micro_store, tmp_path,
                                                                        monkeypatch, one_thread):
    """Buckets bound the shapes: TorchDynamo captures one graph per (train shape, train mode)
    and per (validation shape, eval mode), and a second epoch adds none. Captured with a
    counting backend (the same graphs and guards as inductor, without code generation),
    on the CPU whatever the machine has."""
    graphs: list[tuple] = []

    def counting_backend(gm, example_inputs):
        graphs.append(tuple(tuple(x.shape) for x in example_inputs if isinstance(x, torch.Tensor)))
        return gm.forward

    torch._dynamo.reset()
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=counting_backend))
    cfg = micro_config(tmp_path, "train.compile=on", "train.device=cpu")
    device = torch.device("cpu")
    data = open_train_data(cfg, micro_store, device, DistInfo(), None, TrainingProgress())
    model = build_model(cfg, data.vocab_size, len(data.languages), data.mel_mean, data.mel_std)
    opt, fused = build_optimizer(model, cfg.train)
    step = TrainStep(model, opt, build_scheduler(opt, cfg.train), cfg, device, fused,
                     compile_model=True)
    assert step.compiled
    try:
        train_shapes = set(data.sampler.shapes())
        val_shapes = set(data.val_sampler.shapes())
        model.train()
        for epoch in range(2):
            seen = set()
            for batch in DevicePrefetcher(data.loader, device):
                seen.add((batch["tokens"].shape[0], batch["tokens"].shape[1], batch["mel"].shape[1]))
                step([batch])
            assert seen == train_shapes
            if epoch == 0:
                after_first_epoch = len(graphs)
                assert after_first_epoch == len(train_shapes)
        assert len(graphs) == after_first_epoch  # the second epoch recompiled nothing
        validation_loss(model, step, data, device)
        validation_loss(model, step, data, device)
        assert len(graphs) == len(train_shapes) + len(val_shapes)
        assert step.compiled  # never fell back to eager
    finally:
        torch._dynamo.reset()
