"""What the GPU tests share: an uncaptured step and a replayed one, fed the same batches from
the same random state, must end with the same weights."""

from __future__ import annotations

import torch


def assert_replays_like_eager(eager, graphed, batches: list[dict]) -> None:
    """Run ``eager`` and ``graphed`` (two ``TrainEngine``s built alike, ``graphed`` warmed up
    with its graphs) on each batch from the same CUDA random state, then compare every weight
    (dropout masks included: a replay must draw what the uncaptured step draws)."""
    device = next(eager.model.parameters()).device
    for batch in batches:
        state = torch.cuda.get_rng_state(device)
        eager.step([batch])
        torch.cuda.set_rng_state(state, device)
        graphed.step([batch])
    for (name, a), b in zip(eager.model.state_dict().items(), graphed.model.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=f"{name} differs")
