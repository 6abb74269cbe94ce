"""The GPU paths, on a real CUDA device (``pytest -m gpu``; skipped without one): graphed,
compiled and compiled-and-graphed steps against eager, the auto budget's sizes running
without running out of memory, no host sync in the eager or graphed step, float16 batches
from the loader cast on the device, a default ``train()`` on CUDA end to end, and resume on
CUDA within a stated tolerance."""

from __future__ import annotations

import pytest
import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.artifacts.runs import CheckpointManager
from myxtts.data.batch import BatchShape
from myxtts.model.dummy import worst_case_batch
from myxtts.model.xtts import build_model
from myxtts.train.distributed import DistInfo
from myxtts.train.engine import TrainEngine
from myxtts.train.engine.budget import auto_batch_sizes
from myxtts.train.engine.graphs import CudaCapture
from tests.gpu.replay import assert_steps_never_sync, step_side_by_side
from tests.helpers import micro_config, train_crashing_at

pytestmark = pytest.mark.gpu

N_MELS, N_TOKENS = 80, 40
SHAPES = [BatchShape(4, 24, 96, 64, N_MELS), BatchShape(2, 40, 192, 64, N_MELS)]
CUDA = torch.device("cuda", 0)


def _engines(tmp_path, n: int, *overrides: str, compiled: bool = False) -> list[TrainEngine]:
    cfg = micro_config(tmp_path, "train.device=cuda", "train.precision=fp32", "model.dropout=0",
                       "model.prenet_dropout=0", "train.warmup_steps=3", *overrides)
    out = []
    for _ in range(n):
        torch.manual_seed(0)
        model = build_model(cfg, N_TOKENS, 1, None, None).to(CUDA)
        out.append(TrainEngine(cfg, model, CUDA, DistInfo(), compile_model=compiled))
    return out


def _batch(i: int) -> dict[str, torch.Tensor]:
    from myxtts.model.dummy import random_batch

    s = SHAPES[i % 2]
    gen = torch.Generator().manual_seed(i)
    mel = torch.randint(s.frames // 2, s.frames + 1, (s.batch,), generator=gen).tolist()
    return random_batch(N_MELS, N_TOKENS, [s.text - 3] * s.batch, mel, [s.ref_frames] * s.batch,
                        n_text=s.text, n_frames=s.frames, n_ref=s.ref_frames, seed=i, device=CUDA)


def _close(a: TrainEngine, b: TrainEngine, rtol: float, atol: float) -> None:
    ra, rb = a.read(), b.read()
    for k in ("loss", "mel_l1", "post_l1", "stop", "guided"):
        assert rb[k] == pytest.approx(ra[k], rel=rtol, abs=atol), k
    for (name, pa), pb in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        torch.testing.assert_close(pb, pa, rtol=rtol, atol=atol, msg=f"{name} differs")


@pytest.mark.parametrize("ema", [0.0, 0.9])
def test_graphed_step_equals_eager_over_several_steps(tmp_path, ema):
    eager, graphed = _engines(tmp_path, 2, f"train.ema_decay={ema}")
    report = graphed.warm_up(SHAPES, graphed.task.worst_case, capture=CudaCapture(CUDA), echo=print)
    assert report.capture_error is None and report.shapes_captured == 2
    step_side_by_side(eager, graphed, (_batch(i) for i in range(6)))
    _close(eager, graphed, rtol=1e-4, atol=1e-5)
    if ema:  # the weight average is updated inside the captured update graph
        assert graphed._ema.updates.item() == eager._ema.updates.item() == 6.0
        for name, a, b in zip(eager._ema.names, eager._ema.shadow, graphed._ema.shadow):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=f"average of {name}")


def test_dropout_stays_random_across_replays(tmp_path):
    """In the mode training runs on a GPU: compiled blocks, dropout 0.1, graphed."""
    (engine,) = _engines(tmp_path, 1, "model.dropout=0.1", compiled=True)
    engine.warm_up(SHAPES[:1], engine.task.worst_case, capture=CudaCapture(CUDA), echo=print)
    assert engine.mode == "graphed" and engine.compiled
    for group in engine._opt.param_groups:
        group["lr"] = 0.0  # replays read it: the weights stay, only dropout can differ
    totals = []
    for _ in range(3):
        engine._graphs.replay([_batch(0)])
        totals.append(engine._totals._sums["loss"].item())  # running sum over the replays
    losses = [totals[0], totals[1] - totals[0], totals[2] - totals[1]]
    assert len({round(x, 6) for x in losses}) == 3  # each replay drew its own masks


