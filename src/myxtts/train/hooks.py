"""What the training loop calls that lives above it: the evaluation every
``train.eval_every`` steps.

Scoring a run needs the speech metrics and the run's evaluation record, which sit in
``myxtts.evaluate``, a layer above ``train``; so the loop imports none of it and is handed
a factory of this shape instead (``myxtts train`` and ``myxtts demo`` pass
``myxtts.evaluate.training.TrainingEvaluation``; for an XTTS-v2 fine-tuning run ``myxtts
train`` passes ``myxtts.evaluate.xtts_training.XttsTrainingEvaluation``, whose data is the
recipe). The loop builds the evaluation once its
data and device are set up and calls it at each ``eval_every`` step and the last step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch

from myxtts.config import Config
from myxtts.observe.loggers import MetricLogger
from myxtts.train.engine import TrainEngine


class StepEvaluation(Protocol):
    """Scores the run at ``step`` and logs it; rank 0 scores, the others return None at
    once. Returns the logged means (None: nothing was scored)."""

    def __call__(self, engine: TrainEngine, logger: MetricLogger, step: int,
                 rank: int) -> dict[str, float] | None: ...


class EvaluationFactory(Protocol):
    """Builds the run's :class:`StepEvaluation` from its config, its data (the trainer's
    ``TrainData``: the validation loader; an XTTS-v2 run's recipe: its base model and
    validation store), the device and the run folder it writes to."""

    def __call__(self, cfg: Config, data: Any, device: torch.device,
                 out: Path) -> StepEvaluation: ...
