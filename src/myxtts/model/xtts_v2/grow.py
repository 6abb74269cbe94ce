"""XTTS-v2 grown to a larger text vocabulary (a language added: ``myxtts.text.xtts_v2.grow``):
the GPT's text rows, in a state dict (``grow_text_rows``) or a built :class:`XttsGpt`
(``grow_gpt``), and the config (``grown_config``).

Three tensors have one row per text token: ``gpt.text_embedding.weight`` [N, D] (what the
GPT reads), ``gpt.text_head.weight`` [N, D] and ``gpt.text_head.bias`` [N] (the text logits
of training's text loss). New tokens have ids after the old ones, so new rows are appended
and every old row stays bit for bit what it was: the model speaks its old languages exactly
as before, and only the new rows (and what fine-tuning then changes) are new.

How new rows start. Each new token names the old tokens it is like (``sources``: a language
token the old language tokens, a letter the old byte-pair pieces; all old rows by default).
Its embedding and head rows are those rows' mean plus noise of ``NOISE`` times their
per-dimension standard deviation; its bias is their mean bias, with no noise. Why:

- the mean is where the GPT has seen an average token of the kind, a neutral input that
  neither sends the untrained GPT somewhere it never was (as a random row of the full
  scale would) nor vanishes next to the position embedding (as a zero row would);
- a head row and bias at the mean make the new token's logit the mean of the old tokens'
  logits for any state (it is linear in the row), so a new token starts neither dominant
  (above the likely tokens) nor impossible (far below them), and its loss gradient is
  informative from the first step;
- the small noise makes the new rows differ, so that the GPT tells new letters apart from
  the first step instead of leaving it to the gradients of their different contexts; at
  2 % of the rows' spread it moves a new token's logit by about 2 % of the spread of the
  old tokens' logits, which keeps the point above.

The noise is drawn from a seeded generator: the same call gives the same rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from myxtts.model.xtts_v2.config import XttsV2Config
from myxtts.model.xtts_v2.gpt import XttsGpt

__all__ = ["NOISE", "TEXT_ROWS", "grow_gpt", "grow_text_rows", "grown_config", "new_rows"]

NOISE = 0.02  # the noise's scale, in per-dimension standard deviations of the source rows
EMBEDDING, HEAD, BIAS = "gpt.text_embedding.weight", "gpt.text_head.weight", "gpt.text_head.bias"
TEXT_ROWS = (EMBEDDING, HEAD, BIAS)


def _source_ids(n_old: int, new_id: int, sources: Mapping[int, Sequence[int]] | None
                ) -> list[int]:
    """The old ids new token ``new_id`` starts from: ``sources[new_id]``, all old ids where
    none are given."""
    ids = list((sources or {}).get(new_id, ())) or list(range(n_old))
    bad = [i for i in ids if not 0 <= int(i) < n_old]
    if bad:
        raise ValueError(f"row sources of new token {new_id} name ids {bad[:3]}, which are not "
                         f"old tokens (0..{n_old - 1})")
    return [int(i) for i in ids]


def new_rows(rows: Tensor, number_text_tokens: int,
             sources: Mapping[int, Sequence[int]] | None = None, noise: float = NOISE,
             generator: torch.Generator | None = None) -> Tensor:
    """The rows to append to ``rows`` ([N, D] weights, or [N] biases) for ids N ..
    ``number_text_tokens`` - 1 (module doc): per new id the mean of its source rows, plus
    ``noise`` times their per-dimension standard deviation of normal noise for a matrix
    (a bias gets the mean alone). Computed in float32, returned in ``rows``' dtype."""
    n_old = rows.shape[0]
    if number_text_tokens < n_old:
        raise ValueError(f"cannot shrink the text rows from {n_old} to {number_text_tokens}: "
                         f"a grown vocabulary only appends tokens")
    old = rows.detach().float().cpu()
    out = []
    for new_id in range(n_old, number_text_tokens):
        src = old[_source_ids(n_old, new_id, sources)]
        mean = src.mean(dim=0)
        if old.ndim == 1 or noise == 0:
            out.append(mean)
            continue
        # one source row has no spread: the spread of all old rows stands in
        std = (src if src.shape[0] > 1 else old).std(dim=0)
        out.append(mean + noise * std * torch.randn(mean.shape, generator=generator))
    if not out:
        return rows.new_empty((0, *rows.shape[1:]))
    return torch.stack(out).to(dtype=rows.dtype, device=rows.device)


