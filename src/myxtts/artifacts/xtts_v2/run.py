"""XTTS-v2 fine-tuning runs as models: what a run's checkpoint records of the model it trains
(:class:`XttsBase`), and the run read back as a whole XTTS-v2 model (:func:`read_xtts_run`),
which ``myxtts export``, ``synthesize -c`` and ``evaluate`` take like a downloaded folder.

A run trains the GPT alone (the DVAE's codes are in its store; the HiFi-GAN decoder, the
speaker encoder and the DVAE stay as released), so a checkpoint holds the GPT's weights (and
their moving average, with ``train.ema_decay``) beside the record of the model: the folder the
run started from, the config and vocabulary as trained (grown when the data added a
language) and the mel statistics of the voice input. The whole model is that folder's with
the GPT's weights replaced. A run folder is marked by :data:`RUN_MARKER`, written when the
run starts, so that it is recognised without reading a checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.artifacts.averaged import averaged_state
from myxtts.artifacts.errors import ArtifactError
from myxtts.artifacts.runs import resolve_checkpoint, run_folder
from myxtts.artifacts.xtts_v2.config_file import parse_config, text_tokens
from myxtts.artifacts.xtts_v2.folder import XttsV2Files, read_xtts_v2
from myxtts.model.xtts_v2.config import XttsV2Config
from myxtts.system import atomic_write

BASE = "xtts_base"  # the checkpoint entry of XttsBase.to_state()
RUN_MARKER = "xtts-v2.json"  # in a run folder: the run fine-tunes XTTS-v2 (its base folder)
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
            raise ArtifactError(f"{where}: its XTTS-v2 record is damaged ({type(e).__name__}: "
                                f"{e}); use another checkpoint of the run") from None
        config = parse_config(where, raw, text_tokens(Path("vocab.json"), vocab))
        return cls(folder, config, raw, vocab, torch.as_tensor(stats).float())

    def mark(self, run: Path) -> None:
        """Write the run folder's marker (module docstring)."""
        atomic_write(run / RUN_MARKER, json.dumps({"model": "XTTS-v2", "base": self.folder},
                                                  indent=2) + "\n")


def is_xtts_run(path: str | Path) -> bool:
    """A run folder (or one of its checkpoints) of an XTTS-v2 fine-tuning run."""
    folder = run_folder(path)
    return folder is not None and (folder / RUN_MARKER).is_file()


def read_xtts_run(path: str | Path, raw_weights: bool = False) -> XttsV2Files:
    """The run ``path`` (its best.pt, else its newest checkpoint; or a checkpoint file) as a
    whole XTTS-v2 model: its base folder's files with the trained GPT (the moving average of
    its weights where the run keeps one, unless ``raw_weights``) and the grown config and
    vocabulary. The base folder must still be where the run found it."""
    file = resolve_checkpoint(path)
    state = ck.load(file)
    if BASE not in state:
        raise ArtifactError(f"{file} is no checkpoint of an XTTS-v2 fine-tuning run")
    base = XttsBase.from_state(state[BASE], str(file))
    if not Path(base.folder).is_dir():
        raise ArtifactError(f"{file} fine-tunes the XTTS-v2 folder {base.folder}, which is gone; "
                            f"put the folder back there (its DVAE, decoder and voices are "
                            f"part of the model)")
    files = read_xtts_v2(base.folder)
    trained = averaged_state(state[ck.MODEL], None if raw_weights else state.get(ck.EMA))
    gpt = {k: v for k, v in trained.items() if k.startswith(GPT_PREFIX)}
    weights = {k: v for k, v in files.weights.items() if not k.startswith(GPT_PREFIX)}
    weights.update(gpt)
    return XttsV2Files(base.config, weights, base.vocab, base.config_json, files.speakers,
                       files.dvae, files.mel_stats, source=file)
