"""The engine on a real GPU over a run's lifetime (``pytest -m gpu``; skipped without one):
16 auto-sized buckets started up (no bucket below 3/4 of its measured plan), hours of mixed
shapes in miniature (2,000 steps in random bucket order, ``memory_reserved`` flat), the
host kept at most a couple of steps ahead of a slowed GPU, a background save whose copy is
held back while graphed steps change the weights (it still equals the state of its step),
and whether compiled checkpointed blocks with dropout replay exactly inside a capture
(which decides if the plan may keep them compiled)."""

from __future__ import annotations

import random
import time

import pytest
import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.artifacts import saver as saver_module
from myxtts.artifacts.runs import CheckpointManager
from myxtts.artifacts.saver import BackgroundSaver, HostBuffers, host_snapshot
from myxtts.config import load_config
from myxtts.data.batch import BatchShape
from myxtts.model.dummy import random_batch
from myxtts.model.xtts import build_model
from myxtts.train.data import bucket_shapes
from myxtts.train.distributed import DistInfo
from myxtts.train.engine import TrainEngine, Workload
from myxtts.train.engine.budget import three_quarters
from myxtts.train.engine.graphs import CudaCapture
from myxtts.train.engine.lead import MAX_LEAD_STEPS
from myxtts.train.tts import TTSRecipe
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


def test_sixteen_auto_sized_buckets_start_up_and_soak_with_memory_reserved_flat(store16,
                                                                                tmp_path):
    cfg = load_config(preset="tiny", overrides=[
        "train.device=cuda", "data.num_buckets=16", "data.batch_frames=auto",
        f"train.output_dir={tmp_path / 'run'}", "train.tensorboard=false"])
    run = TTSRecipe(cfg, store16, show_progress=False)
    run.setup()
    engine, startup = run.engine, run.engine.startup
    shapes = sorted(set(bucket_shapes(run.data.sampler, run.cfg)), key=lambda s: s.frames)
    assert len(shapes) >= 12 and startup is not None and startup.report is not None
    for planned, batch in zip(startup.planned, startup.sizes):  # the plan, not an attempt
        assert batch >= three_quarters(planned), (startup.planned, startup.sizes)
    assert engine.mode == "graphed" and startup.report.shapes_captured == len(shapes)
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


def test_the_host_stays_at_most_max_lead_steps_ahead_of_a_slowed_gpu(tmp_path):
    """Each step first puts ~40 ms of sleep on the GPU (``torch.cuda._sleep``), so the host,
    left alone, would queue all 40 steps at once. When ``engine.step`` returns, the earlier
    steps not yet finished on the GPU (an event recorded behind each) are never more than
    MAX_LEAD_STEPS; and there are some: the GPU was the slower side, the bound held the
    host back. Meanwhile the process used well under half a core: the host waits on
    blocking events, asleep."""
    cfg = micro_config(tmp_path, "train.device=cuda", "train.cuda_graphs=off",
                       "train.compile=off")
    torch.manual_seed(0)
    engine = TrainEngine(cfg, build_model(cfg, 40, 1, None, None).to(CUDA), CUDA, DistInfo())
    shape = BatchShape(8, 40, 400, cfg.data.ref_frames, cfg.audio.n_mels)
    batches = [_real_batch(shape, 40, i) for i in range(40)]
    engine.step([batches[0]])  # lazy allocations
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(1_000_000)
    end.record()
    end.synchronize()
    per_ms = 1_000_000 / max(start.elapsed_time(end), 1e-3)  # sleep cycles per ms
    done, behind = [], []
    wall, cpu = time.perf_counter(), time.process_time()
    for batch in batches[1:]:
        torch.cuda._sleep(int(40 * per_ms))
        engine.step([batch])
        behind.append(sum(not e.query() for e in done))  # earlier steps still on the GPU
        marker = torch.cuda.Event()
        marker.record()
        done.append(marker)
    torch.cuda.synchronize()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert max(behind) <= MAX_LEAD_STEPS, behind
    assert max(behind) >= 1, behind  # the GPU was the slower side: the bound was needed
    # the host waited ~1.5 s for the GPU asleep in a blocking event, not spinning a core
    assert cpu < 0.5 * wall, (cpu, wall)
    assert torch.isfinite(torch.tensor(engine.read()["loss"]))


def test_a_light_shape_after_a_heavy_one_measures_its_own_fragmentation(tmp_path):
    """The warm-up runs the heavy shape first; the light one's margin (reserved beyond
    allocated at its peak) is measured after the cache is released, so the heavy shape's
    cached blocks (about the difference of their peaks) are not counted as its own."""
    from myxtts.train.engine import warmup

    cfg = micro_config(tmp_path, "train.device=cuda", "train.cuda_graphs=off",
                       "train.compile=off")
    torch.manual_seed(0)
    engine = TrainEngine(cfg, build_model(cfg, 40, 1, None, None).to(CUDA), CUDA, DistInfo())
    heavy = BatchShape(32, 40, 800, cfg.data.ref_frames, cfg.audio.n_mels)
    light = BatchShape(2, 20, 64, cfg.data.ref_frames, cfg.audio.n_mels)
    peak_heavy, _ = warmup._run_worst_case(engine, heavy, engine.task.worst_case)
    peak_light, frag_light = warmup._run_worst_case(engine, light, engine.task.worst_case)
    assert peak_heavy - peak_light > 64 * 2**20  # the heavy shape leaves that much cached
    assert frag_light < (peak_heavy - peak_light) / 4, (frag_light, peak_heavy, peak_light)


