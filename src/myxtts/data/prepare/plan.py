"""What trains, decided before any audio is decoded: cleaned and tokenized texts,
reference clips per utterance, and how mel statistics are finished.

Shared by ``prepare`` (which then extracts features into a store) and the on-the-fly
loader (which computes them per batch): both must reject the same texts, build the same
vocabulary, give every utterance the same reference clips and floor the same band
statistics, or a model trained one way would not match data read the other way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from myxtts.config import Config
from myxtts.data.prepare.readers import read_dataset
from myxtts.data.prepare.records import EMPTY_TEXT, SPLITS, UNKNOWN_LANGUAGE
from myxtts.text import Tokenizer, clean_text

TOO_MANY_TOKENS = "too many tokens"  # rejection reason (the others live in data.records)


@dataclass(frozen=True)
class Planned:
    """An utterance that survived reading and the text checks."""

    id: str
    audio_path: str
    speaker: str
    language: str
    tokens: tuple[int, ...]


def plan_texts(data: Path, cfg: Config, tokenizer: Any = None):
    """Read the dataset, clean and tokenize every transcript; reject bad texts.

    Returns ``(planned {split: [Planned]}, tokenizer, rejections, reader report)``. The
    vocabulary is built from the cleaned train+val texts unless ``tokenizer`` is given.
    """
    splits = read_dataset(data, cfg)
    rejections: list[dict[str, str]] = []
    cleaned: dict[str, list[tuple[Any, str]]] = {s: [] for s in SPLITS}
    languages = tokenizer.languages if tokenizer is not None else cfg.text.languages
    for split, utts in (("train", splits.train), ("val", splits.val)):
        for u in utts:
            base = {"split": split, "id": u.id, "audio_path": str(u.audio_path)}
            if u.language not in languages:
                rejections.append({**base, "reason": UNKNOWN_LANGUAGE,
                                   "detail": f"language {u.language!r} is not in text.languages "
                                             f"{languages}; add it with --set "
                                             f"text.languages=[...]"})
                continue
            text = clean_text(u.text, u.language, cfg.text)
            if not text.strip():
                rejections.append({**base, "reason": EMPTY_TEXT,
                                   "detail": f"transcript {u.text!r} is empty after cleaning"})
                continue
            cleaned[split].append((u, text))
    if tokenizer is None:
        tokenizer = Tokenizer.build([t for s in SPLITS for _, t in cleaned[s]], cfg.text.languages)
    planned: dict[str, list[Planned]] = {s: [] for s in SPLITS}
    for split in SPLITS:
        for u, text in cleaned[split]:
            ids = tokenizer.encode(text, u.language)
            if len(ids) > cfg.data.max_text_tokens:
                rejections.append({"split": split, "id": u.id, "audio_path": str(u.audio_path),
                                   "reason": TOO_MANY_TOKENS,
                                   "detail": f"{len(ids)} tokens > data.max_text_tokens "
                                             f"{cfg.data.max_text_tokens}"})
                continue
            planned[split].append(Planned(u.id, str(u.audio_path), u.speaker, u.language,
                                           tuple(ids)))
    return planned, tokenizer, rejections, splits.report


def choose_refs(speaker_ids: np.ndarray, refs_per_utterance: int, seed: list[int]) -> np.ndarray:
    """int32 [N, refs_per_utterance] reference indices, -1 = unused slot.

    Up to ``refs_per_utterance`` OTHER utterances of the same speaker, drawn without
    replacement from ``default_rng(seed)``; a speaker with a single clip references itself
    (cloning from the target itself is better than no reference at all).
    """
    n = len(speaker_ids)
    refs = np.full((n, refs_per_utterance), -1, np.int32)
    rng = np.random.default_rng(seed)
    order = np.argsort(speaker_ids, kind="stable")
    bounds = np.flatnonzero(np.diff(speaker_ids[order])) + 1
    for members in np.split(order, bounds):
        m = len(members)
        if m == 0:
            continue
        if m == 1:
            refs[members[0], 0] = members[0]
            continue
        k = min(refs_per_utterance, m - 1)
        for j, i in enumerate(members):
            pick = rng.choice(m - 1, size=k, replace=False)  # positions among the others
            refs[i, :k] = members[pick + (pick >= j)]  # skip position j (the utterance itself)
    return refs
