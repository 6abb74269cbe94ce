"""XTTS-v2's GPT as a step of the training engine (``train.engine.StepTask``): its losses,
the worst-case batch of a bucket shape and the blocks compiled one at a time.

The worst case of a shape fills every row: ``L`` text tokens, the bucket's ``T`` code
positions (a clip of ``(T - 3) * 1024`` samples) and a full voice segment, so no real batch of
the bucket needs more memory (the warm-up, the auto batch sizes and the CUDA graphs' capture
run it). Its content comes from a fixed private generator.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from myxtts.data.batch import BatchShape
from myxtts.model.xtts_v2.blocks import GptBlock


class XttsTask:
    """``train.engine.StepTask`` of ``model.xtts_v2.trainee.XttsGptTrainee``: ``n_text`` and
    ``n_codes`` are the vocabulary sizes the worst case draws ids from; ``code_stride`` the
    audio samples per code."""

    block_types: tuple[type[nn.Module], ...] = (GptBlock,)

    def __init__(self, n_text: int, n_codes: int, code_stride: int = 1024) -> None:
        self.n_text, self.n_codes, self.stride = int(n_text), int(n_codes), int(code_stride)

    def losses(self, runner: nn.Module, batch: dict[str, Tensor], self_feed: Tensor | None
               ) -> dict[str, Tensor]:
        return runner(batch)

    def worst_case(self, shape: BatchShape, device: torch.device | str) -> dict[str, Tensor]:
        b, gen = shape.batch, torch.Generator().manual_seed(0)
        positions = shape.frames
        batch = {
            "text": torch.randint(4, max(self.n_text, 5), (b, shape.text), generator=gen),
            "text_lengths": torch.full((b,), shape.text, dtype=torch.long),
            "codes": torch.randint(0, self.n_codes, (b, positions), generator=gen),
            "code_lengths": torch.full((b,), positions - 3, dtype=torch.long),
            "wav_lengths": torch.full((b,), (positions - 3) * self.stride, dtype=torch.long),
            "cond_audio": torch.randn(b, shape.ref_frames, generator=gen) * 0.1,
            "cond_lengths": torch.full((b,), shape.ref_frames, dtype=torch.long),
            "cond_idxs": torch.tensor([[0, shape.ref_frames]] * b, dtype=torch.long),
            "indices": torch.arange(b, dtype=torch.long),
        }
        return {k: v.to(device) for k, v in batch.items()}

    def describe(self, batch: dict[str, Tensor]) -> str:
        b, t = batch["codes"].shape
        return f"{b} utterances x {t} code positions (text {batch['text'].shape[1]} tokens)"
