"""The auto batch budget: the search, out-of-memory recovery, the cache and its key, the
error for a GPU too small, and the loader built from per-bucket sizes. A stand-in memory
plays the GPU: a step over ``budget`` frames raises CUDA's out-of-memory error."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

from myxtts.data.batch import BatchShape
from myxtts.train.distributed import DistInfo
from myxtts.train.engine.budget import CACHE_NAME, auto_batch_sizes, largest_fitting
from myxtts.train.errors import TrainError
from tests.helpers import micro_config
from tests.train.test_graphs import N_MELS, N_TOKENS, engine_for


@pytest.mark.parametrize("largest", [0, 1, 5, 37, 64, 100, 1000])
@pytest.mark.parametrize("start", [1, 8, 50])
def test_the_search_finds_the_largest_fitting_size_in_few_tries(largest, start):
    tried: list[int] = []

    def fits(b: int) -> bool:
        tried.append(b)
        return b <= largest

    got = largest_fitting(fits, start, cap=256)
    expected = min(largest, 256)
    assert got <= expected and expected - got <= max(1, expected // 16)  # within ~6 %
    assert len(tried) == len(set(tried)) <= 16  # never the same size twice; O(log)
    assert all(1 <= b <= 256 for b in tried)


class FakeMemory:
    """A GPU's memory as the probe sees it: a name, a size, a peak within the limit."""

    name, total, available, released = "Fake GPU 24GB", 24 * 2**30, 24 * 2**30, 0

    def reset_peak(self) -> None:
        pass

    def peak(self) -> int:
        return 2**30

    def release(self) -> None:
        self.released += 1


class FakeGpu(FakeMemory):
    """A device with ``budget`` mel frames of room: larger worst cases run out of memory
    partway through the step (after the model's forward), as on a GPU."""

    def __init__(self, engine, budget: int, name: str = "Fake GPU 24GB",
                 error=lambda: torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to "
                                                           "allocate 2 GiB")) -> None:
        self.name, self.budget = name, budget
        self.runs: list[int] = []
        self.released = 0
        real = engine.model.forward

        def forward(batch, *args, **kwargs):
            frames = batch["mel"].shape[0] * batch["mel"].shape[1]
            self.runs.append(frames)
            out = real(batch, *args, **kwargs)
            if frames > self.budget:  # some work done, then the allocation fails
                raise error()
            return out

        engine.model.forward = forward


SHAPES = [BatchShape(1, 16, 24, 12, N_MELS), BatchShape(1, 24, 48, 12, N_MELS),
          BatchShape(1, 32, 96, 12, N_MELS)]


def _probe(tmp_path, step, gpu, echo=None, **kw):
    lines: list[str] = []
    sizes = auto_batch_sizes(step, SHAPES, [4, 4, 4], step.cfg, tmp_path / "run",
                             step.task.worst_case,
                             DistInfo(), memory=gpu, echo=echo or lines.append, **kw)
    return sizes, lines


