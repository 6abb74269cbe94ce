"""The XTTS-v2 model a fine-tuning run trains: built from the downloaded folder for a new run
(its GPT grown to the store's vocabulary when the data adds a language), or from the run's
checkpoint on resume, and what a checkpoint records of it (:data:`BASE`).

What a run trains is the GPT alone (the DVAE's codes are in the store, the HiFi-GAN decoder
and the speaker encoder are frozen, as in the reference trainer), so a checkpoint holds the
GPT's weights and :class:`XttsBase`: the folder the run started from, the config and
vocabulary of the model as trained (grown) and the mel statistics of its voice input.
``myxtts export RUN --format xtts`` puts the trained GPT back into that folder's model.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from myxtts.artifacts.xtts_v2 import XttsV2Files, read_xtts_v2
from myxtts.artifacts.xtts_v2.config_file import config_json, parse_config, text_tokens
from myxtts.data.xtts_store import XttsStore, check_model
from myxtts.model.xtts_v2.config import XttsV2Config
from myxtts.model.xtts_v2.gpt import XttsGpt
from myxtts.model.xtts_v2.grow import grow_gpt, grown_config
from myxtts.text.xtts_v2.grow import row_sources
from myxtts.train.errors import TrainError

log = logging.getLogger(__name__)

BASE = "xtts_base"  # the checkpoint entry of XttsBase.to_state()
GPT_PREFIX = "gpt."


@dataclass
class XttsBase:
    """The model a run trains, besides its GPT's weights (module docstring)."""

    folder: str  # the XTTS-v2 folder the run started from
    config: XttsV2Config  # as trained: number_text_tokens and languages grown
    config_json: dict[str, Any]
    vocab: str  # the vocab.json the run's store was made with
    mel_stats: torch.Tensor  # [80]

    def to_state(self) -> dict[str, Any]:
        return {"folder": self.folder, "config_json": json.dumps(self.config_json),
                "vocab": self.vocab, "mel_stats": self.mel_stats.detach().cpu().float()}

    @classmethod
    def from_state(cls, state: Any, where: str) -> XttsBase:
        try:
            raw = json.loads(state["config_json"])
            vocab, stats, folder = state["vocab"], state["mel_stats"], str(state["folder"])
        except (TypeError, KeyError, ValueError) as e:
            raise TrainError(f"{where}: its XTTS-v2 record is damaged ({type(e).__name__}: "
                             f"{e}); resume from another checkpoint") from None
        config = parse_config(where, raw, text_tokens(Path("vocab.json"), vocab))
        return cls(folder, config, raw, vocab, torch.as_tensor(stats).float())

    def new_gpt(self) -> XttsGpt:
        """An untrained GPT of this model (a checkpoint's weights go in next)."""
        return XttsGpt(self.config)


def _mel_stats(files: XttsV2Files) -> torch.Tensor:
    """The voice input's statistics: ``mel_stats.pth`` (the reference trainer's), else the
    copy inside ``model.pth``."""
    if files.mel_stats is not None:
        return files.mel_stats.float()
    if "mel_stats" in files.weights:
        return files.weights["mel_stats"].float()
    raise TrainError(f"{files.source}: no mel_stats.pth; fine-tuning needs the XTTS-v2 folder "
                     f"with mel_stats.pth and dvae.pth as downloaded")


def start_from_folder(folder: str | Path, store: str | Path, seed: int) -> tuple[XttsBase, XttsGpt]:
    """A new run's model: ``folder``'s GPT with its weights, grown to the vocabulary of
    ``store`` (made for this model, else a one-line error naming both)."""
    files = read_xtts_v2(folder)
    check_model(store, files)
    vocab = XttsStore.vocab_path(store).read_text(encoding="utf-8")
    gpt = XttsGpt(files.config)
    weights = {k[len(GPT_PREFIX):]: v for k, v in files.weights.items() if k.startswith(GPT_PREFIX)}
    gpt.load_state_dict(weights, strict=True)
    config = files.config
    number = text_tokens(XttsStore.vocab_path(store), vocab)[0]
    if number != config.number_text_tokens:
        languages = XttsStore.open(store, "train").languages
        config = grown_config(config, number, languages)
        grow_gpt(gpt, number, row_sources(files.vocab, vocab), seed=seed)
        log.info("the vocabulary grew from %d to %d tokens (languages %s); old rows unchanged",
                 files.config.number_text_tokens, number, ", ".join(config.languages))
    raw = config_json(config, files.config_json)
    return XttsBase(str(Path(folder).resolve()), config, raw, vocab, _mel_stats(files)), gpt


def gpt_weights(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A trainee's state dict (``gpt.…``, the released names) as it is: the names of
    ``model.pth``'s GPT entries."""
    return {k: v for k, v in state.items() if k.startswith(GPT_PREFIX)}
