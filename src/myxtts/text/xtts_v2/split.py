"""Long text cut into pieces XTTS-v2 speaks whole (``split_text``): at most the language's
character limit each, cut where a reader pauses.

The reference uses spaCy's sentencizer; this uses the project's own splitter
(myxtts.text.sentences), which knows ". ! ? …", and adds the marks it does not know: the
Devanagari danda (Hindi "।"), the Arabic question mark, and for Chinese and Japanese, which
put no space between sentences or words, the CJK sentence ends and clause marks. Pieces
need not equal the reference's; they keep every character (see ``split_text``).
"""

from __future__ import annotations

import re

from myxtts.text.sentences import split_long, split_sentences

__all__ = ["split_text"]

# Sentence ends the project's splitter does not know, cut after when a space follows.
_EXTRA_ENDS = {"hi": re.compile(r"(?<=[।॥])\s+"), "ar": re.compile(r"(?<=؟)\s+")}
_CJK = frozenset({"zh", "ja"})
_CJK_ENDS = "。！？!?…．"
_CJK_MARKS = _CJK_ENDS + "，、；：,;:"
_CLOSERS = "」』”’）)》〉\"'"


def _runs(text: str, marks: str) -> list[str]:
    """``text`` cut after each run of ``marks`` (and the closing quotes/brackets after it);
    the pieces joined give back ``text``."""
    mark = re.escape(marks)
    return re.findall(f"[^{mark}]*[{mark}]+[{re.escape(_CLOSERS)}]*|[^{mark}]+$", text)


def _pack(pieces: list[str], part: str, limit: int, glue: str) -> None:
    """Append ``part`` to the last piece while the two fit in ``limit``, else start one."""
    if pieces and len(pieces[-1]) + len(glue) + len(part) <= limit:
        pieces[-1] += glue + part
    else:
        pieces.append(part)


def _split_cjk(text: str, limit: int) -> list[str]:
    """Chinese/Japanese: sentences packed; a sentence over the limit cut at clause marks,
    a clause over it every ``limit`` characters (no spaces to respect)."""
    pieces: list[str] = []
    for sentence in _runs(" ".join(text.split()), _CJK_ENDS):
        if len(sentence) <= limit:
            _pack(pieces, sentence, limit, "")
            continue
        for clause in _runs(sentence, _CJK_MARKS):
            for start in range(0, len(clause), limit):
                _pack(pieces, clause[start:start + limit], limit, "")
    return [p.strip() for p in pieces if p.strip()]


def split_text(text: str, base_language: str, limit: int) -> list[str]:
    """``text`` in pieces of at most ``limit`` characters, sentences packed together while
    they fit, a longer sentence cut at clause marks, then at spaces (a single word longer
    than the limit stays whole). Nothing is lost or reordered: for languages written with
    spaces ``" ".join(pieces) == " ".join(text.split())``; for Chinese and Japanese the
    pieces run together give back the text, whitespace aside."""
    if base_language in _CJK:
        return _split_cjk(text, limit)
    extra = _EXTRA_ENDS.get(base_language)
    blocks = extra.split(text) if extra else [text]
    pieces: list[str] = []
    for block in blocks:
        for sentence in split_sentences(block, base_language):
            for part in split_long(sentence, limit, base_language):
                _pack(pieces, part, limit, " ")
    return pieces