def test_sizes_fit_the_memory_and_training_state_is_untouched(tmp_path, one_thread):
    cfg = micro_config(tmp_path, f"audio.n_mels={N_MELS}", "data.max_batch_size=0")
    step = engine_for(cfg)
    before = {k: v.clone() for k, v in step.model.state_dict().items()}
    gpu = FakeGpu(step, budget=1000)
    sizes, lines = _probe(tmp_path, step, gpu)
    for s, b in zip(SHAPES, sizes):  # the largest fitting, within the search's tolerance
        best = 1000 // s.frames
        assert b * s.frames <= 1000 and best - b <= max(1, best // 16), (s, b)
    assert gpu.released >= 1  # caches given back after an out-of-memory error
    assert gpu.runs[0] == 96 * 4  # longest bucket first, from its start size
    for k, v in step.model.state_dict().items():
        assert torch.equal(v, before[k]), f"{k} changed by the probe"
    assert all(p.grad is None or not p.grad.any() for p in step.model.parameters())
    table = "\n".join(lines)
    assert "measuring each bucket's worst case on 20.4 GiB (85% of Fake GPU 24GB" in table
    assert f"{'2':>6} {96:>6} {32:>6} {sizes[2]:>6}" in table  # per-bucket row
    progress = [s for s in lines if s.startswith("auto batch sizes ") and "/3: bucket" in s]
    assert [s.split(":")[1].split("(")[0].strip() for s in progress] == [
        "bucket 2", "bucket 1", "bucket 0"]  # one line per bucket as it is measured
    assert f"bucket 2 (96 frames) fits {sizes[2]} utterances (tried 4, " in progress[0]


@pytest.mark.parametrize("message", [
    "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
])
def test_a_library_allocation_failure_counts_as_out_of_memory(tmp_path, one_thread, message):
    """Near the limit cuBLAS and cuDNN fail to allocate their workspace with a plain
    RuntimeError, not torch's OutOfMemoryError: the probe lowers the size all the same."""
    cfg = micro_config(tmp_path, f"audio.n_mels={N_MELS}", "data.max_batch_size=0")
    step = engine_for(cfg)
    sizes, _ = _probe(tmp_path, step, FakeGpu(step, budget=1000, error=lambda: RuntimeError(message)))
    assert all(b * s.frames <= 1000 and b >= 1 for s, b in zip(SHAPES, sizes))


def test_any_other_error_while_probing_is_not_taken_for_a_full_gpu(tmp_path, one_thread):
    cfg = micro_config(tmp_path, f"audio.n_mels={N_MELS}")
    step = engine_for(cfg)
    with pytest.raises(RuntimeError, match="an unrelated bug"):
        _probe(tmp_path, step, FakeGpu(step, budget=1000,
                                       error=lambda: RuntimeError("an unrelated bug")))


class SharedGpu(FakeMemory):
    """12 of the 24 GiB are held by another process; every size peaks at 11 GiB."""

    def __init__(self, available: int = 12 * 2**30) -> None:
        self.available = available

    def peak(self) -> int:
        return 11 * 2**30


def test_memory_other_processes_hold_is_not_planned_for(tmp_path, one_thread):
    """85 % of 24 GiB would admit an 11 GiB peak; 85 % of the 12 GiB left does not."""
    cfg = micro_config(tmp_path, f"audio.n_mels={N_MELS}")
    with pytest.raises(TrainError, match=r"fits in 10.2 GiB \(85% of Fake GPU 24GB, 24.0 GiB; "
                                         r"12.0 GiB held by other processes\)"):
        _probe(tmp_path, engine_for(cfg), SharedGpu())
    assert all(b >= 1 for b in _probe(tmp_path, engine_for(cfg), FakeMemory())[0])


@pytest.mark.slow
def test_a_restart_reads_the_cache_and_another_gpu_measures_again(tmp_path, one_thread):
    cfg = micro_config(tmp_path, f"audio.n_mels={N_MELS}")
    step = engine_for(cfg)
    gpu = FakeGpu(step, budget=700)
    sizes, _ = _probe(tmp_path, step, gpu)
    cache = json.loads((tmp_path / "run" / CACHE_NAME).read_text())
    assert cache["batch_sizes"] == sizes and cache["key"]["gpu"] == "Fake GPU 24GB"
    runs = len(gpu.runs)
    again, lines = _probe(tmp_path, step, gpu)
    assert again == sizes and len(gpu.runs) == runs  # nothing ran
    assert "from " in lines[-1]
    other_step = engine_for(cfg)
    bigger, lines = _probe(tmp_path, other_step,
                           FakeGpu(other_step, budget=1400, name="Fake GPU 48GB"))
    assert "was measured with gpu = \"Fake GPU 24GB\", this run has \"Fake GPU 48GB\"" in lines[0]
    assert all(b >= a for a, b in zip(sizes, bigger)) and bigger != sizes
    # settings that change a step's memory measure again too
    settings = []
    for setting, key in (("train.activation_checkpointing=true", "activation_checkpointing"),
                         ("train.self_feed=0.5", "self_feed")):
        settings.append(setting)  # one more change each time
        changed = micro_config(tmp_path, f"audio.n_mels={N_MELS}", *settings)
        changed_step = engine_for(changed)
        _, lines = _probe(tmp_path, changed_step, FakeGpu(changed_step, budget=1400,
                                                           name="Fake GPU 48GB"))
        assert f"was measured with {key} = " in lines[0], lines[0]


def test_a_gpu_too_small_for_one_utterance_is_a_clear_error(tmp_path, one_thread):
    cfg = micro_config(tmp_path, f"audio.n_mels={N_MELS}")
    step = engine_for(cfg)
    with pytest.raises(TrainError, match=r"bucket 2 \(96 mel frames, 32 text tokens\): not "
                                         r"even one utterance fits .*data.max_duration_s"):
        _probe(tmp_path, step, FakeGpu(step, budget=50))


def test_the_loader_takes_one_batch_size_per_bucket(micro_store, tmp_path):
    from myxtts.data.feed.loader import build_loader

    cfg = micro_config(tmp_path)
    _, planned = build_loader(micro_store, cfg)
    sizes = [k + 1 for k in range(len(planned.boundaries))]
    loader, sampler = build_loader(micro_store, cfg, plan=planned.plan.with_batch_sizes(sizes))
    assert sampler.boundaries == planned.boundaries  # same buckets, other sizes
    assert sampler.bucket_batch_sizes == sizes
    for batch in loader:
        k = sampler.boundaries.index(batch["mel"].shape[1])
        assert batch["mel"].shape[0] == sizes[k]
    with pytest.raises(ValueError, match="batch_sizes must give each of the"):
        planned.plan.with_batch_sizes([2])


def test_the_train_loader_is_built_once_for_the_engines_batch_sizes(micro_store, tmp_path,
                                                                     monkeypatch):
    """The TTS recipe's setup plans the buckets from the lengths, the engine sizes them (here sizes
    of its own, as ``data.batch_frames=auto`` measures them on a GPU), and only then is the
    train loader built, once, for that plan; the data position is restored on it."""
    import myxtts.train.data as data_mod
    from myxtts.train.data import bucket_shapes
    from myxtts.train.engine import TrainEngine
    from myxtts.train.tts import TTSRecipe

    built: list[str] = []
    real = data_mod.build_loader

    def counting(store, cfg, **kw):
        built.append(kw.get("split", "train"))
        return real(store, cfg, **kw)

    seen: dict[str, Any] = {}

    def start_up(engine, work):
        seen["built"] = list(built)  # the loaders that existed when the engine sized buckets
        seen["sizes"] = [s.batch + 1 for s in work.shapes]
        return seen["sizes"]

    monkeypatch.setattr(data_mod, "build_loader", counting)
    monkeypatch.setattr(TrainEngine, "start_up", start_up)
    cfg = micro_config(tmp_path)
    run = TTSRecipe(cfg, micro_store, show_progress=False)
    run.setup()
    sizes = seen["sizes"]
    assert "train" not in seen["built"] and built.count("train") == 1  # built once, after
    assert run.data.sampler.bucket_batch_sizes == sizes
    assert [s.batch for s in bucket_shapes(run.data.sampler, cfg)] == sizes
    assert run.record.data_plan == run.data.sampler.plan_state()  # the position's plan
    epoch, indices = next(iter(run.data.sampler))  # the sampler yields (epoch, indices)
    assert epoch == 0 and len(indices) == sizes[run.data.sampler.bucket_of[indices[0]]]
    for batch in run.data.loader:
        k = run.data.sampler.boundaries.index(batch["mel"].shape[1])
        assert batch["mel"].shape[0] == sizes[k]


def test_memory_running_out_inside_adamws_first_step_leaves_no_half_made_state(
        tmp_path, one_thread, monkeypatch):
    """An out-of-memory error while AdamW creates its state (first step of a fresh run)
    leaves some parameters with part of it; the trial step clears those, so the next size's
    step (and training after the probe) initialise them whole."""
    cfg = micro_config(tmp_path, f"audio.n_mels={N_MELS}", "data.max_batch_size=0")
    engine = engine_for(cfg)
    opt = engine._opt
    budget, real_step, sizes_seen = 600, opt.step, []
    real_forward = engine.model.forward

    def forward(batch, *args, **kwargs):
        sizes_seen.append(batch["mel"].shape[0] * batch["mel"].shape[1])
        return real_forward(batch, *args, **kwargs)

    def adamw_step(*args, **kwargs):
        if sizes_seen[-1] > budget:
            first = next(p for group in opt.param_groups for p in group["params"])
            opt.state[first] = {"step": torch.zeros(())}  # half made, then no memory
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB")
        return real_step(*args, **kwargs)

    monkeypatch.setattr(engine.model, "forward", forward)
    monkeypatch.setattr(opt, "step", adamw_step)
    sizes, _ = _probe(tmp_path, engine, FakeMemory())
    assert all(b * s.frames <= budget for s, b in zip(SHAPES, sizes))
    assert {tuple(sorted(st)) for st in opt.state.values()} <= {
        (), ("exp_avg", "exp_avg_sq", "step")}  # none, or whole
    monkeypatch.undo()
    engine.step([_batches_for(SHAPES[0])])  # a real step afterwards initialises AdamW whole
    assert all(set(st) == {"step", "exp_avg", "exp_avg_sq"} for st in opt.state.values())


def _batches_for(shape: BatchShape) -> dict[str, torch.Tensor]:
    from myxtts.model.dummy import worst_case_batch

    return worst_case_batch(shape, N_TOKENS, 1, "cpu")


def _ranks_probe(rank: int, world: int, init_file: str, out: str, budgets: list[list[int]],
                 results: Any) -> None:
    """One DDP rank (gloo, CPU) probing with its own stand-in GPU: ``budgets[k][rank]`` for
    the k-th probe. Puts ``(k, rank, sizes or error text)`` on ``results``."""
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                         world_size=world, timeout=timedelta(seconds=120))
    dist = DistInfo(True, rank, world, rank, torch.device("cpu"))
    try:
        for k, budget in enumerate(budgets):
            cfg = micro_config(Path(out), f"audio.n_mels={N_MELS}", "data.max_batch_size=0")
            step = engine_for(cfg)
            try:
                sizes = auto_batch_sizes(step, SHAPES, [4, 4, 4], cfg, Path(out) / f"run{k}",
                                         step.task.worst_case, dist,
                                         memory=FakeGpu(step, budget[rank]),
                                         echo=lambda s: None)
                results.put((k, rank, sizes))
            except TrainError as e:
                results.put((k, rank, str(e)))
        dist.close(wait_for_all=True)
    finally:
        dist.close()
    results.close()
    results.join_thread()
    os._exit(0)  # as cli.main ends a torchrun worker: no teardown racing gloo's threads


