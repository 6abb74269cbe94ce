"""The engine on a real GPU over a run's lifetime (``pytest -m gpu``; skipped without one):
16 auto-sized buckets prepared (no bucket shrunk below 3/4 of its measured size), hours of
mixed shapes in miniature (2,000 steps in random bucket order, ``memory_reserved`` flat),
the host kept a couple of steps ahead, a background save that equals the state of its step
while training goes on, and whether compiled checkpointed blocks with dropout replay
exactly inside a capture (which decides if the plan may keep them compiled)."""

from __future__ import annotations

import random

import pytest
import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.artifacts.runs import CheckpointManager
from myxtts.artifacts.saver import BackgroundSaver
from myxtts.config import load_config
from myxtts.data.batch import BatchShape
from myxtts.model.dummy import random_batch
from myxtts.model.xtts import build_model
from myxtts.train.data import bucket_shapes
from myxtts.train.distributed import DistInfo
from myxtts.train.engine import TrainEngine
from myxtts.train.engine.graphs import CudaCapture
from myxtts.train.engine.lead import MAX_LEAD_STEPS
from myxtts.train.engine.optim import build_optimizer, build_scheduler
from myxtts.train.engine.step import TrainStep
from myxtts.train.engine.warmup import warm_up
from myxtts.train.setup import build_setup
from tests.gpu.replay import assert_replays_like_eager
from tests.helpers import micro_config

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda", 0)


@pytest.fixture(scope="module")
def store16(tmp_path_factory):
    """A store with enough length spread for 16 buckets."""
    from myxtts.data.prepare.build import prepare_store
    from myxtts.synthetic import make_demo_data

    root = tmp_path_factory.mktemp("store16")
    data = make_demo_data(root / "data", speakers=4, utterances=60, seed=3)
    prepare_store(data, root / "store", load_config(), workers=2, progress=False,
                  echo=lambda *a: None)
    return root / "store"


def _real_batch(shape: BatchShape, n_tokens: int, seed: int) -> dict[str, torch.Tensor]:
    """A batch of ``shape`` with ragged real lengths (what the loader hands in)."""
    rng = random.Random(seed)
    b = shape.batch
    return random_batch(shape.n_mels, n_tokens, [rng.randint(3, shape.text) for _ in range(b)],
                        [rng.randint(shape.frames // 2, shape.frames) for _ in range(b)],
                        [shape.ref_frames] * b, n_text=shape.text, n_frames=shape.frames,
                        n_ref=shape.ref_frames, seed=seed, device=CUDA)


def test_sixteen_auto_sized_buckets_prepare_and_soak_with_memory_reserved_flat(store16,
                                                                               tmp_path):
    cfg = load_config(preset="tiny", overrides=[
        "train.device=cuda", "data.num_buckets=16", "data.batch_frames=auto",
        f"train.output_dir={tmp_path / 'run'}", "train.tensorboard=false"])
    run = build_setup(cfg, store16, None)
    engine, prepared = run.engine, run.engine.prepared
    shapes = sorted(set(bucket_shapes(run.data.sampler, run.cfg)), key=lambda s: s.frames)
    assert len(shapes) >= 12 and prepared is not None and prepared.report is not None
    for planned, batch in prepared.report.resized.items():
        assert batch >= 0.75 * planned.batch, (planned, batch)
    assert engine.mode == "graphed" and prepared.report.shapes_captured == len(shapes)
    order = random.Random(0)
    reserved = []
    for i in range(2000):
        engine.step([_real_batch(order.choice(shapes), run.data.vocab_size, i)])
        if i % 100 == 99:
            values = engine.read()
            assert torch.isfinite(torch.tensor(values["loss"]))
            if i >= 300:  # after the first steps' allocations (prefetch, accumulators)
                reserved.append(torch.cuda.memory_reserved(CUDA))
    assert max(reserved) - min(reserved) <= 64 * 2**20, reserved  # no creep: no fragmentation
    assert engine.uncaptured_steps == 0


def test_the_host_stays_at_most_max_lead_steps_ahead(tmp_path):
    cfg = micro_config(tmp_path, "train.device=cuda", "train.cuda_graphs=off")
    torch.manual_seed(0)
    engine = TrainEngine(cfg, build_model(cfg, 40, 1, None, None).to(CUDA), CUDA, DistInfo())
    shape = BatchShape(8, 40, 400, cfg.data.ref_frames, cfg.audio.n_mels)
    for i in range(50):
        engine.step([_real_batch(shape, 40, i)])
        assert engine._lead.pending <= MAX_LEAD_STEPS
    assert torch.isfinite(torch.tensor(engine.read()["loss"]))


def test_a_background_save_holds_the_state_of_its_step_while_training_goes_on(tmp_path):
    cfg = micro_config(tmp_path, "train.device=cuda", "train.cuda_graphs=off",
                       "train.ema_decay=0.9")
    torch.manual_seed(0)
    engine = TrainEngine(cfg, build_model(cfg, 40, 1, None, None).to(CUDA), CUDA, DistInfo())
    shape = BatchShape(4, 40, 200, cfg.data.ref_frames, cfg.audio.n_mels)
    for i in range(3):
        engine.step([_real_batch(shape, 40, i)])
    torch.cuda.synchronize()
    want = {k: v.detach().cpu().clone() for k, v in engine.state_dict()[ck.MODEL].items()}
    saver = BackgroundSaver(CheckpointManager(tmp_path / "ck", keep_last=2), CUDA)
    path = saver.save(ck.compose(ck.TrainingProgress(step=3), engine.state_dict(), {}, CUDA), 3)
    for i in range(3, 8):  # the weights change in place while the save is in flight
        engine.step([_real_batch(shape, 40, i)])
    saver.wait()
    saved = ck.load(path)[ck.MODEL]
    assert all(torch.equal(saved[k], v) for k, v in want.items())
    assert any(not torch.equal(engine.state_dict()[ck.MODEL][k].cpu(), v)
               for k, v in want.items())


def test_compiled_checkpointed_blocks_with_dropout_replay_exactly_in_a_capture(tmp_path):
    """Decides whether the plan's fallback (checkpointed blocks with dropout run uncompiled
    under graphs) is needed on this torch: compiled blocks, checkpointing, dropout 0.1,
    captured; from the same random state a replay and an uncaptured step must give the same
    weights. If this fails the fallback stays; if it passes, compile is safe there too."""
    cfg = micro_config(tmp_path, "train.device=cuda", "train.precision=fp32",
                       "model.prenet_dropout=0", "model.dropout=0.1",
                       "train.activation_checkpointing=true", "train.warmup_steps=3")
    shapes = [BatchShape(4, 24, 96, 64, cfg.audio.n_mels)]
    steps = []
    for _ in range(2):
        torch.manual_seed(0)
        model = build_model(cfg, 40, 1, None, None).to(CUDA)
        model.set_activation_checkpointing(True)
        opt, fused = build_optimizer(model, cfg.train)
        steps.append(TrainStep(model, opt, build_scheduler(opt, cfg.train), cfg, CUDA, fused,
                               compile_model=True))
    eager, graphed = steps
    report = warm_up(graphed, shapes, 40, 1, capture=CudaCapture(CUDA), echo=print)
    assert report.capture_error is None and graphed.compiled
    assert_replays_like_eager(eager, graphed, [_real_batch(shapes[0], 40, i) for i in range(4)])
