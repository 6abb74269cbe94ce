"""What can go wrong around CUDA graph capture, on a real device (``pytest -m gpu``; skipped
without one): activation checkpointing with dropout inside a capture (compiled or not), a
capture broken by a sync (its pool freed, the allocator's capture ended, torch 2.11's
generator mended), out of memory inside a capture (recognised, retried, the bucket shrunk
and replayed), a shape with no graph at all, a batch that lost a clip on the fly, and
``myxtts train`` with the expandable segments the CLI asks for."""

from __future__ import annotations

import gc
import itertools
import json
import logging
import os
import subprocess
import sys

import pytest
import torch

from myxtts.data.batch import BatchShape
from myxtts.model.xtts import build_model
from myxtts.train.distributed import DistInfo
from myxtts.train.engine import TrainEngine
from myxtts.train.engine.graphs import CudaCapture
from myxtts.train.engine.mode import CHECKPOINT_CAPTURE_TORCH, torch_version
from myxtts.train.errors import is_out_of_memory
from tests.gpu.replay import assert_replays_like_eager
from tests.helpers import MICRO_MODEL, micro_config

pytestmark = pytest.mark.gpu

N_MELS, N_TOKENS = 80, 40
SHAPES = [BatchShape(4, 24, 96, 64, N_MELS), BatchShape(2, 40, 192, 64, N_MELS)]
CUDA = torch.device("cuda", 0)


def _engine(tmp_path, *overrides: str) -> tuple[TrainEngine, object]:
    """An engine built the way training builds it (the plan decides), and the plan (these
    tests drive the engine's warm-up and graphs directly)."""
    cfg = micro_config(tmp_path, "train.device=cuda", "train.precision=fp32",
                       "model.prenet_dropout=0", "train.warmup_steps=3", *overrides)
    torch.manual_seed(0)
    model = build_model(cfg, N_TOKENS, 1, None, None).to(CUDA)
    engine = TrainEngine(cfg, model, CUDA, DistInfo())
    return engine, engine.plan


def _batch(shape: BatchShape, seed: int, device: torch.device = CUDA) -> dict[str, torch.Tensor]:
    from myxtts.model.dummy import random_batch

    return random_batch(N_MELS, N_TOKENS, [shape.text - 3] * shape.batch,
                        [shape.frames - seed % 5] * shape.batch, [shape.ref_frames] * shape.batch,
                        n_text=shape.text, n_frames=shape.frames, n_ref=shape.ref_frames,
                        seed=seed, device=device)