@pytest.mark.slow
def test_under_ddp_every_rank_takes_the_smallest_sizes_and_a_failure_stops_all(tmp_path):
    """Two gloo ranks whose GPUs fit 700 and 1400 frames both train at the 700-frame sizes;
    when one rank cannot fit a bucket at all, both stop with an error naming it (neither
    waits in a collective)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    budgets = [[700, 1400], [1000, 50]]
    procs = [ctx.Process(target=_ranks_probe, args=(r, 2, str(tmp_path / "init"),
                                                    str(tmp_path), budgets, results))
             for r in range(2)]
    for p in procs:
        p.start()
    got = {}
    try:
        for _ in range(4):
            k, rank, value = results.get(timeout=240)
            got[k, rank] = value
        for p in procs:
            p.join(timeout=60)
    finally:  # a rank left waiting in a collective must not outlive the test
        for p in procs:
            if p.exitcode is None:
                p.kill()
                p.join()
    assert [p.exitcode for p in procs] == [0, 0]
    alone = micro_config(tmp_path / "alone", f"audio.n_mels={N_MELS}", "data.max_batch_size=0")
    step = engine_for(alone)
    expected, _ = _probe(tmp_path / "alone", step, FakeGpu(step, budget=700))
    assert got[0, 0] == got[0, 1] == expected
    assert "not even one utterance fits" in got[1, 1]
    assert got[1, 0].startswith("rank 1 (of 2) could not start: bucket 2")


def test_what_runs_beside_the_graphs_is_kept_out_of_the_budget(tmp_path, one_thread):
    """An 11 GiB step fits 85 % of 24 GiB, but not once 10 GiB are kept for what runs
    beside the graphs' pool (validation, samples, the data role)."""
    cfg = micro_config(tmp_path, f"audio.n_mels={N_MELS}")
    with pytest.raises(TrainError, match=r"fits in 10.4 GiB .*less 10.0 GiB kept beside the "
                                         r"CUDA graphs for validation"):
        _probe(tmp_path, engine_for(cfg), SharedGpu(available=24 * 2**30), reserve=10 * 2**30)
    assert all(b >= 1 for b in _probe(tmp_path, engine_for(cfg), SharedGpu(available=24 * 2**30))[0])


