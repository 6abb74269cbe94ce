"""What can go wrong around CUDA graph capture, on a real device (``pytest -m gpu``; skipped
without one): activation checkpointing with dropout inside a capture (compiled or not), a
capture broken by a sync, out of memory inside a capture, a shape with no graph at all, a
batch that lost a clip on the fly, 16 auto-sized buckets, and hours of mixed shapes."""

from __future__ import annotations

import logging

import pytest
import torch

from myxtts.data.batch import BatchShape
from myxtts.model.dummy import worst_case_batch
from myxtts.model.xtts import build_model
from myxtts.train.distributed import DistInfo
from myxtts.train.engine import TrainEngine
from myxtts.train.engine.graphs import CudaCapture
from myxtts.train.engine.mode import CHECKPOINT_CAPTURE_TORCH, torch_version
from myxtts.train.engine.warmup import warm_up
from myxtts.train.errors import TrainError
from tests.gpu.replay import assert_replays_like_eager
from tests.helpers import micro_config

pytestmark = pytest.mark.gpu

N_MELS, N_TOKENS = 80, 40
SHAPES = [BatchShape(4, 24, 96, 64, N_MELS), BatchShape(2, 40, 192, 64, N_MELS)]
CUDA = torch.device("cuda", 0)


def _step(tmp_path, *overrides: str):
    """The step of an engine built the way training builds it (the plan decides), and the
    plan (these tests drive the engine's warm-up and graphs directly)."""
    cfg = micro_config(tmp_path, "train.device=cuda", "train.precision=fp32",
                       "model.prenet_dropout=0", "train.warmup_steps=3", *overrides)
    torch.manual_seed(0)
    model = build_model(cfg, N_TOKENS, 1, None, None).to(CUDA)
    engine = TrainEngine(cfg, model, CUDA, DistInfo())
    return engine._step, engine.plan


def _batch(shape: BatchShape, seed: int) -> dict[str, torch.Tensor]:
    from myxtts.model.dummy import random_batch

    return random_batch(N_MELS, N_TOKENS, [shape.text - 3] * shape.batch,
                        [shape.frames - seed % 5] * shape.batch, [shape.ref_frames] * shape.batch,
                        n_text=shape.text, n_frames=shape.frames, n_ref=shape.ref_frames,
                        seed=seed, device=CUDA)


@pytest.mark.skipif(torch_version() < CHECKPOINT_CAPTURE_TORCH,
                    reason="this torch cannot capture checkpointed blocks (the plan says so)")
def test_checkpointed_blocks_with_dropout_capture_and_equal_the_uncaptured_step(tmp_path):
    """Checkpointing on, dropout 0.1, compile on, graphs on: the plan runs the blocks
    uncompiled, the capture succeeds, and from the same random state a replayed step and an
    uncaptured one draw the same masks in the forward and its recomputation: same weights."""
    sets = ("train.activation_checkpointing=true", "model.dropout=0.1", "train.compile=on",
            "train.cuda_graphs=on")
    (eager, _), (graphed, plan) = _step(tmp_path, *sets), _step(tmp_path, *sets)
    assert (plan.compile, plan.graphs) == (False, True) and not graphed.compiled
    report = warm_up(graphed, SHAPES, N_TOKENS, 1, capture=CudaCapture(CUDA), echo=print)
    assert report.capture_error is None and report.shapes_captured == 2
    batches = [_batch(SHAPES[i % 2], i) for i in range(4)]
    assert all(graphed.graphs.ready([batch]) for batch in batches)
    assert_replays_like_eager(eager, graphed, batches)
    assert graphed.uncaptured_steps == 0


def test_a_shape_without_a_graph_is_counted(tmp_path, caplog):
    step, _ = _step(tmp_path, "model.dropout=0")
    warm_up(step, SHAPES[:1], N_TOKENS, 1, capture=CudaCapture(CUDA), echo=print)
    with caplog.at_level(logging.WARNING, logger="myxtts.train.engine.step"):
        step([_batch(SHAPES[0], 0)])
        step([_batch(SHAPES[1], 1)])
    assert step.uncaptured_steps == 1
    assert any("2 x 192 frames" in r.getMessage() for r in caplog.records)
    assert torch.isfinite(torch.tensor(step.read()["loss"]))


