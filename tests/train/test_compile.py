"""Regional compilation over an epoch: one graph per block type, whatever the number of
bucket shapes, and none after the first epoch nor for validation or sample synthesis; a
compile failure falls back to eager with one warning naming the cause."""

from __future__ import annotations

import logging

import pytest
import torch

from myxtts.artifacts.checkpoint import TrainingProgress
from myxtts.model.xtts import build_model
from myxtts.observe.loggers import NullLogger
from myxtts.train.data import open_train_data
from myxtts.train.distributed import DistInfo
from myxtts.train.engine import TrainEngine
from myxtts.train.engine.task import TTSTask
from myxtts.train.samples import synthesize_samples
from myxtts.train.validation import validation_loss
from tests.helpers import micro_config
from tests.train.test_graphs import N_MELS, _batches, engine_for


@pytest.mark.slow
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
    data.continue_from(TrainingProgress())
    model = build_model(cfg, data.vocab_size, len(data.languages), data.mel_mean, data.mel_std)
    engine = TrainEngine(cfg, model, device, DistInfo(), compile_backend=counting_backend)
    assert engine.compiled and engine.mode == "compiled"
    n_types = len({type(m) for m in model.modules() if isinstance(m, TTSTask.block_types)})
    try:
        train_shapes = set(data.sampler.shapes())
        assert len(train_shapes) >= 3  # enough shapes for per-shape compiling to show
        model.train()
        for epoch in range(2):
            for batch, _ in data.loader.device_feed(device):
                engine.step([batch])
            if epoch == 0:
                after_first_epoch = len(graphs)
        assert after_first_epoch == n_types == 3  # encoder, resampler, decoder layers
        assert len(graphs) == after_first_epoch  # the second epoch compiled nothing
        validation_loss(engine, data, device)
        assert len(graphs) == after_first_epoch  # eval mode: eager blocks
        assert data.synth_batch  # free-running generation and alignment: eager blocks too
        wavs = synthesize_samples(engine, data, cfg, NullLogger(), 1, tmp_path / "samples",
                                  device, 0)
        assert wavs and len(graphs) == after_first_epoch
        assert engine.compiled  # never fell back to eager
    finally:
        torch._dynamo.reset()


def _forward_fails(gm, example_inputs):
    raise RuntimeError("boom in the forward compiler")


def _empty_assertion(gm, example_inputs):
    raise AssertionError()  # dynamo and inductor raise these bare


def _backward_fails():
    from torch._dynamo.backends.common import aot_autograd

    def fails(gm, example_inputs):
        raise RuntimeError("boom in the backward compiler")

    return aot_autograd(fw_compiler=lambda gm, ex: gm.forward, bw_compiler=fails)


def _engine_pair(tmp_path, backend):
    """An eager engine and one whose blocks compile with ``backend``, on identical models."""
    cfg = micro_config(tmp_path, f"audio.n_mels={N_MELS}", "model.dropout=0",
                       "model.prenet_dropout=0")
    return [engine_for(cfg, compile_model=compiled, backend=backend if compiled else None)
            for compiled in (False, True)]


@pytest.mark.parametrize("backend, cause", [
    (_forward_fails, "RuntimeError: boom in the forward compiler"),
    (_empty_assertion, "AssertionError: (no message)"),
    (_backward_fails(), "RuntimeError: boom in the backward compiler"),
])
@pytest.mark.slow
def test_a_compile_failure_falls_back_to_eager_with_one_warning(tmp_path, one_thread, caplog,
                                                                backend, cause):
    """Forward or backward (AOTAutograd compiles the backward at its first call): the step
    goes on eagerly, with one warning naming the root cause, and trains exactly as the eager
    step does (a half-accumulated backward is redone)."""
    torch._dynamo.reset()
    eager, fallback = _engine_pair(tmp_path, backend)
    try:
        with caplog.at_level(logging.WARNING, logger="myxtts.train.engine.compile"):
            for i in range(3):
                eager.step(_batches(i, 1))
                fallback.step(_batches(i, 1))
    finally:
        torch._dynamo.reset()
    warnings = [r.getMessage() for r in caplog.records if r.name == "myxtts.train.engine.compile"]
    assert len(warnings) == 1 and cause in warnings[0], warnings
    assert fallback.mode == "eager"
    assert fallback.read()["loss"] == pytest.approx(eager.read()["loss"], rel=1e-6)
    for (name, a), b in zip(eager.model.state_dict().items(), fallback.model.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7, msg=f"{name} differs")


def test_running_out_of_memory_is_not_taken_for_a_compile_failure(tmp_path, one_thread):
    """cuBLAS failing to allocate while compiling (autotuning) is memory, for the caller to
    handle (the auto budget lowers the batch): the step stays compiled."""
    def no_memory(gm, example_inputs):
        raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate")

    torch._dynamo.reset()
    (_, engine) = _engine_pair(tmp_path, no_memory)
    try:
        with pytest.raises(Exception, match="CUBLAS_STATUS_ALLOC_FAILED"):
            engine.step(_batches(0, 1))
    finally:
        torch._dynamo.reset()
    assert engine.compiled
