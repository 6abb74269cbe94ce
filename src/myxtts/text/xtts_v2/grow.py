"""Adding a language to XTTS-v2's vocabulary (``grow_vocab``): the ``vocab.json`` of a model
that is to be fine-tuned in a language it was not trained in (Persian).

What changes: the language's token (``[fa]``, a special token like ``[en]``) and every
character its cleaned text can hold that the vocabulary cannot encode (without ``[UNK]``)
are appended, with ids after the largest one. Nothing else: every old token keeps its id
and the merges are the same list, so every text of the old languages encodes to the same
ids, and the model's old rows stay valid (``myxtts.model.xtts_v2.grow`` appends the rows).

How the letters are added: as entries of the BPE model's own ``vocab``, not with the
library's ``add_tokens``. An added token is cut out of the text before the byte-pair model
sees it, so it can never take part in a merge, and a tool that reads or retrains the BPE
model (coqui's own included) does not see it as a letter; a letter in the BPE vocabulary is
an ordinary one-character symbol, which encodes as itself (no merge involves it yet) and
which merges learnt later for the language can build on. The language token, in contrast,
must be an added special token: the whitespace pre-tokenizer would cut "[fa]" into "[",
"fa", "]"; it goes to both lists with one id, as the released language tokens are.

Which letters: the language's alphabet (``ALPHABETS``; Persian's from the project's Persian
front end: its letters after ``text.persian``'s letter forms, the hamza forms it composes,
the ZWNJ it keeps), the punctuation the project's cleaner writes every script's marks as
(``MARKS``: Persian "؛" becomes ";") and every character of the sample texts given, as the
tokenizer cleans them. Each character is encoded alone; those that give ``[UNK]`` are added, in code
point order.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from myxtts.text.persian import ZWNJ
from myxtts.text.scripts import LANGUAGE_SCRIPTS, script_of
from myxtts.text.tokenizer import TokenizerError
from myxtts.text.xtts_v2.normalize import base_language, language_tag, normalize
from myxtts.text.xtts_v2.tables import LANGUAGES, OWN_CHAR_LIMITS
from myxtts.text.xtts_v2.tokenizer import START, STOP, load_bpe

__all__ = ["ALPHABETS", "MARKS", "GrownVocab", "grow_vocab", "language_letters", "missing_characters",
           "row_sources"]

UNK = "[UNK]"

# The letters of a language as the cleaned text writes them. Persian: the 32 letters with
# the Persian yeh and keheh (``text.persian`` folds Arabic ي ك ى ة into these), alef with
# madda and hamza, the hamza seats it composes (ؤ ئ ۀ) and the lone hamza, and the ZWNJ
# that correct spelling keeps inside words ("کتاب‌ها").
ALPHABETS: dict[str, str] = {
    "fa": "ءآأؤئابپتثجچحخدذرزژسشصضطظعغفقکگلمنوهیۀ" + ZWNJ,
}
# The punctuation text.cleaners folds every script's marks into (Arabic-script ، ؛ ؟ ۔,
# dashes, quotes, brackets) and keeps in a cleaned text.
MARKS = ".,;:!?'-()"


@dataclass(frozen=True)
class GrownVocab:
    """A grown vocabulary: ``text`` (the new ``vocab.json``), the ids of the tokens added
    (``languages``: ``{"fa": id of [fa]}``, ``letters``: ``{"پ": id}``), ``before`` (the
    old number of ids: the model's old ``number_text_tokens``) and ``row_sources``: per
    added id, the old ids whose rows a new model row starts from (a language token from
    the old language tokens, a letter from the old byte-pair pieces)."""

    text: str
    languages: dict[str, int]
    letters: dict[str, int]
    before: int
    row_sources: dict[int, tuple[int, ...]]

    @property
    def number_text_tokens(self) -> int:
        return self.before + len(self.languages) + len(self.letters)


def language_letters(language: str, samples: Iterable[str] = ()) -> list[str]:
    """The characters ``language``'s cleaned text may hold: its alphabet (``ALPHABETS``,
    checked to be letters of its script or a joiner), ``MARKS``, and the characters of
    ``samples`` after XTTS-v2's cleaning (``normalize``), spaces aside; sorted by code
    point."""
    lang = base_language(language)
    chars = set(ALPHABETS.get(lang, ""))
    scripts = LANGUAGE_SCRIPTS.get(lang)
    for ch in chars:
        letter = unicodedata.category(ch)[0] == "L" and (scripts is None or script_of(ch) in scripts)
        if not (letter or ch == ZWNJ):
            raise ValueError(f"ALPHABETS[{lang!r}] holds {ch!r}, not a letter of its script")
    chars.update(MARKS)
    for text in samples:
        chars.update(ch for ch in normalize(text, lang) if not ch.isspace())
    return sorted(chars)


def missing_characters(bpe, characters: Iterable[str]) -> list[str]:
    """Those of ``characters`` that the ``tokenizers`` Tokenizer ``bpe`` encodes to [UNK]."""
    unk = bpe.token_to_id(UNK)
    return [ch for ch in characters if unk is not None and unk in bpe.encode(ch).ids]


def _special_entry(template: Mapping | None, token: str, token_id: int) -> dict:
    """An ``added_tokens`` entry for ``token``, with the keys and flags of the file's own
    language tokens (a special token, matched as written)."""
    entry = {"id": token_id, "content": token, "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": True}
    if template is not None:
        entry = {**dict(template), "id": token_id, "content": token}
    return entry


def grow_vocab(vocab: str, languages: Sequence[str],
               samples: Mapping[str, Iterable[str]] | None = None,
               where: str = "vocab.json") -> GrownVocab:
    """``vocab`` (the text of XTTS-v2's ``vocab.json``, read from ``where``) with
    ``languages`` added (module doc). ``samples``: per language, texts in it whose every
    character is to be encodable (with no sample, the alphabet alone). A language must be
    one the tokenizer can clean (the released ones, ``OWN_CHAR_LIMITS``); one already in the
    vocabulary gains only the characters it lacks; nothing to add gives ``vocab`` back."""
    samples = samples or {}
    codes = [base_language(lang) for lang in languages]
    for lang in codes:
        if lang not in ALPHABETS and not samples.get(lang):
            raise TokenizerError(f"no letters known for {lang!r}: give sample text in it "
                                 f"(myxtts knows the alphabets of {', '.join(ALPHABETS)})")
    bpe = _load_bpe_checked(vocab, where)
    old = bpe.get_vocab()
    before = max(old.values()) + 1
    try:
        data = json.loads(vocab)
        table, added = data["model"]["vocab"], data.setdefault("added_tokens", [])
    except (ValueError, KeyError, TypeError):
        raise TokenizerError(f"{where}: not a byte-pair vocabulary in XTTS's format (no "
                             f"model.vocab); use the vocab.json of the XTTS-v2 download") from None
    if data["model"].get("type") != "BPE" or not isinstance(table, dict):
        raise TokenizerError(f"{where}: its model is {data['model'].get('type')!r}, not BPE; "
                             f"use the vocab.json of the XTTS-v2 download")
    old_tags = {language_tag(lang.split("-")[0]) for lang in LANGUAGES} | {
        language_tag(lang) for lang in OWN_CHAR_LIMITS}
    template = next((e for e in added if e.get("content") in old_tags), None)
    next_id = before
    new_languages: dict[str, int] = {}
    for lang in dict.fromkeys(codes):
        tag = language_tag(lang)
        if tag in old:
            continue
        table[tag] = next_id
        added.append(_special_entry(template, tag, next_id))
        new_languages[lang] = next_id
        next_id += 1
    wanted = sorted({ch for lang in dict.fromkeys(codes)
                     for ch in language_letters(lang, samples.get(lang, ()))})
    letters: dict[str, int] = {}
    for ch in missing_characters(bpe, wanted):
        table[ch] = next_id
        letters[ch] = next_id
        next_id += 1
    if not new_languages and not letters:
        return GrownVocab(vocab, {}, {}, before, {})
    text = json.dumps(data, ensure_ascii=False, indent=2)
    grown = _load_bpe_checked(text, where)
    if any(grown.token_to_id(token) != i for token, i in old.items()):  # the contract, kept
        raise TokenizerError(f"{where}: growing it would move old tokens; it is not a "
                             f"vocabulary in XTTS's format")
    language_ids, piece_ids = _source_groups(old, {e.get("content") for e in added}, old_tags)
    sources = {i: language_ids for i in new_languages.values()}
    sources |= {i: piece_ids for i in letters.values()}
    return GrownVocab(text, new_languages, letters, before, sources)


def _source_groups(old: Mapping[str, int], special: set, old_tags: set
                   ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The old ids a new language token starts from (the old language tokens) and those a
    new letter starts from (every old piece that is no special token)."""
    language_ids = tuple(sorted(i for token, i in old.items() if token in old_tags))
    piece_ids = tuple(sorted(i for token, i in old.items() if token not in special))
    return language_ids, piece_ids


def row_sources(vocab: str, grown: str, where: str = "vocab.json") -> dict[int, tuple[int, ...]]:
    """``GrownVocab.row_sources`` of ``grown`` (a vocabulary :func:`grow_vocab` made from
    ``vocab``), computed from the two texts alone: what a trainer needs to grow a model's
    rows for a vocabulary grown elsewhere (``myxtts prepare --xtts``)."""
    old = _load_bpe_checked(vocab, where).get_vocab()
    new = _load_bpe_checked(grown, where).get_vocab()
    if any(new.get(token) != i for token, i in old.items()):
        raise TokenizerError(f"{where}: the grown vocabulary moves tokens of the model's; it "
                             f"was not grown from this model's vocab.json")
    special = {e.get("content") for e in json.loads(vocab).get("added_tokens", [])}
    added_special = {e.get("content") for e in json.loads(grown).get("added_tokens", [])}
    old_tags = {language_tag(lang.split("-")[0]) for lang in LANGUAGES} | {
        language_tag(lang) for lang in OWN_CHAR_LIMITS}
    language_ids, piece_ids = _source_groups(old, special, old_tags)
    return {i: language_ids if token in added_special else piece_ids
            for token, i in new.items() if token not in old}


def _load_bpe_checked(text: str, where: str):
    """The Tokenizer of vocabulary ``text``; it must have [START], [STOP] and [UNK]."""
    bpe = load_bpe(Path(where), text)
    for token in (START, STOP, UNK):
        if bpe.token_to_id(token) is None:
            raise TokenizerError(f"{where}: the vocabulary has no {token} token; use the "
                                 f"vocab.json of the XTTS-v2 download")
    return bpe
