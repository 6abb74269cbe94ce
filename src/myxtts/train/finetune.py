"""Fine-tuning: a new run that starts from a trained model's weights.

``myxtts train DATA --init-from RUN_OR_CHECKPOINT`` takes the trained model (architecture,
weights, mel statistics) and trains it on DATA with a fresh optimizer and schedule from
step 0, in a run folder of its own (``--resume`` continues a run; the two are never mixed).

The data may bring letters and languages the model never saw. The vocabulary grows
(``Tokenizer.extended``, mapped onto the data by ``train.data.model_vocabulary``): every old
symbol keeps its embedding row; the rows of new symbols start at the mean of the old rows
of their kind (characters, language tokens, language embeddings), a neutral start the
first steps move. The model has no speaker table: a new voice is cloned from its reference
audio, so new speakers need no rows. The mel definition (the ``audio`` section) is the
model's: a store prepared with another is refused, naming the keys. ``train.freeze``
leaves named parts of the model as they are (:func:`freeze`).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.artifacts.readback import check_model
from myxtts.artifacts.runs import CheckpointManager, resolve_checkpoint
from myxtts.config import Config, config_from_dict
from myxtts.model.xtts import part_of
from myxtts.text import Tokenizer
from myxtts.text.tokenizer import SPECIAL_TOKENS
from myxtts.train.errors import TrainError

log = logging.getLogger(__name__)

TOKEN_ROWS = "text_encoder.token_emb.weight"
LANGUAGE_ROWS = "text_encoder.lang_emb.weight"


def check_new_run(out: Path, resume: str | Path | None, init_from: str | Path | None) -> None:
    """``--init-from`` starts a new run: refused with ``--resume`` or into a run folder that
    already has checkpoints (naming both flags)."""
    if init_from is None:
        return
    if resume is not None:
        raise TrainError("--init-from starts a new run from a trained model, --resume continues "
                         "a run from its own checkpoint: give one of them")
    existing = CheckpointManager(Path(out) / "checkpoints", 1).latest()
    if existing is not None:
        raise TrainError(f"--init-from starts a new run, but {out} already has checkpoints "
                         f"({existing.name}); continue that run with --resume (or the same "
                         f"command without --init-from), or fine-tune into another --output-dir")


def load_base(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """The checkpoint a fine-tuning run starts from: a ``.pt`` file, or a run folder (its
    ``best.pt``, else its newest checkpoint); loaded without pickle (``checkpoint.load``)."""
    file = resolve_checkpoint(path)
    state = ck.load(file)
    if state.get("kind") == "vocoder" or ck.VOCAB not in state:
        raise TrainError(f"{file} is not a TTS checkpoint (a vocoder run?); --init-from takes a "
                         f"`myxtts train` run or one of its checkpoints")
    check_model(str(file), state.get(ck.CONFIG), state.get(ck.VOCAB), state.get(ck.MODEL),
                state.get(ck.MEL_MEAN), state.get(ck.MEL_STD), state.get(ck.EMA))
    return file, state


def base_config(cfg: Config, base: dict[str, Any], file: Path, store: Path | None) -> Config:
    """``cfg`` with the base model's architecture (``model``) and mel definition (``audio``).
    A ``store`` prepared with another mel definition is refused, naming each key."""
    saved = config_from_dict(base[ck.CONFIG])
    mine, theirs = dataclasses.asdict(cfg.audio), dataclasses.asdict(saved.audio)
    diffs = [f"audio.{k}: store {mine[k]!r}, model {theirs[k]!r}"
             for k in sorted(theirs) if mine.get(k) != theirs[k]]
    if diffs and store is not None:
        raise TrainError(f"{store} was prepared with another mel definition than the model in "
                         f"{file} ({'; '.join(diffs)}); prepare the data again with the "
                         f"model's values (--set audio.KEY=VALUE) into a new --out")
    if diffs:
        log.warning("the model in %s computes its features with other audio settings (%s); "
                    "using the model's", file, "; ".join(diffs))
    merged = cfg.to_dict()
    merged["audio"], merged["model"] = saved.to_dict()["audio"], saved.to_dict()["model"]
    return config_from_dict(merged)


def _mean_rows(rows: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """The mean of ``rows`` [N, d] (``fallback`` [d] where there are none)."""
    return rows.mean(dim=0) if rows.shape[0] else fallback


def grow_token_rows(rows: torch.Tensor, old: Tokenizer, new: Tokenizer) -> torch.Tensor:
    """Token embedding rows [old vocab, d] -> [new vocab, d]: each old token's row at its id
    in ``new``; a new language token at the mean of the old language tokens' rows, a new
    character at the mean of the old characters' rows."""
    head = len(SPECIAL_TOKENS)
    first_char = head + len(old.languages)
    char_mean = _mean_rows(rows[first_char:], rows[head:].mean(dim=0))
    lang_mean = _mean_rows(rows[head:first_char], char_mean)
    where = {tok: i for i, tok in enumerate(old.tokens)}
    out = rows.new_empty(new.vocab_size, rows.shape[1])
    for i, tok in enumerate(new.tokens):
        if tok in where:
            out[i] = rows[where[tok]]
        else:
            out[i] = lang_mean if i < head + len(new.languages) else char_mean
    return out


