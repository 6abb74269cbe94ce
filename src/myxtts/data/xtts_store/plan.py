"""The text side of an XTTS store, decided before any audio is opened: the vocabulary
(grown by the languages the model lacks) and every utterance's XTTS token ids.

The transcripts are the dataset readers' (``data.prepare.readers``: every layout, the
train/val split, the rows they reject), tokenized as XTTS-v2's GPT trainer does
(``XttsTokenizer.encode``: its own per-language normalisation, the language token first).
Where the reference trainer stops on an [UNK] (an assertion), a row the vocabulary cannot
encode is rejected here and reported with its file and line and the characters at fault.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from myxtts.data.prepare.plan import TOO_MANY_TOKENS, Planned
from myxtts.data.prepare.readers import DatasetSplits
from myxtts.data.prepare.records import EMPTY_TEXT, SPLITS, UNKNOWN_LANGUAGE
from myxtts.data.store.format import StoreError
from myxtts.text.tokenizer import TokenizerError
from myxtts.text.xtts_v2 import XttsTokenizer, base_language, language_tag
from myxtts.text.xtts_v2.grow import UNK, grow_vocab, missing_characters
from myxtts.text.xtts_v2.tables import CODES, LANGUAGES, OWN_CHAR_LIMITS
from myxtts.text.xtts_v2.tokenizer import load_bpe

UNENCODABLE = "characters outside the vocabulary"  # rejection reason: an [UNK] token


def store_vocab(base_text: str, base_path: Path, languages: Sequence[str],
                splits: DatasetSplits) -> tuple[str, dict[str, int]]:
    """The vocabulary the store's tokens are made with, and the language tokens it added
    (``{"fa": id}``). ``languages``: the store's (``text.languages``); each must be one
    XTTS-v2 speaks or myxtts can add (one StoreError line otherwise). A language the base
    lacks (Persian), or one myxtts added whose letters the data exceeds, grows the
    vocabulary (``text.xtts_v2.grow``) by its alphabet and its transcripts' characters;
    old ids never move, so the model's old rows stay valid. Nothing to add: the base text."""
    bad = [lang for lang in languages
           if str(lang).split("-")[0] not in CODES and str(lang).split("-")[0] not in OWN_CHAR_LIMITS]
    if bad:
        raise StoreError(f"text.languages holds {bad[0]!r}, which XTTS-v2 does not speak and "
                         f"myxtts cannot add (it speaks {', '.join(LANGUAGES)}; myxtts adds "
                         f"{', '.join(OWN_CHAR_LIMITS)}); fix --set text.languages=[...]")
    growable = [lang for lang in languages if base_language(lang) in OWN_CHAR_LIMITS]
    if not growable:
        return base_text, {}
    samples: dict[str, list[str]] = {base_language(lang): [] for lang in growable}
    for u in splits.all:
        if u.language in growable:
            samples[base_language(u.language)].append(u.text)
    try:
        grown = grow_vocab(base_text, growable, samples, where=str(base_path))
    except TokenizerError as e:
        raise StoreError(str(e)) from None
    return grown.text, grown.languages


def plan_tokens(splits: DatasetSplits, tokenizer: XttsTokenizer, vocab_text: str,
                languages: Sequence[str], max_tokens: int
                ) -> tuple[dict[str, list[Planned]], list[dict[str, Any]]]:
    """Every kept utterance's XTTS token ids (``Planned``, in reader order per split) and the
    rejections: a language outside ``languages``, a text empty after normalisation, one with
    a character the vocabulary cannot encode ([UNK], the reference's assertion) or with more
    than ``max_tokens`` ids (the reference's ``max_text_length``); each with its file and
    line (``source``, ``line``, and in ``detail``)."""
    bpe = load_bpe(tokenizer.path, vocab_text)
    unk = bpe.token_to_id(UNK)
    planned: dict[str, list[Planned]] = {s: [] for s in SPLITS}
    rejections: list[dict[str, Any]] = []
    for split, utts in (("train", splits.train), ("val", splits.val)):
        for u in utts:
            source, line = splits.origins.get(u.id, (str(u.audio_path), None))
            where = f"{source}:{line}" if line is not None else str(source)
            base = {"split": split, "id": u.id, "audio_path": str(u.audio_path),
                    "source": str(source), "line": line}
            if u.language not in languages:
                rejections.append({**base, "reason": UNKNOWN_LANGUAGE,
                                   "detail": f"{where}: language {u.language!r} is not in "
                                             f"text.languages {list(languages)}; add it with "
                                             f"--set text.languages=[...]"})
                continue
            ids = tokenizer.encode(u.text, u.language)
            if len(ids) <= 1:  # the language token alone
                rejections.append({**base, "reason": EMPTY_TEXT,
                                   "detail": f"{where}: transcript {u.text!r} is empty after "
                                             f"XTTS-v2's normalisation"})
            elif unk in ids:
                chars = missing_characters(bpe, sorted(set(tokenizer.normalize(u.text, u.language))))
                rejections.append({**base, "reason": UNENCODABLE,
                                   "detail": f"{where}: {u.language!r} text holds "
                                             f"{' '.join(repr(c) for c in chars) or 'characters'} "
                                             f"that {language_tag(base_language(u.language))}'s "
                                             f"vocabulary cannot encode ([UNK]); correct the "
                                             f"row's text or its language, or delete the row"})
            elif len(ids) > max_tokens:
                rejections.append({**base, "reason": TOO_MANY_TOKENS,
                                   "detail": f"{where}: {len(ids)} XTTS tokens > "
                                             f"{max_tokens} (the reference's max_text_length)"})
            else:
                planned[split].append(Planned(u.id, str(u.audio_path), u.speaker, u.language,
                                              tuple(ids)))
    return planned, rejections
