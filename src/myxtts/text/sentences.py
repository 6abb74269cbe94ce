"""Sentence splitting for long-form synthesis: ``split_sentences`` and ``split_long``.

Why: the model is trained on clips of a few seconds, so a paragraph is spoken one sentence
at a time, and a sentence longer than anything seen in training is cut further, where a
reader would pause. Both functions only *cut* text: they never drop, add or reorder a
character, so joining the pieces with single spaces gives back the input with its
whitespace normalised. That makes the cut easy to test, and nothing the user wrote goes
unspoken.
"""

from __future__ import annotations

import re

__all__ = ["split_sentences", "split_long"]

_ENDS = ".!?\u2026"  # . ! ? …
_ENDS_BY_LANGUAGE = {"fa": _ENDS + "\u061f\u06d4"}  # + ؟ and the Arabic full stop ۔
_CLOSERS = "\"'\u201d\u2019\u00bb\u203a)]}"  # " ' ” ’ » › ) ] }
_OPENERS = "\"'\u201c\u2018\u00ab\u2039([{"  # stripped before looking at a word
_CLAUSE = ",;:\u2014\u2013\u060c"  # , ; : — – ،
_CLAUSE_BY_LANGUAGE = {"fa": _CLAUSE + "\u061b"}  # + ؛

# Lowercased, without the final period.
_ABBREVIATIONS = frozenset({"mr", "mrs", "ms", "dr", "st", "prof", "jr", "sr", "e.g", "i.e", "vs"})
_END_IF_CAPITAL = frozenset({"etc", "a.m", "p.m"})  # often end a sentence, often do not
_PARAGRAPH_RE = re.compile(r"\n[^\S\n]*\n\s*")  # a line holding only whitespace
_END_RE_CACHE: dict[str, re.Pattern[str]] = {}


def _language(language: str) -> str:
    return language.strip().lower().replace("_", "-").split("-", 1)[0]


def _end_re(language: str) -> re.Pattern[str]:
    """A run of sentence-end marks, then closers, then a space or the end of the text."""
    ends = _ENDS_BY_LANGUAGE.get(language, _ENDS)
    if ends not in _END_RE_CACHE:
        _END_RE_CACHE[ends] = re.compile(
            f"(?P<mark>[{re.escape(ends)}]+)(?P<close>[{re.escape(_CLOSERS)}]*)(?= |$)")
    return _END_RE_CACHE[ends]


def _word_after(text: str, at: int) -> str:
    """The word of whitespace-normalised ``text`` that starts after the space at ``at`` (if
    any), found in place: slicing the rest of a paragraph at every end mark would make
    splitting a long text quadratic."""
    start = at + 1 if text.startswith(" ", at) else at
    end = text.find(" ", start)
    return text[start:end if end >= 0 else len(text)]


def _word_before(text: str, at: int) -> str:
    """The word of ``text`` that ends at ``at``, found in place (see :func:`_word_after`)."""
    return text[text.rfind(" ", 0, at) + 1:at]


def _is_end(text: str, m: re.Match[str]) -> bool:
    """Whether the end-mark run ``m`` in whitespace-normalised ``text`` ends a sentence."""
    mark = m.group("mark")
    next_word = _word_after(text, m.end()).lstrip(_OPENERS)
    if set(mark) <= {".", "\u2026"} and (len(mark) > 1 or mark == "\u2026"):  # an ellipsis
        return not (next_word[:1].isalpha() and next_word[:1].islower())
    if mark != ".":  # ! ? ?! ؟ ۔ and mixes end, but not a quoted question before "she asked"
        return not (m.group("close") and next_word[:1].isalpha() and next_word[:1].islower())
    word = _word_before(text, m.start()).lstrip(_OPENERS)
    low = word.lower()
    if low in _ABBREVIATIONS:
        return False
    if len(word) == 1 and word.isascii() and word.isalpha():  # an initial
        return False
    if low == "no" and next_word[:1].isdigit():
        return False
    if low in _END_IF_CAPITAL and not next_word[:1].isupper():
        return False
    return True


def split_sentences(text: str, language: str) -> list[str]:
    """The sentences of ``text``, whitespace-normalised, in order, none empty.

    ``" ".join(split_sentences(t, lang)) == " ".join(t.split())`` for every ``t``. Ends:
    ``. ! ? …`` (Persian also ``؟ ۔``) with closing quotes/brackets, before whitespace or
    the end, and a blank line. Not ends: a period after a common English abbreviation (Mr.
    Dr. e.g. ...; "No." only before a number; "etc.", "a.m.", "p.m." only before a
    capital), after a single letter (initials), inside a word or number ("3.5"); ``! ?``
    closing a quotation before a lowercase word; an ellipsis before a lowercase word.
    Abbreviation rules look at Latin letters only, so they hold inside any language.
    ``;`` and ``؛`` never end a sentence (``split_long`` cuts there).
    """
    lang = _language(language)
    end_re = _end_re(lang)
    out: list[str] = []
    for paragraph in _PARAGRAPH_RE.split(text):
        para = " ".join(paragraph.split())
        start = 0
        for m in end_re.finditer(para):
            if _is_end(para, m):
                piece = para[start:m.end()].strip()
                if piece:
                    out.append(piece)
                start = m.end()
        piece = para[start:].strip()
        if piece:
            out.append(piece)
    return out


def split_long(sentence: str, max_chars: int, language: str) -> list[str]:
    """Cut ``sentence`` into pieces of at most ``max_chars`` characters.

    First at clause punctuation (``, ; : — – ،`` and, for Persian, ``؛``) followed by a
    space, the mark staying with the words before it; neighbouring clauses are packed
    together while they fit, so a short clause is not spoken alone. A piece still too
    long is cut at the space nearest its middle, recursively (balanced halves sound more
    natural than a full line and a stub). Only a single word longer than ``max_chars``
    stays over the limit. Joining the pieces with single spaces gives back the
    whitespace-normalised sentence.
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    text = " ".join(sentence.split())
    if not text:
        return []
    if len(text) <= max_chars:
        return [text]
    marks = _CLAUSE_BY_LANGUAGE.get(_language(language), _CLAUSE)
    clauses = re.split(f"(?<=[{re.escape(marks)}]) ", text)
    packed: list[str] = []
    for clause in clauses:
        if packed and len(packed[-1]) + 1 + len(clause) <= max_chars:
            packed[-1] += " " + clause
        else:
            packed.append(clause)
    out: list[str] = []
    for piece in packed:
        out += _halve(piece, max_chars)
    return out


def _halve(text: str, max_chars: int) -> list[str]:
    """``text`` cut at the space nearest its middle until every piece fits (or is one word)."""
    if len(text) <= max_chars or " " not in text:
        return [text]
    middle = len(text) / 2
    left = text.rfind(" ", 0, int(middle) + 1)  # the spaces either side of the middle,
    right = text.find(" ", int(middle) + 1)  # found in place (a scan of every space per
    cut = min((i for i in (left, right) if i >= 0),  # level would be slow on a long text)
              key=lambda i: (abs(i - middle), i))
    return _halve(text[:cut], max_chars) + _halve(text[cut + 1:], max_chars)
