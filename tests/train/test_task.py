"""The engine serves any model family through a ``StepTask``: a task with batch fields of
its own trains, warms up on its own worst cases and reads back its own loss terms; without
a task the engine runs the TTS model's (``TTSTask``), as before."""

from __future__ import annotations

import torch
from torch import nn

from myxtts.data.batch import BatchShape
from myxtts.model.dummy import worst_case_batch
from myxtts.model.losses import compute_losses
from myxtts.model.xtts import build_model
from myxtts.train.distributed import DistInfo
from myxtts.train.engine import StepTask, TrainEngine, TTSTask, Workload
from tests.helpers import micro_config
from tests.train.graph_recorder import RecordingCapture

WIDTH = 8
CPU = torch.device("cpu")
# (batch, text, frames, ...): the task reads ``frames`` as its sequence length
SHAPES = [BatchShape(4, 1, 12, 1, WIDTH), BatchShape(2, 1, 24, 1, WIDTH)]


class Block(nn.Module):
    """The regression model's repeated block (what a compiled run would compile)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.linear(x)


class Regressor(nn.Module):
    """A model of another family: no ``set_activation_checkpointing``, no TTS parts."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.out = nn.Linear(WIDTH, 1)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            inputs = block(inputs)
        return self.out(inputs)[..., 0]


class RegressionTask:
    """Batches of ``inputs`` [B, T, WIDTH] and ``targets`` [B, T] (a fixed linear map of the
    inputs); loss terms ``mse`` (the total) and ``l1``. Records the worst cases it made."""

    block_types = (Block,)

    def __init__(self) -> None:
        self.made: list[BatchShape] = []
        self.weight = torch.randn(WIDTH, generator=torch.Generator().manual_seed(1))

    def batch(self, b: int, t: int, seed: int, device: torch.device | str = CPU
              ) -> dict[str, torch.Tensor]:
        inputs = torch.randn(b, t, WIDTH, generator=torch.Generator().manual_seed(seed))
        return {"inputs": inputs.to(device), "targets": (inputs @ self.weight).to(device)}

    def losses(self, runner, batch, self_feed):
        error = runner(batch["inputs"]) - batch["targets"]
        mse = error.pow(2).mean()
        return {"loss": mse, "mse": mse.detach(), "l1": error.abs().mean()}

    def worst_case(self, shape: BatchShape, device) -> dict[str, torch.Tensor]:
        self.made.append(shape)
        return self.batch(shape.batch, shape.frames, seed=0, device=device)

    def describe(self, batch) -> str:
        return f"{batch['inputs'].shape[0]} items x {batch['inputs'].shape[1]} steps"


def _engine(tmp_path, task: StepTask) -> TrainEngine:
    torch.manual_seed(0)
    cfg = micro_config(tmp_path, "train.lr=0.01", "train.warmup_steps=1", "train.ema_decay=0")
    return TrainEngine(cfg, Regressor(), CPU, DistInfo(), task=task)


def test_a_task_with_its_own_batch_fields_trains_and_reads_back_its_terms(tmp_path, one_thread):
    task = RegressionTask()
    engine = _engine(tmp_path, task)
    assert engine.task is task and engine.mode == "eager"
    means = []
    for i in range(12):
        engine.step([task.batch(4, 12, seed=100 + i)])
        if i % 4 == 3:
            values = engine.read()
            assert {"loss", "mse", "l1", "grad_norm", "lr"} <= set(values)
            assert values["loss"] == values["mse"]  # each term's mean, as the task named it
            means.append(values["loss"])
    assert means[2] < means[1] < means[0]


def test_the_warm_up_and_start_up_run_the_tasks_worst_cases(tmp_path, one_thread):
    task = RegressionTask()
    engine = _engine(tmp_path, task)
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    report = engine.warm_up(SHAPES, task.worst_case, capture=RecordingCapture(),
                            echo=lambda s: None)
    assert set(task.made) == set(SHAPES)  # every shape's worst case, run and captured
    assert report.shapes_captured == 2 and engine.mode == "graphed"
    assert all(torch.equal(v, before[k]) for k, v in engine.model.state_dict().items())
    assert engine.read() == {}  # the trial steps left no sums behind
    batch = task.batch(2, 24, seed=7)
    engine.step([batch])  # a replay of the captured graph, on the task's fields
    assert engine.uncaptured_steps == 0 and set(engine.read()) >= {"loss", "mse", "l1"}
    # a CPU run with eager blocks needs no start-up: the planned sizes come back
    assert engine.start_up(Workload(SHAPES, task.worst_case)) == [4, 2]


def test_without_a_task_the_engine_runs_the_tts_models(tmp_path, one_thread):
    cfg = micro_config(tmp_path, "audio.n_mels=16")
    model = build_model(cfg, 30, 2, None, None)
    engine = TrainEngine(cfg, model, CPU, DistInfo())
    task = engine.task
    assert isinstance(task, TTSTask) and (task.n_tokens, task.n_languages) == (30, 2)
    assert task.block_types == TTSTask.block_types
    shape = BatchShape(2, 10, 20, 8, 16)
    batch = task.worst_case(shape, CPU)
    expected = worst_case_batch(shape, 30, 2, CPU)
    assert batch.keys() == expected.keys()
    assert all(torch.equal(batch[k], expected[k]) for k in batch)
    torch.manual_seed(3)
    got = engine.loss(batch)
    torch.manual_seed(3)
    want = compute_losses(model(batch), batch, cfg.train)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
    assert task.describe(batch) == "2 utterances x 20 frames, text 10"