def grow_text_rows(weights: Mapping[str, Tensor], number_text_tokens: int,
                   sources: Mapping[int, Sequence[int]] | None = None, seed: int = 0,
                   noise: float = NOISE) -> dict[str, Tensor]:
    """A copy of the XTTS-v2 state dict ``weights`` (our naming, or any with the released
    ``gpt.text_*`` keys) whose three text-row tensors have ``number_text_tokens`` rows:
    old rows unchanged (the same values, new tensors), new rows from :func:`new_rows`;
    every other entry is the same tensor. ``sources``: per new id, the old ids it is like
    (``GrownVocab.row_sources``)."""
    missing = [k for k in TEXT_ROWS if k not in weights]
    if missing:
        raise KeyError(f"the state dict has no {missing[0]}; it is not XTTS-v2's model "
                       f"(its text rows are {', '.join(TEXT_ROWS)})")
    n_old = weights[EMBEDDING].shape[0]
    for key in (HEAD, BIAS):
        if weights[key].shape[0] != n_old:
            raise ValueError(f"{key} has {weights[key].shape[0]} rows, {EMBEDDING} {n_old}: "
                             f"the state dict is not one model's")
    out = dict(weights)
    for offset, key in enumerate(TEXT_ROWS):
        # each tensor its own stream, so that growing one does not shift another's noise
        g = torch.Generator().manual_seed(seed * len(TEXT_ROWS) + offset)
        rows = weights[key]
        out[key] = torch.cat([rows.detach(), new_rows(rows, number_text_tokens, sources,
                                                      noise, g)])
    return out


def grown_config(config: XttsV2Config, number_text_tokens: int,
                 languages: Sequence[str] = ()) -> XttsV2Config:
    """``config`` for the grown vocabulary: its ``number_text_tokens``, ``languages`` added
    after the old ones; [START] and [STOP] keep their ids (old tokens never move)."""
    if number_text_tokens < config.number_text_tokens:
        raise ValueError(f"a grown vocabulary has at least the {config.number_text_tokens} "
                         f"tokens of the model's, not {number_text_tokens}")
    added = tuple(lang for lang in dict.fromkeys(languages) if lang not in config.languages)
    return dataclasses.replace(config, number_text_tokens=number_text_tokens,
                               languages=tuple(config.languages) + added)


def grow_gpt(gpt: XttsGpt, number_text_tokens: int,
             sources: Mapping[int, Sequence[int]] | None = None, seed: int = 0,
             noise: float = NOISE) -> XttsGpt:
    """``gpt`` with its ``text_embedding`` and ``text_head`` grown in place to
    ``number_text_tokens`` rows (new modules on the old device and dtype, the rows of
    :func:`grow_text_rows`); returns ``gpt``. An optimizer built before holds the old
    parameters: build it after growing. The config of a whole model holding ``gpt`` is the
    caller's to replace (:func:`grown_config`)."""
    state = {EMBEDDING: gpt.text_embedding.weight, HEAD: gpt.text_head.weight,
             BIAS: gpt.text_head.bias}
    grown = grow_text_rows(state, number_text_tokens, sources, seed, noise)
    weight = gpt.text_embedding.weight
    embedding = nn.Embedding(number_text_tokens, gpt.dim, device=weight.device, dtype=weight.dtype)
    head = nn.Linear(gpt.dim, number_text_tokens, device=weight.device,
                     dtype=gpt.text_head.weight.dtype)
    with torch.no_grad():
        embedding.weight.copy_(grown[EMBEDDING])
        head.weight.copy_(grown[HEAD])
        head.bias.copy_(grown[BIAS])
    embedding.weight.requires_grad_(gpt.text_embedding.weight.requires_grad)
    head.weight.requires_grad_(gpt.text_head.weight.requires_grad)
    head.bias.requires_grad_(gpt.text_head.bias.requires_grad)
    gpt.text_embedding, gpt.text_head = embedding, head
    return gpt
