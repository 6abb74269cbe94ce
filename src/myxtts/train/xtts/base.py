"""The XTTS-v2 model a new fine-tuning run starts from: the downloaded folder's GPT with its
weights, grown to the store's vocabulary when the data adds a language (the new rows start
from the old ones: ``model.xtts_v2.grow``), and the record a checkpoint keeps of it
(``artifacts.xtts_v2.run.XttsBase``). The GPT alone trains, as in the reference trainer:
the DVAE's codes are in the store; the HiFi-GAN decoder and the speaker encoder stay as
released.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from myxtts.artifacts.xtts_v2 import XttsV2Files, read_xtts_v2
from myxtts.artifacts.xtts_v2.config_file import config_json, text_tokens
from myxtts.artifacts.xtts_v2.run import GPT_PREFIX, XttsBase
from myxtts.data.xtts_store import XttsStore, check_model
from myxtts.model.xtts_v2.gpt import XttsGpt
from myxtts.model.xtts_v2.grow import grow_gpt, grown_config
from myxtts.text.xtts_v2.grow import row_sources
from myxtts.train.errors import TrainError

log = logging.getLogger(__name__)


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
