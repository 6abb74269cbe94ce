"""What the GPU tests share: an uncaptured step and a replayed one, fed the same batches from
the same random state, must end with the same weights; and no step may sync with the host."""

from __future__ import annotations

import torch

from myxtts.train.engine.graphs import CudaCapture


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


def step_side_by_side(eager, graphed, batches) -> None:
    """Step ``eager`` and ``graphed`` (warmed up, its graphs captured) on each of ``batches``,
    checking first that ``graphed`` replays a graph for it rather than running it uncaptured."""
    for batch in batches:
        assert graphed._graphs.ready([batch])  # replayed, not run uncaptured
        eager.step([batch])
        graphed.step([batch])


def assert_steps_never_sync(engine, shapes: list, batches: list[dict], graphed: bool) -> None:
    """Ready ``engine`` (graphed: warmed up with its graphs captured for ``shapes``; else one
    eager step on ``batches[0]``, whose first call allocates lazily), then step on the other
    ``batches`` (already on the GPU) with CUDA's sync debug mode at "error": a host sync
    anywhere in the step raises."""
    if graphed:
        engine.warm_up(shapes, engine.task.worst_case, capture=CudaCapture(engine.device),
                       echo=print)
        assert engine.mode == "graphed"
    else:
        engine.step([batches[0]])
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for batch in batches[1:]:
            engine.step([batch])
    finally:
        torch.cuda.set_sync_debug_mode("default")