def _pool_segments(pools: set[tuple]) -> list[dict]:
    """The allocator's segments that belong to one of ``pools`` (the cache released)."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return [s for s in torch.cuda.memory_snapshot()
            if tuple(s.get("segment_pool_id", (0, 0))) in pools]


@pytest.mark.skipif(torch_version() < CHECKPOINT_CAPTURE_TORCH,
                    reason="this torch cannot capture checkpointed blocks (the plan says so)")
def test_checkpointed_blocks_with_dropout_capture_and_equal_the_uncaptured_step(tmp_path):
    """Checkpointing on, dropout 0.1, compile on, graphs on: the plan runs the blocks
    uncompiled, the capture succeeds, and from the same random state a replayed step and an
    uncaptured one draw the same masks in the forward and its recomputation: same weights."""
    sets = ("train.activation_checkpointing=true", "model.dropout=0.1", "train.compile=on",
            "train.cuda_graphs=on")
    (eager, _), (graphed, plan) = _engine(tmp_path, *sets), _engine(tmp_path, *sets)
    assert (plan.compile, plan.graphs) == (False, True) and not graphed.compiled
    report = graphed.warm_up(SHAPES, graphed.task.worst_case, capture=CudaCapture(CUDA), echo=print)
    assert report.capture_error is None and report.shapes_captured == 2
    batches = [_batch(SHAPES[i % 2], i) for i in range(4)]
    assert all(graphed._graphs.ready([batch]) for batch in batches)
    assert_replays_like_eager(eager, graphed, batches)
    assert graphed.uncaptured_steps == 0


def test_a_shape_without_a_graph_is_counted(tmp_path, caplog):
    engine, _ = _engine(tmp_path, "model.dropout=0")
    engine.warm_up(SHAPES[:1], engine.task.worst_case, capture=CudaCapture(CUDA), echo=print)
    with caplog.at_level(logging.WARNING, logger="myxtts.train.engine.graphs"):
        engine.step([_batch(SHAPES[0], 0)])
        engine.step([_batch(SHAPES[1], 1)])
    assert engine.uncaptured_steps == 1
    assert any("2 x 192 frames" in r.getMessage() for r in caplog.records)
    assert torch.isfinite(torch.tensor(engine.read()["loss"]))


def test_a_capture_broken_by_a_sync_frees_its_pool_and_the_run_trains_uncaptured(tmp_path,
                                                                                monkeypatch):
    """The batch-2 shape's micro-step syncs while it is captured (what a stray .item() does):
    that capture fails, every graph is dropped and the run trains uncaptured, dropout on. A
    TrainError fails this test: the device must be usable afterwards (torch 2.11's
    generator, which refuses draws after a failed capture, mended). Afterwards the thread's
    stream is the default one, no segment of the capture's pool survives the cache's
    release (the failed capture's use of it given back), and 400 steps of prefetched
    batches -- copied on a side stream and ``record_stream``-ed, whose blocks the allocator
    defers for as long as it believes a capture is under way -- keep memory_reserved flat."""
    from myxtts.data.feed.prefetch import CopyFeed

    engine, _ = _engine(tmp_path, "model.dropout=0.1")
    engine.warm_up(SHAPES, engine.task.worst_case,
                   capture=None, echo=print)  # optimizer state exists
    micro = engine._micro

    def syncing(batch, n_micro, last=True):
        if batch["mel"].shape[0] == 2 and torch.cuda.is_current_stream_capturing():
            torch.cuda.synchronize()
        return micro(batch, n_micro, last)

    monkeypatch.setattr(engine, "_micro", syncing)
    capture = CudaCapture(CUDA)
    pools = {tuple(capture.pool)}
    report = engine.warm_up(SHAPES, engine.task.worst_case, capture=capture, echo=print)
    pools.add(tuple(capture.pool))
    assert torch.cuda.current_stream(CUDA) == torch.cuda.default_stream(CUDA)
    assert not torch.cuda.is_current_stream_capturing()
    assert report.shapes_captured == 0 and engine.mode != "graphed" and report.capture_error
    assert not _pool_segments(pools), "the failed capture's pool is still reserved"
    monkeypatch.setattr(engine, "_micro", micro)
    host = [{k: v.pin_memory() for k, v in _batch(SHAPES[i % 2], i, torch.device("cpu")).items()}
            for i in range(8)]
    feed = CopyFeed(itertools.islice(itertools.cycle(host), 400), CUDA, ahead=2)
    reserved = []
    for i, (batch, _) in enumerate(feed):
        engine.step([batch])
        if i % 50 == 49:
            torch.cuda.synchronize()
            reserved.append(torch.cuda.memory_reserved(CUDA))
    assert max(reserved) - min(reserved) <= 8 * 2**20, reserved  # deferred blocks: ~60 MB
    assert engine.uncaptured_steps is None  # not graphed: every step ran the plain step
    assert torch.isfinite(torch.tensor(engine.read()["loss"]))


def test_the_health_check_sees_a_capture_stream_that_is_still_capturing():
    """A capture left running on the capture stream while the thread's current stream is
    the default one (what a capture that failed before ending leaves): the check names it,
    instead of asking the default stream and going on to sync in the middle of a capture."""
    capture = CudaCapture(CUDA)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(capture.stream):
        graph.capture_begin()
    try:
        assert not torch.cuda.is_current_stream_capturing()
        assert capture.problem() == "the capture stream is still capturing"
    finally:
        with torch.cuda.stream(capture.stream):
            graph.capture_end()
    del graph
    assert capture.problem() is None


def test_out_of_memory_inside_a_capture_is_recognised_and_the_shrunk_bucket_replays(tmp_path,
                                                                                   monkeypatch):
    """The batch-4 shape's capture runs out of memory twice (an allocation inside the capture
    larger than the GPU): the error is recognised as out of memory, retried at the same
    size, then the bucket is captured at 3 (3/4 of 4) -- straight away, as the real retry
    does, with no uncaptured run of that size first -- and replays like the uncaptured
    step."""
    (eager, _), (engine, _) = (_engine(tmp_path, "model.dropout=0"),
                               _engine(tmp_path, "model.dropout=0"))
    micro, failures, seen = engine._micro, [2], []
    total = torch.cuda.get_device_properties(CUDA).total_memory

    def starving(batch, n_micro, last=True):
        if (batch["mel"].shape[0] == 4 and failures[0] and
                torch.cuda.is_current_stream_capturing()):
            failures[0] -= 1
            try:
                torch.empty(2 * total, dtype=torch.uint8, device=CUDA)
            except Exception as e:
                seen.append(is_out_of_memory(e))
                raise
        return micro(batch, n_micro, last)

    monkeypatch.setattr(engine, "_micro", starving)
    report = engine.warm_up(SHAPES, engine.task.worst_case, capture=CudaCapture(CUDA), echo=print)
    assert seen == [True, True] and "out of memory" in report.capture_error.lower()
    assert report.resized == {SHAPES[0]: 3} and report.shapes_captured == 2
    smaller = BatchShape(3, *[getattr(SHAPES[0], k) for k in ("text", "frames", "ref_frames",
                                                              "n_mels")])
    batches = [_batch(smaller, i) for i in range(3)]
    assert all(engine._graphs.ready([b]) for b in batches)
    monkeypatch.setattr(engine, "_micro", micro)
    assert_replays_like_eager(eager, engine, batches)
    assert engine.uncaptured_steps == 0


def test_a_graphed_run_on_the_fly_with_a_broken_clip_never_leaves_its_graphs(tmp_path):
    """Raw audio with one silent clip (it passes the header scan and fails in a worker),
    graphed on the GPU: every batch keeps its bucket's shape, so every step replays a graph
    (train/uncaptured_steps stays 0 in metrics.jsonl)."""
    import numpy as np
    import soundfile as sf

    from myxtts.synthetic import make_demo_data
    from myxtts.train.tts import train

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


def test_myxtts_train_with_the_clis_expandable_segments_captures_and_replays(micro_store,
                                                                            tmp_path):
    """The CLI asks torch's allocator for expandable segments before the first CUDA
    allocation (in a new process: the setting is read once). With it, ``myxtts train``
    captures every bucket shape and replays them: the warm-up's line says graphed, and no
    step ran uncaptured."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    sets = [*MICRO_MODEL, "train.device=cuda", "train.cuda_graphs=on", "train.compile=off",
            "train.log_every=2", "train.val_every=100", "train.synth_every=0",
            "train.tensorboard=false", "data.num_workers=0"]
    cmd = [sys.executable, "-m", "myxtts.cli.main", "train", str(micro_store), "--output-dir",
           str(tmp_path / "run"), "--max-steps", "6", "--batch-frames", "1200", "--quiet"]
    for item in sets:
        cmd += ["--set", item]
    probe = ("import json, os, torch; from myxtts.system import default_allocator_settings; "
             "default_allocator_settings(); x = torch.zeros(1 << 20, device='cuda'); "
             "print(json.dumps([os.environ['PYTORCH_CUDA_ALLOC_CONF'], "
             "[s.get('is_expandable') for s in torch.cuda.memory_snapshot()]]))")
    said = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                          text=True, timeout=120)
    conf, expandable = json.loads(said.stdout.strip().splitlines()[-1])
    assert conf == "expandable_segments:True" and expandable, said.stderr[-2000:]
    assert True in expandable or set(expandable) == {None}  # (older torch: no such field)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "graphed step" in done.stderr + done.stdout, (done.stderr + done.stdout)[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    logged = [r["train/uncaptured_steps"] for r in rows if "train/uncaptured_steps" in r]
    assert logged and all(v == 0 for v in logged)