def test_a_delayed_background_save_holds_the_state_of_its_step_while_graphs_replay(
        tmp_path, monkeypatch):
    """Graphs on, the weight average on; the saver's copy stream is held back ~200 ms on
    the GPU, while five graphed steps are queued right behind the save. Their updates write
    the weights, AdamW state and the average in place, so they must wait for the copy (the
    event the save hands to ``engine.after_copy``): the checkpoint equals the state at its
    step, and training still moved on."""
    cfg = micro_config(tmp_path, "train.device=cuda", "train.cuda_graphs=on",
                       "train.compile=off", "train.ema_decay=0.9", "model.dropout=0")
    torch.manual_seed(0)
    engine = TrainEngine(cfg, build_model(cfg, 40, 1, None, None).to(CUDA), CUDA, DistInfo())
    shape = BatchShape(4, 40, 200, cfg.data.ref_frames, cfg.audio.n_mels)
    engine.start_up(Workload([shape], engine.task.worst_case))
    assert engine.mode == "graphed"
    for i in range(3):
        engine.step([_real_batch(shape, 40, i)])
    torch.cuda.synchronize()
    want = {k: v.detach().cpu().clone() for k, v in engine.state_dict()[ck.MODEL].items()}
    want_ema = engine.state_dict()[ck.EMA]
    want_ema = {k: {n: t.cpu() for n, t in v.items()} if isinstance(v, dict) else v.cpu()
                for k, v in want_ema.items()}
    saver = BackgroundSaver(CheckpointManager(tmp_path / "ck", keep_last=2), CUDA)
    saver.reserve(engine.state_dict())
    real = saver_module.host_snapshot

    def held_back(state, device, buffers=None, stream=None):
        with torch.cuda.stream(stream):
            torch.cuda._sleep(300_000_000)  # ~0.2 s at 1.5 GHz: the copy starts late
        return real(state, device, buffers, stream)

    monkeypatch.setattr(saver_module, "host_snapshot", held_back)
    state = ck.compose(ck.TrainingProgress(step=3), engine.state_dict(), {})
    path = saver.save(state, 3, writes_after=engine.after_copy)
    for i in range(3, 8):  # queued while the copy waits: their updates must wait for it
        engine.step([_real_batch(shape, 40, i)])
    saver.close()
    saved = ck.load(path)
    assert all(torch.equal(saved[ck.MODEL][k], v) for k, v in want.items())
    for k, v in want_ema.items():  # (the average's entries are clones taken at the save)
        got = saved[ck.EMA][k]
        assert (all(torch.equal(got[n], t) for n, t in v.items()) if isinstance(v, dict)
                else torch.equal(got, v))
    assert any(not torch.equal(engine.state_dict()[ck.MODEL][k].cpu(), v)
               for k, v in want.items())


def test_the_saves_host_buffers_are_page_locked_and_hold_the_copies(tmp_path):
    """The chunks a GPU save copies into: page-locked (so the copies are asynchronous),
    not a doubling of the checkpoint's bytes, and every copy equals its source."""
    cfg = micro_config(tmp_path, "train.device=cuda", "train.cuda_graphs=off")
    torch.manual_seed(0)
    engine = TrainEngine(cfg, build_model(cfg, 40, 1, None, None).to(CUDA), CUDA, DistInfo())
    engine.step([_real_batch(BatchShape(4, 40, 200, cfg.data.ref_frames, cfg.audio.n_mels),
                             40, 0)])
    state = engine.state_dict()
    buffers = HostBuffers()
    copied, event = host_snapshot(state, CUDA, buffers, torch.cuda.Stream(CUDA))
    event.synchronize()
    exact = sum(v.numel() * v.element_size() for _, v in saver_module._cuda_tensors(state))
    assert exact <= buffers.nbytes < exact + saver_module.CHUNK
    tensors = [(k, v) for k, v in state[ck.MODEL].items() if v.is_cuda]
    assert tensors
    for k, v in tensors:
        assert copied[ck.MODEL][k].is_pinned() and torch.equal(copied[ck.MODEL][k], v.cpu())
    buffers.close()


def test_compiled_checkpointed_blocks_with_dropout_replay_exactly_in_a_capture(tmp_path):
    """Decides whether the plan's fallback (checkpointed blocks with dropout run uncompiled
    under graphs) is needed on this torch: compiled blocks, checkpointing, dropout 0.1,
    captured; from the same random state a replay and an uncaptured step must give the same
    weights. If this fails the fallback stays; if it passes, compile is safe there too."""
    cfg = micro_config(tmp_path, "train.device=cuda", "train.precision=fp32",
                       "model.prenet_dropout=0", "model.dropout=0.1",
                       "train.activation_checkpointing=true", "train.warmup_steps=3")
    shapes = [BatchShape(4, 24, 96, 64, cfg.audio.n_mels)]
    engines = []
    for _ in range(2):
        torch.manual_seed(0)
        model = build_model(cfg, 40, 1, None, None).to(CUDA)
        engines.append(TrainEngine(cfg, model, CUDA, DistInfo(), compile_model=True))
    eager, graphed = engines
    report = graphed.warm_up(shapes, graphed.task.worst_case, capture=CudaCapture(CUDA), echo=print)
    assert report.capture_error is None and graphed.compiled
    assert_replays_like_eager(eager, graphed, [_real_batch(shapes[0], 40, i) for i in range(4)])