def test_compiled_step_equals_eager(tmp_path):
    (eager,) = _engines(tmp_path, 1)
    (compiled,) = _engines(tmp_path, 1, compiled=True)
    for i in range(4):
        eager.step([_batch(i)])
        compiled.step([_batch(i)])
    assert eager.mode == "eager" and compiled.mode == "compiled"
    _close(eager, compiled, rtol=2e-3, atol=2e-4)  # fused kernels reassociate sums


def test_compiled_and_graphed_step_equals_eager(tmp_path):
    """The trainer's mode on a GPU: compiled blocks inside each shape's captured graph."""
    (eager,) = _engines(tmp_path, 1)
    (engine,) = _engines(tmp_path, 1, compiled=True)
    report = engine.warm_up(SHAPES, engine.task.worst_case, capture=CudaCapture(CUDA), echo=print)
    assert report.capture_error is None and report.shapes_captured == 2
    assert engine.mode == "graphed" and engine.compiled
    for i in range(6):
        batch = _batch(i)
        assert engine._graphs.ready([batch])
        eager.step([batch])
        engine.step([batch])
    _close(eager, engine, rtol=2e-3, atol=2e-4)


@pytest.mark.parametrize("graphed", [False, True])
def test_the_step_never_syncs_with_the_host(tmp_path, graphed):
    (engine,) = _engines(tmp_path, 1, "train.self_feed=0.5", "train.precision=bf16",
                         "train.ema_decay=0.999")
    batches = [_batch(i) for i in range(4)]  # made (copied to the GPU) before the check
    assert_steps_never_sync(engine, SHAPES, batches, graphed)


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_sends_float16_and_the_feed_casts_on_the_gpu(micro_store, tmp_path, workers):
    """What crosses PCIe is float16 in pinned memory (half the bytes; through the workers'
    shared slots too); the side-stream feed casts it to float32 on the GPU, exactly."""
    from myxtts.data.feed.loader import build_loader
    from myxtts.data.feed.prefetch import CopyFeed

    cfg = micro_config(tmp_path, "train.device=cuda")
    loader, _ = build_loader(micro_store, cfg, device=CUDA, num_workers=workers, shuffle=False)
    sent = list(loader)
    assert sent and all(b["mel"].dtype == torch.float16 and b["ref_mel"].dtype == torch.float16
                        and all(t.is_pinned() for t in b.values()) for b in sent)
    got = list(CopyFeed(sent, CUDA, ahead=2))
    assert len(got) == len(sent)
    for src, (dev, frames) in zip(sent, got):
        assert frames == int(src["mel_lengths"].sum())
        assert dev["mel"].is_cuda and dev["mel"].dtype == torch.float32
        assert torch.equal(dev["mel"].cpu(), src["mel"].float())
        assert torch.equal(dev["ref_mel"].cpu(), src["ref_mel"].float())


def test_auto_budget_sizes_run_without_running_out_of_memory(tmp_path):
    (engine,) = _engines(tmp_path, 1, "data.auto_batch_memory_share=0.05",
                         "data.max_batch_size=0")
    sizes = auto_batch_sizes(engine, SHAPES, [4, 4], engine.cfg, tmp_path / "run",
                             engine.task.worst_case,
                             DistInfo(), echo=print)
    limit = 0.05 * torch.cuda.get_device_properties(CUDA).total_memory
    for shape, b in zip(SHAPES, sizes):
        torch.cuda.reset_peak_memory_stats(CUDA)
        engine.run([worst_case_batch(BatchShape(b, shape.text, shape.frames, shape.ref_frames,
                                              N_MELS), N_TOKENS, 1, CUDA)])
        torch.cuda.synchronize()
        assert torch.cuda.max_memory_allocated(CUDA) <= limit * 1.05


