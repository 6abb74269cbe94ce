"""What ``myxtts profile`` profiles: the recipe ``myxtts train`` would run on the data, and
what differs between the kinds of training in reading its batches and describing its model.

Two kinds: the TTS model's run (``train.tts.TTSRecipe``: batches of mel frames, bucket
shapes ``B x L_text x T_mel``, FLOPs counted by ``train.efficiency``) and XTTS-v2's
fine-tuning run on a store of ``myxtts prepare --xtts`` (``train.xtts.recipe.XttsRecipe``:
batches of code positions, shapes ``B x L_text x T_codes``, FLOPs counted by
``train.xtts.flops``). The measuring (``profile.run``) is the same for both.
"""

from __future__ import annotations

from pathlib import Path

import torch

from myxtts.config import Config
from myxtts.data.batch import BatchShape
from myxtts.data.xtts_store import is_xtts_store
from myxtts.observe.flops import StepFlops, batch_key
from myxtts.train.data import bucket_shapes, is_store
from myxtts.train.efficiency import meta_step_counter
from myxtts.train.recipe import Recipe
from myxtts.train.tts import TTSRecipe
from myxtts.train.xtts.batches import batch_shapes
from myxtts.train.xtts.flops import xtts_batch_key, xtts_step_counter
from myxtts.train.xtts.recipe import XttsRecipe


class Subject:
    """The recipe under profile and how its batches read (module docstring)."""

    xtts = False
    frames = "mel frames"  # what a batch's time axis counts
    shape_axes = "B x L_text x T_mel"

    def __init__(self, recipe: Recipe) -> None:
        self.recipe = recipe

    @property
    def cfg(self) -> Config:
        return self.recipe.cfg

    @property
    def copy_log(self) -> list | None:
        """The feed's (start, end) CUDA events per copied batch (None on a CPU)."""
        return getattr(self.recipe, "copy_log", None)

    def key(self, batch: dict[str, torch.Tensor]) -> tuple[int, int, int]:
        """``(B, L_text, T)``: the batch's padded shape, from tensor metadata (no sync)."""
        return batch_key(batch)

    def shapes(self) -> list[BatchShape]:
        """Each bucket's padded shape at the batch sizes the run uses."""
        assert isinstance(self.recipe, TTSRecipe) and self.recipe.data is not None
        return bucket_shapes(self.recipe.data.sampler, self.cfg)

    def flops(self) -> StepFlops | None:
        r = self.recipe
        assert isinstance(r, TTSRecipe) and r.data is not None
        return StepFlops(meta_step_counter(self.cfg, r.data.vocab_size, len(r.data.languages)))

    def model(self) -> str:
        return self.cfg.model.preset

    def workers(self) -> int:
        assert isinstance(self.recipe, TTSRecipe) and self.recipe.data is not None
        return self.recipe.data.loader.num_workers

    def on_the_fly(self) -> bool:
        return not is_store(self.recipe.data_path)

    def worker_note(self) -> str | None:
        """The store loader's word on workers that save too little (None: nothing to say)."""
        assert isinstance(self.recipe, TTSRecipe) and self.recipe.data is not None
        return getattr(self.recipe.data.loader, "worker_note", None)


class XttsSubject(Subject):
    """XTTS-v2 fine-tuning: the real frames are the clips' DVAE codes (the input path's
    count), against the batch's padded code positions (which also hold the GPT's start and
    stop positions, so even a batch without padding stays a little under 100 %)."""

    xtts = True
    frames = "code positions"
    shape_axes = "B x L_text x T_codes"

    def key(self, batch: dict[str, torch.Tensor]) -> tuple[int, int, int]:
        return xtts_batch_key(batch)

    def shapes(self) -> list[BatchShape]:
        r = self.recipe
        assert isinstance(r, XttsRecipe) and r.sampler is not None
        return batch_shapes(r.sampler.plan, self.cfg)

    def flops(self) -> StepFlops | None:
        r = self.recipe
        assert isinstance(r, XttsRecipe) and r.base is not None
        ref = batch_shapes(r.sampler.plan, self.cfg)[0].ref_frames  # the voice segment's samples
        return StepFlops(xtts_step_counter(r.base.config, ref))

    def model(self) -> str:
        r = self.recipe
        assert isinstance(r, XttsRecipe) and r.base is not None
        return f"XTTS-v2 GPT of {r.base.folder}"

    def workers(self) -> int:
        assert isinstance(self.recipe, XttsRecipe) and self.recipe.loader is not None
        return self.recipe.loader.num_workers

    def on_the_fly(self) -> bool:
        return False

    def worker_note(self) -> str | None:
        return None  # the XTTS loader chooses its workers itself and logs why


def subject(cfg: Config, data_path: str | Path, resume: Path | None, init_from: Path | None,
            copy_log: list | None) -> Subject:
    """The recipe ``myxtts train`` runs on ``data_path``, not set up yet, and its reading."""
    if is_xtts_store(data_path):
        return XttsSubject(XttsRecipe(cfg, data_path, resume, init_from=init_from,
                                      show_progress=False, copy_log=copy_log))
    return Subject(TTSRecipe(cfg, data_path, resume, show_progress=False, copy_log=copy_log))