class CountingMemory(FakeMemory):
    """Allocated bytes stand at 100; each measured run peaks at the next of ``peaks``."""

    def __init__(self, peaks: list[int]) -> None:
        self.peaks, self.runs = list(peaks), 0

    def allocated(self) -> int:
        return 100

    def reset_peak(self) -> None:
        self.runs += 1

    def peak(self) -> int:
        return self.peaks[self.runs - 1]


def test_the_reserve_is_a_validation_forward_plus_the_data_role(tmp_path, one_thread,
                                                                 monkeypatch):
    from myxtts.train.engine.budget import side_reserve

    step = engine_for(micro_config(tmp_path, f"audio.n_mels={N_MELS}"))
    step.model.train()
    seen = []
    real = step.loss
    monkeypatch.setattr(step, "loss", lambda batch: seen.append((
        step.model.training, torch.is_grad_enabled(), batch["mel"].shape[:2])) or real(batch))
    role = []
    need = side_reserve(step, SHAPES[2], step.task.worst_case, CountingMemory([150, 130]),
                        data_role=lambda: role.append(1))
    assert need == 50 + 30 and role == [1]
    assert seen == [(False, False, (1, 96))]  # eval mode, no gradients, the val worst case
    assert step.model.training  # put back


def test_graphs_that_leave_no_room_beside_them_shrink_every_bucket_to_3_4_at_most():
    from myxtts.train.engine.budget import shrink_for_graphs, three_quarters

    assert [three_quarters(b) for b in (1, 2, 3, 4, 8, 16)] == [1, 2, 3, 3, 6, 12]
    floors = [6, 12]  # 3/4 of a plan of [8, 16]
    assert shrink_for_graphs([8, 16], floors, reserved=10, reserve=5, cap=20) is None
    assert shrink_for_graphs([8, 16], floors, reserved=16, reserve=8, cap=20) == [6, 12]
    # half would fit, but no bucket goes below 3/4 of its plan: the floors come back
    assert shrink_for_graphs([8, 16], floors, reserved=20, reserve=10, cap=20) == [6, 12]
    # at the floors already: the same sizes back, the caller drops the graphs for the run
    assert shrink_for_graphs([6, 12], floors, reserved=16, reserve=10, cap=20) == [6, 12]
    # floors hold whatever an earlier attempt left: a size below its floor comes back at it
    # (a capture at the floor that does not fit then drops the graphs, as the rule says)
    assert shrink_for_graphs([5, 16], floors, reserved=20, reserve=10, cap=20) == [6, 12]