def grow_language_rows(rows: torch.Tensor, old: Tokenizer, new: Tokenizer) -> torch.Tensor:
    """Language embedding rows [old languages, d] -> [new languages, d]: old rows kept, new
    ones at their mean."""
    mean = rows.mean(dim=0)
    return torch.stack([rows[old.languages.index(x)] if x in old.languages else mean
                        for x in new.languages])


def load_base_weights(model: torch.nn.Module, base: dict[str, Any], vocab: Tokenizer) -> None:
    """Load the base model's weights and mel statistics into ``model`` (built for ``vocab``,
    the base vocabulary or one grown from it), embedding rows grown to ``vocab``."""
    weights = dict(base[ck.MODEL])
    old = Tokenizer.from_dict(base[ck.VOCAB])
    if vocab != old:
        weights[TOKEN_ROWS] = grow_token_rows(weights[TOKEN_ROWS], old, vocab)
        weights[LANGUAGE_ROWS] = grow_language_rows(weights[LANGUAGE_ROWS], old, vocab)
    model.load_state_dict(weights)


def describe(file: Path, base: dict[str, Any], vocab: Tokenizer) -> str:
    """One line: which model the run fine-tunes and what the data added to its vocabulary."""
    old = Tokenizer.from_dict(base[ck.VOCAB])
    step = ck.TrainingProgress.from_state_dict(base[ck.PROGRESS]).step
    line = f"fine-tuning the model of {file} (trained {step} steps): "
    if vocab == old:
        return line + f"its vocabulary of {old.vocab_size} tokens covers the data"
    langs = [x for x in vocab.languages if x not in old.languages]
    chars = "".join(c for c in vocab.chars if c not in old.chars)
    return line + (f"vocabulary grown {old.vocab_size} -> {vocab.vocab_size} tokens (new "
                   f"languages: {', '.join(langs) or 'none'}; new characters: {chars!r})")


def _spans(ids: list[int]) -> str:
    """``[3, 40, 41, 42]`` -> ``"3, 40-42"``."""
    spans: list[list[int]] = []
    for i in ids:
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)


def check_freeze(parts: list[str], base: dict[str, Any], vocab: Tokenizer) -> None:
    """``train.freeze=[text_embeddings]`` while the data adds letters or languages would
    keep every new row at its starting value (the mean of the old ones): each new letter
    would sound alike, forever. Refused, naming the rows."""
    if "text_embeddings" not in parts:
        return
    old = Tokenizer.from_dict(base[ck.VOCAB])
    langs = [x for x in vocab.languages if x not in old.languages]
    chars = [c for c in vocab.chars if c not in old.chars]
    if not langs and not chars:
        return
    rows = [f"{TOKEN_ROWS} rows "
            f"{_spans([i for i, t in enumerate(vocab.tokens) if t not in old.tokens])}"]
    if langs:
        rows.append(f"{LANGUAGE_ROWS} rows {_spans([vocab.languages.index(x) for x in langs])}")
    new = ", ".join(([f"language {', '.join(langs)}"] if langs else [])
                    + ([f"{len(chars)} character(s) {''.join(chars)!r}"] if chars else []))
    raise TrainError(f"train.freeze=[{', '.join(parts)}]: the data adds {new}, whose rows "
                     f"({'; '.join(rows)}) start at the mean of the old ones and would never "
                     f"move; drop text_embeddings from train.freeze (a new language needs "
                     f"them free)")


def freeze(model: torch.nn.Module, parts: list[str]) -> int:
    """``train.freeze``: the parameters of ``parts`` (``model.xtts.part_of``) stop
    requiring gradients, so the optimizer leaves them out. Returns how many are frozen."""
    if not parts:
        return 0
    frozen = 0
    for name, p in model.named_parameters():
        if part_of(name) in parts:
            p.requires_grad_(False)
            frozen += p.numel()
    total = sum(p.numel() for p in model.parameters())
    log.info("train.freeze %s: %.2f M of %.2f M parameters left as they are", ", ".join(parts),
             frozen / 1e6, total / 1e6)
    return frozen