def test_a_capture_broken_by_a_sync_drops_every_graph_and_leaks_nothing(tmp_path,
                                                                        monkeypatch):
    """The batch-2 shape's micro-step syncs while capturing (what a stray .item() does):
    that capture fails. Either the device passes the health check and every graph is
    dropped (the run trains uncaptured), or the run stops with the one line naming
    train.cuda_graphs=off -- never a failure later. After it the thread's stream is the
    default stream and 300 steps of fresh batches (what the prefetcher hands in) keep
    memory_allocated flat: the allocator no longer routes this stream's blocks to the
    capture's pool."""
    step, _ = _step(tmp_path, "model.dropout=0.1")
    micro = step.micro

    def syncing(batch, n_micro, last=True):
        if batch["mel"].shape[0] == 2 and torch.cuda.is_current_stream_capturing():
            torch.cuda.synchronize()
        return micro(batch, n_micro, last)

    monkeypatch.setattr(step, "micro", syncing)
    try:
        report = warm_up(step, SHAPES, N_TOKENS, 1, capture=CudaCapture(CUDA), echo=print)
    except TrainError as e:
        assert "train.cuda_graphs=off" in str(e)
        return
    assert torch.cuda.current_stream(CUDA) == torch.cuda.default_stream(CUDA)
    assert not torch.cuda.is_current_stream_capturing()
    assert report.shapes_captured == 0 and step.graphs is None and report.capture_error
    monkeypatch.setattr(step, "micro", micro)
    allocated = []
    for i in range(300):
        step([_batch(SHAPES[i % 2], i)])
        if i % 50 == 49:
            torch.cuda.synchronize()
            allocated.append(torch.cuda.memory_allocated(CUDA))
    assert max(allocated) - min(allocated) < 8 * 2**20, allocated  # flat: nothing leaks
    assert step.uncaptured_steps == 0 and torch.isfinite(torch.tensor(step.read()["loss"]))
    torch.cuda.empty_cache()  # no internal assert: the allocator knows the capture ended


def test_out_of_memory_inside_a_capture_is_seen_and_retried(tmp_path):
    """A memory cap leaves room for the uncaptured steps but not for every capture: the
    out-of-memory error raised inside torch.cuda.graph is recognised (also when it only is
    the capture error's context), retried, then the bucket shrinks to 3/4 at most or every
    graph is dropped; either way training goes on."""
    step, _ = _step(tmp_path, "model.dropout=0")
    torch.cuda.empty_cache()
    warm = warm_up(step, SHAPES, N_TOKENS, 1, capture=None, echo=print)
    need = max(warm.peaks.values())
    total = torch.cuda.get_device_properties(CUDA).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, 1.3 * need / total), CUDA)
    try:
        report = warm_up(step, SHAPES, N_TOKENS, 1, capture=CudaCapture(CUDA), echo=print)
        for shape, batch in report.resized.items():
            assert batch >= 0.75 * shape.batch
        for i in range(6):
            step([_batch(SHAPES[i % 2], i)])
        assert torch.isfinite(torch.tensor(step.read()["loss"]))
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, CUDA)


def test_the_worst_case_of_a_shrunk_bucket_is_captured(tmp_path):
    """The retry an out-of-memory capture makes: a smaller batch (3/4) of the same bucket
    captures beside the graphs already in the pool, and replays."""
    step, _ = _step(tmp_path, "model.dropout=0")
    smaller = BatchShape(3, *[getattr(SHAPES[0], k) for k in ("text", "frames", "ref_frames",
                                                              "n_mels")])
    warm_up(step, [SHAPES[0], smaller], N_TOKENS, 1, capture=CudaCapture(CUDA), echo=print)
    assert step.graphs.ready([worst_case_batch(smaller, N_TOKENS, 1, CUDA)])


def test_a_graphed_run_on_the_fly_with_a_broken_clip_never_leaves_its_graphs(tmp_path):
    """Raw audio with one silent clip (it passes the header scan and fails in a worker),
    graphed on the GPU: every batch keeps its bucket's shape, so every step replays a graph
    (train/uncaptured_steps stays 0 in metrics.jsonl)."""
    import json

    import numpy as np
    import soundfile as sf

    from myxtts.synthetic import make_demo_data
    from myxtts.train.loop import train

    data = make_demo_data(tmp_path / "demo", speakers=2, utterances=8, seed=5)
    victim = sorted(data.rglob("*.wav"))[2]
    info = sf.info(victim)
    sf.write(victim, np.zeros(info.frames, np.float32), info.samplerate)
    cfg = micro_config(tmp_path / "run", "train.device=cuda", "train.cuda_graphs=on",
                       "train.compile=off", "train.precision=auto", "train.max_steps=12",
                       "train.log_every=4", "train.val_every=100", "data.data_device=cpu",
                       "data.num_workers=1")
    train(cfg, data, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    logged = [r["train/uncaptured_steps"] for r in rows if "train/uncaptured_steps" in r]
    assert logged and all(v == 0 for v in logged)
