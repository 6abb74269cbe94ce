"""A checkpoint's moving average of the weights (``train.ema_decay``), as the readers of a run
use it: validation, samples, ``myxtts synthesize`` and ``export`` speak with the average
unless told to use the trained weights (``--raw-weights``)."""

from __future__ import annotations

from typing import Any

import torch

# checkpoint keys of the average (the ``ema`` entry of a checkpoint)
WEIGHTS = "weights"  # parameter name -> averaged tensor
UPDATES = "updates"  # how many steps the average took in (a 0-dim tensor)


def averaged_state(model_state: dict[str, torch.Tensor], ema_state: dict[str, Any] | None
                   ) -> dict[str, torch.Tensor]:
    """A model state dict with the averaged weights of ``ema_state`` in place of the raw
    ones (the rest -- buffers, untrained parameters -- as saved); ``model_state`` itself when
    there is no average."""
    if not ema_state:
        return model_state
    return {**model_state, **{k: v for k, v in ema_state[WEIGHTS].items() if k in model_state}}
