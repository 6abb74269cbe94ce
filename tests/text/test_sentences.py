"""Sentence splitting: where English and Persian sentences end, and cutting long ones."""

from __future__ import annotations

import random

import pytest

from myxtts.text import split_long, split_sentences

ZWNJ = "\u200c"


def _norm(text: str) -> str:
    return " ".join(text.split())


def test_english_abbreviations_decimals_initials_quotes():
    text = ('Mr. Smith paid $3.50 for it, e.g. at St. Mary\'s shop. "Really?" she asked. '
            'J. R. R. Tolkien wrote it (in 1937.) Dr. No. 5 arrived;\tthen left! '
            'Apples, pears, etc. are fruit... and then? Wait... What now?! The end')
    assert split_sentences(text, "en") == [
        "Mr. Smith paid $3.50 for it, e.g. at St. Mary's shop.",
        '"Really?" she asked.',
        "J. R. R. Tolkien wrote it (in 1937.)",
        "Dr. No. 5 arrived; then left!",
        "Apples, pears, etc. are fruit... and then?",
        "Wait...",
        "What now?!",
        "The end",
    ]


def test_closing_quote_stays_and_ellipsis_is_one_mark():
    assert split_sentences('He said "stop." She did. It was over.\u2026 Gone.', "en") == [
        'He said "stop."', "She did.", "It was over.\u2026", "Gone."]
    assert split_sentences("etc. Then i.e. this. Vs. that.", "en") == [
        "etc.", "Then i.e. this.", "Vs. that."]


def test_paragraph_breaks_always_end_and_whitespace_is_normalised():
    text = "  First line\nstill the first sentence\n\n  \nSecond paragraph, no stop\r\n\r\nThird.  "
    assert split_sentences(text, "en") == [
        "First line still the first sentence", "Second paragraph, no stop", "Third."]
    assert split_sentences(" \n\n \t", "en") == []
    assert split_sentences("", "fa") == []


def test_persian_question_mark_comma_semicolon_and_zwnj():
    text = (f"این کتاب{ZWNJ}ها خوب است؟ بله، من می{ZWNJ}دانم؛ او هم می{ZWNJ}داند. "
            f"«سلام.» قیمت ۳.۵ تومان است\u06d4 آخر")
    got = split_sentences(text, "fa")
    assert got == [f"این کتاب{ZWNJ}ها خوب است؟", f"بله، من می{ZWNJ}دانم؛ او هم می{ZWNJ}داند.",
                   "«سلام.»", "قیمت ۳.۵ تومان است\u06d4", "آخر"]
    assert sum(s.count(ZWNJ) for s in got) == 3
    # The Persian question mark ends sentences only when the language is Persian.
    assert split_sentences("چرا؟ چون", "en") == ["چرا؟ چون"]
    assert split_sentences("چرا؟ چون", "FA-ir") == ["چرا؟", "چون"]


def test_every_character_survives_in_order():
    rng = random.Random(0)
    alphabet = list("abc XYZ.!?…,;:\"'()\n\t\r 3.5") + ["Mr.", "e.g.", "J.", "؟", "،", "؛", ZWNJ, "ش", "\n\n"]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        for lang in ("en", "fa"):
            pieces = split_sentences(text, lang)
            assert " ".join(pieces) == _norm(text), (text, pieces)
            assert all(p and p == p.strip() for p in pieces)


def test_601_character_paragraph():
    sentence = "The quick brown fox, aged 3.5 years, met Dr. Brown at 10 a.m. on St. James Street. "
    text = (sentence * 8)[:601]
    assert len(text) == 601
    pieces = split_sentences(text, "en")
    assert "".join(p + " " for p in pieces).strip() == _norm(text)
    assert " ".join(pieces) == _norm(text)
    assert len(pieces) >= 8 and all(p.startswith("The quick") for p in pieces)


def test_split_long_clauses_then_middle_word_boundary():
    s = "one two three, four five six; seven eight nine ten eleven twelve thirteen"
    assert split_long(s, 100, "en") == [s]
    got = split_long(s, 20, "en")
    assert got == ["one two three,", "four five six;", "seven eight nine ten", "eleven twelve", "thirteen"]
    assert all(len(p) <= 20 for p in got) and " ".join(got) == s
    # Short clauses are packed together while they fit.
    assert split_long("a, b, c, d, e, f", 8, "en") == ["a, b, c,", "d, e, f"]
    fa = "من کتاب را خواندم، او نامه را نوشت؛ ما به خانه رفتیم"
    assert split_long(fa, 20, "fa") == ["من کتاب را خواندم،", "او نامه را نوشت؛", "ما به خانه رفتیم"]


def test_split_long_bounds_single_word_and_round_trip():
    assert split_long("supercalifragilistic", 5, "en") == ["supercalifragilistic"]
    assert split_long("  \n ", 5, "en") == []
    assert split_long("ab   cd\nef", 100, "en") == ["ab cd ef"]
    with pytest.raises(ValueError, match="max_chars"):
        split_long("text", 0, "en")
    rng = random.Random(1)
    words = ["a", "bb", "ccc,", "dddd;", "eeeee", "ff:", "—", "کتاب\u200cها،", "x" * 30]
    for _ in range(300):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 40)))
        limit = rng.randint(1, 60)
        pieces = split_long(text, limit, "fa" if rng.random() < 0.5 else "en")
        assert " ".join(pieces) == text
        assert all(len(p) <= limit or " " not in p for p in pieces), (limit, pieces)
