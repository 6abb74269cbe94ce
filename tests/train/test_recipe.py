"""The one step loop (``train.recipe.Recipe.run_steps``): the events every recipe shares run
in their declared order at their intervals, a stop signal saves and leaves at the step
boundary, a step's fetch is timed and watched, and nothing but the loop calls the fetch."""

from __future__ import annotations

import ast
import signal
from pathlib import Path

import torch

from myxtts.config import load_config
from myxtts.observe.meters import StepTimer
from myxtts.train.recipe import EVENTS, Recipe
from tests.helpers import REPO


def _batch(n: int = 2) -> dict:
    return {"mel_lengths": torch.ones(n, dtype=torch.int64)}


class Counting(Recipe):
    """A recipe whose step and events only record what happened."""

    events = ("log", "validate", "samples", "checkpoint")

    def __init__(self, tmp: Path, **train: int) -> None:
        sets = [f"train.output_dir={tmp}", *(f"train.{k}={v}" for k, v in train.items())]
        super().__init__(load_config(overrides=sets), tmp, show_progress=False)
        self.happened: list[tuple[str, int]] = []
        self.stop_at: int | None = None

    def setup(self) -> None:
        pass  # (nothing to build: the step below records)

    def batches(self):
        while True:
            yield _batch(), 10

    def step(self, micro):
        self.record.step += 1
        self.happened.append(("step", self.record.step))
        if self.stop_at == self.record.step:
            signal.raise_signal(signal.SIGTERM)  # arrives inside the step, as a user's would

    def checkpoint_extra(self):
        return {}

    def weights_fix(self):
        return "nothing"

    def save_checkpoint(self, val_loss=None, is_best=False):
        self.saved_step = self.record.step
        self.happened.append(("save", self.record.step))
        return Path(f"ckpt_{self.record.step}")

    def log(self, step):
        self.timer.collect()
        self.happened.append(("log", step))

    def validate(self, step):
        self.happened.append(("validate", step))

    def samples(self, step):
        self.happened.append(("samples", step))


def test_the_events_run_in_their_declared_order_at_their_intervals(tmp_path):
    recipe = Counting(tmp_path, max_steps=6, log_every=2, val_every=3, synth_every=0,
                      ckpt_every=4)
    result = recipe.train()
    events = [e for e in recipe.happened if e[0] != "step"]
    assert events == [("log", 2), ("validate", 3), ("log", 4), ("save", 4), ("log", 6),
                      ("validate", 6), ("save", 6)]  # samples off (0); no second save at 6
    assert result.step == 6 and result.last_checkpoint == Path("ckpt_6")
    assert [name for name, _ in EVENTS] == ["log", "validate", "samples", "evaluate",
                                            "checkpoint"]


def test_a_stop_signal_saves_the_finished_step_and_leaves_at_its_boundary(tmp_path):
    recipe = Counting(tmp_path, max_steps=50, log_every=100, val_every=100, synth_every=0,
                      ckpt_every=100)
    recipe.stop_at = 3
    result = recipe.train()
    assert recipe.happened[-2:] == [("step", 3), ("save", 3)]
    assert result.step == 3 and result.stopped_by == signal.SIGTERM


def test_run_steps_without_events_writes_nothing_and_is_watched(tmp_path):
    recipe = Counting(tmp_path, max_steps=50, log_every=1, val_every=1, ckpt_every=1)
    seen = []

    class Watch:
        def fetching(self):
            seen.append("fetching")

        def fetched(self):
            seen.append("fetched")

        def stepped(self, micro, frames):
            seen.append(("stepped", len(micro), frames))

    timer = StepTimer(torch.device("cpu"))
    recipe.run_steps(2, timer=timer, watch=Watch())
    assert recipe.happened == [("step", 1), ("step", 2)]  # no log, validation or save
    assert seen == ["fetching", "fetched", ("stepped", 1, 10)] * 2
    assert timer.collect().utterances_per_s > 0  # both steps' utterances were counted


def test_the_step_loop_is_written_once():
    """``next_micro`` (a step's fetch, timed as data wait) is called by the recipe's loop
    alone, in the package and in the benchmarks: profile and benchmarks step through it."""
    callers = []
    for root in ("src/myxtts", "benchmarks"):
        for path in sorted((REPO / root).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "next_micro":
                    callers.append(path.relative_to(REPO).as_posix())
    assert callers == ["src/myxtts/train/recipe.py"]


def test_a_class_name_means_one_thing():
    """No two classes of the package share a name (one ``BatchStream``, one loop context)."""
    where: dict[str, list[str]] = {}
    for path in sorted((REPO / "src").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(path.relative_to(REPO).as_posix())
    assert {k: v for k, v in where.items() if len(v) > 1} == {}
