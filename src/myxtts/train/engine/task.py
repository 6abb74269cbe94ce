"""What the engine needs of a model family: :class:`StepTask`, and the TTS model's
(:class:`TTSTask`).

The engine (the step, warm-up, auto batch sizes, compiled blocks, CUDA graphs, totals,
snapshots, DDP) knows nothing of a batch's fields nor of a model's losses: a task says how
one batch becomes its loss terms, which blocks are compiled, what the worst case of a
bucket shape is (the batch the warm-up, the batch-size probe and the capture run) and how a
batch is named in messages. A model family with other batch fields (XTTS-v2's GPT: text
ids, DVAE codes, conditioning mels) brings a task of its own; ``TrainEngine(task=None)``
takes the TTS model's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from myxtts.config import Config
from myxtts.data.batch import BatchShape
from myxtts.model.conditioning import ResamplerLayer
from myxtts.model.decoder import DecoderLayer
from myxtts.model.dummy import worst_case_batch
from myxtts.model.layers import EncoderLayer
from myxtts.model.losses import compute_losses

# ``worst_case(shape, device)``: a bucket's worst-case batch (``StepTask.worst_case``), what
# the warm-up, the batch-size probe and the room beside the CUDA graphs run
WorstCase = Callable[[BatchShape, torch.device], dict[str, Tensor]]


class StepTask(Protocol):
    """A model family as the engine trains it.

    ``block_types``: the module types ``compile.CompiledBlocks`` compiles regionally (every
    instance of a type shares one graph); ``losses``: the loss terms of one batch run
    through ``runner`` (the model, or its DDP wrapper), ``"loss"`` the total that is
    back-propagated, every other entry a term ``totals.StepTotals`` sums and reads back
    (0-dim float tensors, the same keys every step: a CUDA graph writes fixed addresses);
    ``self_feed``: the step's scheduled-sampling probability on the device (None: teacher
    forcing, e.g. in validation), for a task whose model has one; ``worst_case``: a batch
    of ``shape`` whose every item fills it (nothing of that bucket needs more memory), on
    ``device``, drawn from a private generator; ``describe``: a batch's sizes in words,
    for messages ("3 utterances x 240 frames, text 80")."""

    block_types: tuple[type[nn.Module], ...]

    def losses(self, runner: nn.Module, batch: dict[str, Tensor], self_feed: Tensor | None
               ) -> dict[str, Tensor]: ...

    def worst_case(self, shape: BatchShape, device: torch.device | str
                   ) -> dict[str, Tensor]: ...

    def describe(self, batch: dict[str, Tensor]) -> str: ...


class TTSTask:
    """The TTS model's task (``model.xtts.XTTS``): the model's forward (self-fed when the
    run schedules it), ``model.losses.compute_losses`` under ``train.*`` weights, worst
    cases from ``model.dummy.worst_case_batch`` over a vocabulary of ``n_tokens`` ids and
    ``n_languages`` languages; compiled blocks: the encoder, resampler and decoder layers."""

    block_types: tuple[type[nn.Module], ...] = (EncoderLayer, ResamplerLayer, DecoderLayer)

    def __init__(self, cfg: Config, n_tokens: int, n_languages: int) -> None:
        self.cfg, self.n_tokens, self.n_languages = cfg, n_tokens, n_languages

    @classmethod
    def for_model(cls, cfg: Config, model: Any) -> TTSTask:
        """The task of ``model`` (an ``XTTS``), its vocabulary read from its embeddings: what
        ``model.xtts.build_model`` was given."""
        encoder = model.text_encoder
        return cls(cfg, encoder.token_emb.num_embeddings, encoder.lang_emb.num_embeddings)

    def losses(self, runner: nn.Module, batch: dict[str, Tensor], self_feed: Tensor | None
               ) -> dict[str, Tensor]:
        out = runner(batch) if self_feed is None else runner(batch, self_feed=self_feed)
        return compute_losses(out, batch, self.cfg.train)

    def worst_case(self, shape: BatchShape, device: torch.device | str) -> dict[str, Tensor]:
        return worst_case_batch(shape, self.n_tokens, self.n_languages, device)

    def describe(self, batch: dict[str, Tensor]) -> str:
        mel = batch["mel"]
        return f"{mel.shape[0]} utterances x {mel.shape[1]} frames, text {batch['tokens'].shape[1]}"