def test_a_resumed_cuda_run_matches_the_uninterrupted_one(micro_store, tmp_path):
    """CUDA kernels with atomics (embedding and attention backward) are not bit-reproducible,
    so resume on CUDA is equal within a tolerance (docs/gpus.md, "Measured"): after 10 graphed
    bf16 steps, each weight tensor within 1e-3 of its norm (relative L2 distance), and the
    step counts and the data position exact. A per-element bound would be fragile: AdamW's
    normalised update turns a sign flip of a near-zero gradient into a full +-lr step."""
    from myxtts.train.tts import train

    common = ("train.max_steps=10", "train.ckpt_every=3", "train.val_every=5",
              "train.device=cuda", "train.compile=off", "data.batch_frames=1200")
    train(micro_config(tmp_path / "full", *common), micro_store, progress=False)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train_crashing_at(micro_config(tmp_path / "part", *common), micro_store, call=8)
    assert train(micro_config(tmp_path / "part", *common), micro_store, progress=False).step == 10
    full = ck.load(CheckpointManager(tmp_path / "full" / "checkpoints", 9).latest())
    part = ck.load(CheckpointManager(tmp_path / "part" / "checkpoints", 9).latest())
    where = [(p.step, p.epoch, p.batches_consumed) for p in
             (ck.TrainingProgress.from_state_dict(s[ck.PROGRESS]) for s in (full, part))]
    assert where[0] == where[1] and where[0][0] == 10
    a, b = full[ck.MODEL], part[ck.MODEL]
    for k in a:
        if a[k].is_floating_point():
            distance = (b[k].float() - a[k].float()).norm() / a[k].float().norm().clamp_min(1e-12)
            assert distance <= 1e-3, f"{k} after resume: relative distance {distance:.2e}"
        else:
            assert torch.equal(a[k], b[k]), k


def test_a_default_cuda_run_trains_validates_and_synthesises(micro_store, tmp_path, caplog):
    """``myxtts train``'s defaults on a GPU, end to end: measured batch sizes (at the default
    85 % share, less what validation and samples need beside the graphs), compiled
    blocks, every shape captured before step 1, graphed steps, validation and sample
    synthesis between them (beside the graphs' memory pool), checkpoints; and nothing
    compiled once step 1 began (validation and synthesis run the blocks eagerly)."""
    import logging
    from unittest import mock

    from myxtts.train.engine.budget import CACHE_NAME
    from myxtts.train.engine.compile import compiled_graphs
    from myxtts.train.tts import train

    cfg = micro_config(tmp_path, "train.device=auto", "train.compile=auto",
                       "train.cuda_graphs=auto", "train.precision=auto", "data.batch_frames=auto",
                       "train.max_steps=6", "train.val_every=3", "train.synth_every=3",
                       "train.synth_sentences=2", "model.max_decoder_frames=60",
                       "train.ckpt_every=3")
    graphs_at_step: list[int] = []
    real = TrainEngine.step

    def counting(self, batches):
        graphs_at_step.append(compiled_graphs())
        return real(self, batches)

    with caplog.at_level(logging.INFO), mock.patch.object(TrainEngine, "step", counting):
        record = train(cfg, micro_store, progress=False)
    assert record.step == 6 and len(graphs_at_step) == 6
    assert compiled_graphs() == graphs_at_step[0] > 0  # all compiled in the warm-up
    text = caplog.text
    assert "graphed step" in text, text[-2000:]  # the warm-up's summary line
    assert "CUDA graph capture failed" not in text and "falling back to eager" not in text
    # the budget kept room beside the graphs' pool for validation and samples, and the
    # post-warm-up check found the pool and that room within the GPU's share
    assert "kept beside the CUDA graphs" in text and "capturing again" not in text
    assert (tmp_path / CACHE_NAME).is_file()
    assert len(sorted((tmp_path / "samples" / "step_00000006").glob("val*.wav"))) == 2


def test_profile_times_the_graphed_step_with_cuda_events(micro_store, tmp_path):
    """On a GPU the profile runs the trainer's graphed step: forward and backward are one
    replay, the side-stream copy is timed, and MFU/utilisation come from the package."""
    from myxtts.diagnose.profile.run import profile

    cfg = micro_config(tmp_path / "run", "train.device=cuda", "train.compile=off",
                       "data.batch_frames=1200")
    p = profile(cfg, micro_store, steps=6, trace_dir=tmp_path / "trace", echo=lambda s: None)
    assert p["timing"].startswith("CUDA events") and p["setup"]["step_mode"] == "graphed"
    phases = p["phases"]
    assert "forward+backward" in phases and "forward" not in phases
    assert phases["host->device copy"]["mean_s"] > 0
    parts = sum(v["mean_s"] for k, v in phases.items() if k not in ("step", "host->device copy"))
    assert parts == pytest.approx(phases["step"]["mean_s"], rel=1e-6)
    assert p["memory"]["kind"] == "GPU" and 0 < p["memory"]["peak_gib"] < p["memory"]["total_gib"]
    assert p["tflops"] > 0 and p["recompiles"] == 0
    assert (tmp_path / "trace").is_dir() and any((tmp_path / "trace").iterdir())
