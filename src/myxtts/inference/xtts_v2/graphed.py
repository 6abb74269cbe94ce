"""XTTS-v2's one-code decode step as a CUDA graph: on a GPU, a step of the 30-layer GPT is
some four hundred small kernels whose launches, not their work, bound the decoding of one
utterance; replaying them as one graph removes that launch cost.

The graph is captured once per utterance, after the prefill, over that utterance's KV
cache (``model.xtts_v2.blocks.StaticKVCache``): the step reads its position from the
device and attends over every cache slot under a mask (``static=True``), so every replay
has the same shapes and addresses. A batch of pieces of different lengths replays the same
way: their padding mask (``StaticKVCache.keep``) is set by the prefill, before the capture,
and stays put. The code to feed is copied into the graph's input; the
logits and the latent come out in its outputs (the latent copied, since the next replay
overwrites it). The capture costs about one step and the graph's memory pool one step's
activations. A capture that fails is undone (``model.cuda_capture``) and the utterance
decodes eagerly, with a warning once per process.
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor

from myxtts.model.cuda_capture import end_failed_capture
from myxtts.model.xtts_v2.blocks import StaticKVCache
from myxtts.model.xtts_v2.gpt import XttsGpt

log = logging.getLogger(__name__)
_warned = False


class GraphedStep:
    """``step(codes [B]) -> (logits [B, V], latent [B, D])`` replayed from a CUDA graph,
    equal to ``gpt.step(codes, cache)``; ``cache`` holds the prefilled prefix."""

    def __init__(self, gpt: XttsGpt, cache: StaticKVCache) -> None:
        device = cache.position.device
        self.cache, self.start = cache, cache.length
        self.codes = torch.full((cache.keys.shape[1],), gpt.start_audio_token, dtype=torch.long,
                                device=device)
        current = torch.cuda.current_stream(device)
        side = torch.cuda.Stream(device)
        side.wait_stream(current)
        with torch.cuda.stream(side):  # lazy initialisations (cuBLAS workspace) happen
            gpt.step(self.codes, cache, static=True)  # outside the capture
        current.wait_stream(side)
        cache.reset(self.start)  # the warm-up's slot is written again by the first replay
        self.pool = torch.cuda.graph_pool_handle()
        self.graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(self.graph, pool=self.pool, stream=side):
                self.logits, self.latent = gpt.step(self.codes, cache, static=True)
        except BaseException:
            index = device.index if device.index is not None else torch.cuda.current_device()
            end_failed_capture(index, current, self.pool)
            self.graph = None
            raise
        finally:
            cache.reset(self.start)  # the capture advanced the host count, not the device's

    def __call__(self, codes: Tensor) -> tuple[Tensor, Tensor]:
        self.codes.copy_(codes)
        self.graph.replay()
        self.cache.length += 1  # in step with the position the graph advanced on the device
        return self.logits, self.latent.clone()


def graphed_step(gpt: XttsGpt, cache: StaticKVCache):
    """A :class:`GraphedStep` over ``cache``, or None where the step cannot be captured (not
    a CUDA device, or the capture failed: then said once, and decoding stays eager)."""
    global _warned
    if cache.position.device.type != "cuda":
        return None
    try:
        return GraphedStep(gpt, cache)
    except Exception as e:  # any capture failure: the eager step gives the same codes
        if not _warned:
            log.warning("XTTS-v2 decoding runs without a CUDA graph (the capture failed: %s: "
                        "%s); each code costs its kernel launches", type(e).__name__, e)
            _warned = True
        return None
