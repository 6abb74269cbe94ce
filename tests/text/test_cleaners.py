"""Behaviour of clean_text: English and Persian rules, generic cleanup, mixed-script lines."""

from __future__ import annotations

import unicodedata

import pytest

from myxtts.config import TextConfig
from myxtts.text import clean_text, english, persian

ZWNJ = "\u200c"
CFG = TextConfig(languages=["en", "fa"])


def en(text: str, **kw) -> str:
    return clean_text(text, "en", TextConfig(**kw) if kw else CFG)


def fa(text: str, **kw) -> str:
    return clean_text(text, "fa", TextConfig(**kw) if kw else CFG)


# ---------------------------------------------------------------- English numbers

@pytest.mark.parametrize("raw, expected", [
    ("0", "zero"),
    ("7", "seven"),
    ("13", "thirteen"),
    ("21", "twenty-one"),
    ("100", "one hundred"),
    ("305", "three hundred five"),
    ("6439", "six thousand four hundred thirty-nine"),  # 4 digits but outside year range
    ("1,234,567", "one million two hundred thirty-four thousand five hundred sixty-seven"),
    ("2,000,000,000", "two billion"),
    ("1000000000000", "one trillion"),
    ("3.14", "three point one four"),
    ("0.05", "zero point zero five"),
    ("-5", "minus five"),
    ("007", "zero zero seven"),
    ("1.2.3", "one point two point three"),
])
def test_english_cardinals_and_decimals(raw, expected):
    assert en(raw) == expected


@pytest.mark.parametrize("raw, expected", [
    ("1984", "nineteen eighty-four"),
    ("1905", "nineteen oh five"),
    ("1900", "nineteen hundred"),
    ("2000", "two thousand"),
    ("2005", "two thousand five"),
    ("2024", "twenty twenty-four"),
    ("1,984", "one thousand nine hundred eighty-four"),  # a comma makes it a quantity
    ("the 1980s", "the nineteen eighties"),
    ("the '90s", "the nineties"),
])
def test_english_years_and_decades(raw, expected):
    assert en(raw) == expected


@pytest.mark.parametrize("raw, expected", [
    ("1st", "first"), ("2nd", "second"), ("3rd", "third"), ("4th", "fourth"),
    ("11th", "eleventh"), ("12th", "twelfth"), ("20th", "twentieth"),
    ("23rd", "twenty-third"), ("101st", "one hundred first"), ("1,000th", "one thousandth"),
])
def test_english_ordinals(raw, expected):
    assert en(raw) == expected


@pytest.mark.parametrize("raw, expected", [
    ("$3.50", "three dollars, fifty cents"),
    ("$1", "one dollar"),
    ("$0.01", "one cent"),
    ("$3.00", "three dollars"),
    ("$1,000,000", "one million dollars"),
    ("$2.5 million", "two point five million dollars"),
    ("£1.01", "one pound, one penny"),
    ("£90,000", "ninety thousand pounds"),
    ("€2.50", "two euros, fifty cents"),
    ("50%", "fifty percent"),
    ("3.5 %", "three point five percent"),
])
def test_english_currency_and_percent(raw, expected):
    assert en(raw) == expected


@pytest.mark.parametrize("raw, expected", [
    ("at 3:30", "at three thirty"),
    ("at 7:05 pm", "at seven oh five p m"),
    ("at 10:00", "at ten o'clock"),
    ("at 7 a.m. today", "at seven a m today"),
    ("mp3", "mp three"),
    ("20°C", "twenty degrees celsius"),
])
def test_english_times_and_glued_numbers(raw, expected):
    assert en(raw) == expected


def test_english_sentence_with_everything():
    raw = "In 1984, Mr. Smith paid $3.50 for 2 apples \u2014 50% off!"
    assert en(raw) == ("in nineteen eighty-four, mister smith paid three dollars, fifty cents "
                       "for two apples - fifty percent off!")


def test_expand_numbers_off_keeps_digits_but_expands_abbreviations():
    out = en("Dr. Smith paid $3.50 in 1984.", expand_numbers=False, lowercase=False)
    assert out == "Doctor Smith paid $3.50 in 1984."


# ---------------------------------------------------------------- English abbreviations

@pytest.mark.parametrize("raw, expected", [
    ("Mr. Smith", "mister smith"),
    ("Mrs. Smith", "missus smith"),
    ("Dr. Jones", "doctor jones"),
    ("St. Louis", "saint louis"),
    ("we went to St. Paul's", "we went to saint paul's"),
    ("on Main St.", "on main street."),
    ("on Main St. Then home", "on main street. then home"),
    ("apples, pears, etc.", "apples, pears, et cetera."),
    ("pears etc. and more", "pears et cetera and more"),
    ("No. 5", "number five"),
    ("cats vs. dogs", "cats versus dogs"),
    ("e.g. cats", "for example cats"),
    ("Tom & Jerry", "tom and jerry"),
    ("it will mar. Later", "it will mar. later"),  # lowercase "mar." is the verb, not March
])
def test_english_abbreviations(raw, expected):
    assert en(raw) == expected


def test_abbreviation_keeps_capital_when_not_lowercasing():
    assert en("Dr. Who and mr. Bean", lowercase=False) == "Doctor Who and mister Bean"


# ---------------------------------------------------------------- generic cleanup

def test_whitespace_and_control_characters():
    raw = "  Hello,\t\tworld \n again\x07 !\u00a0ok\u200b\u200e\u00ad  "
    assert en(raw) == "hello, world again! ok"


def test_quotes_dashes_ellipsis_brackets():
    raw = "\u201cHi\u201d \u2018there\u2019\u2026 10\u201320 \u00abq\u00bb [x] wait.... really?!!"
    assert en(raw, expand_numbers=False) == "\"hi\" 'there'... 10-20 \"q\" (x) wait... really?!"


def test_nfc_decomposed_equals_composed():
    decomposed = "cafe\u0301"
    composed = "caf\u00e9"
    assert decomposed != composed
    assert en(decomposed) == en(composed) == composed
    assert clean_text(decomposed, "de", CFG) == composed


def test_lowercase_flag():
    assert en("Hello World", lowercase=False) == "Hello World"
    assert en("Hello World") == "hello world"


def test_other_languages_get_generic_cleanup_only():
    raw = "Gr\u00fc\u00dfe aus K\u00f6ln,  3 \u00c4pfel \u2014 \u201etoll\u201c"
    assert clean_text(raw, "de", CFG) == "gr\u00fc\u00dfe aus k\u00f6ln, 3 \u00e4pfel - \"toll\""


def test_other_scripts_keep_their_joiners():
    # Devanagari uses ZWJ/ZWNJ for conjunct shapes: only en/fa tidy joiners.
    raw = "\u0915\u094d\u200d\u0937 \u0915\u094d\u200c\u0937"
    assert clean_text(raw, "hi", CFG) == raw


def test_language_code_variants():
    assert clean_text("Dr. X", "EN-us", CFG) == clean_text("Dr. X", "en", CFG) == "doctor x"
    assert clean_text("\u06f5", "fa_IR", CFG) == clean_text("\u06f5", "farsi", CFG) == "پنج"


def test_rejects_non_string():
    with pytest.raises(TypeError, match="expects a str"):
        clean_text(b"bytes", "en", CFG)  # type: ignore[arg-type]


@pytest.mark.parametrize("lang, raw", [
    ("en", "In 1984, Mr. Smith paid $3.50 at 7 p.m. on Main St., etc."),
    ("fa", "من ۱۲۳ كتاب عربي دارم، و ٤٥ دفتر؛ آیا می‌خواهی؟ ۵۰٪"),
    ("en", "I love تهران and ۳ books"),
])
def test_idempotent(lang, raw):
    once = clean_text(raw, lang, CFG)
    assert clean_text(once, lang, CFG) == once


# ---------------------------------------------------------------- Persian

def test_persian_letter_forms():
    # Arabic yeh / alef maksura / kaf / teh marbuta -> Persian forms.
    assert fa("\u0639\u0631\u0628\u064a \u0643\u062a\u0627\u0628 \u0645\u062f\u0631\u0633\u0629 \u0645\u0648\u0633\u0649") == \
        "\u0639\u0631\u0628\u06cc \u06a9\u062a\u0627\u0628 \u0645\u062f\u0631\u0633\u0647 \u0645\u0648\u0633\u06cc"


def test_persian_diacritics_and_tatweel_removed():
    raw = "سلامـــــ دوستِ عزیزَم مُحَمَّد"
    out = fa(raw)
    assert out == "سلام دوست عزیزم محمد"
    assert "\u0640" not in out
    assert not any(unicodedata.combining(c) for c in out)


def test_persian_ezafe_hamza_is_one_character():
    # heh + combining hamza (U+0654) and the precomposed U+06C0 are one spelling.
    assert fa("\u062e\u0627\u0646\u0647\u0654 \u0645\u0646") == fa("\u062e\u0627\u0646\u06c0 \u0645\u0646") \
        == "\u062e\u0627\u0646\u06c0 \u0645\u0646"


def test_persian_presentation_forms():
    assert fa("\ufe8e\ufedf\ufedc\ufe98\ufe8e\ufe91") == "الکتاب"


@pytest.mark.parametrize("raw, expected", [
    ("۱۲۳", "صد و بیست و سه"),          # Persian digits
    ("١٢٣", "صد و بیست و سه"),          # Arabic-Indic digits
    ("123", "صد و بیست و سه"),          # Western digits in a Persian line
    ("۰", "صفر"),
    ("۱۷", "هفده"),
    ("۱۰۰۰", "هزار"),
    ("۱۳۹۸", "هزار و سیصد و نود و هشت"),
    ("۲۰۰۰", "دو هزار"),
    ("۱٬۰۰۰٬۰۰۰", "یک میلیون"),
    ("۲۵۰۰۰۰۰۰۰۱", "دو میلیارد و پانصد میلیون و یک"),
    ("۳٫۱۴", "سه ممیز چهارده"),
    ("۵۰٪", "پنجاه درصد"),
    ("-۵", "منفی پنج"),
    ("۰۹۱۲", "صفر نه یک دو"),
    ("۳م", "سوم"),
    ("۳۰ام", "سی\u200cام"),
    ("۲۰مین", "بیستمین"),
])
def test_persian_numbers(raw, expected):
    assert fa(raw) == expected


def test_persian_number_words_function():
    assert persian.number_to_words(1_000_000_000) == "یک میلیارد"
    assert persian.number_to_words(999) == "نهصد و نود و نه"
    assert persian.number_to_words(21_001) == "بیست و یک هزار و یک"


def test_persian_digits_kept_when_not_expanding():
    assert fa("من ۱۲۳ کتاب", expand_numbers=False) == "من 123 کتاب"


def test_persian_punctuation_normalised():
    assert fa("سلام، خوبی؟ بله؛ ممنون") == "سلام, خوبی? بله; ممنون"


def test_zwnj_kept_inside_words():
    word = "می" + ZWNJ + "روم"
    out = fa(word)
    assert out == word and ZWNJ in out
    assert fa("کتاب" + ZWNJ + "ها") == "کتاب" + ZWNJ + "ها"


def test_misplaced_and_other_zero_width_characters():
    # doubled ZWNJ -> one; ZWNJ next to a space -> gone; ZWNJ after a non-joining letter
    # (و) has no visual effect -> gone; ZWSP inside a word -> ZWNJ; ZWJ -> gone.
    raw = ("کتاب" + ZWNJ * 2 + "ها " + ZWNJ + "آرزو" + ZWNJ + "ها می\u200bروم" + ZWNJ
           + " من\u200dو")
    assert fa(raw) == "کتاب" + ZWNJ + "ها آرزوها می" + ZWNJ + "روم منو"


def test_lowercase_is_noop_for_persian():
    raw = "سلام دوست من"
    assert fa(raw, lowercase=True) == fa(raw, lowercase=False) == raw


# ---------------------------------------------------------------- mixed scripts

def test_english_line_with_persian_words():
    raw = "I love \u062a\u0647\u0631\u0627\u0646 and \u0643\u062a\u0627\u0628" + ZWNJ + "\u0647\u0627 in \u06f2\u06f0\u06f2\u06f4."
    # Persian words keep their script (letter forms fixed, ZWNJ kept); digits read in English.
    assert en(raw) == "i love تهران and کتاب" + ZWNJ + "ها in twenty twenty-four."


def test_persian_line_with_english_words():
    raw = "من iPhone ۱۵ و Python دارم"
    assert fa(raw) == "من iphone پانزده و python دارم"
    assert fa(raw, lowercase=False) == "من iPhone پانزده و Python دارم"


# ---------------------------------------------------------------- helpers used elsewhere

def test_english_number_helpers():
    assert english.number_to_words(40) == "forty"
    assert english.ordinal_to_words(42) == "forty-second"
    assert english.year_to_words(2010) == "twenty ten"
    assert english.number_to_words(10**21) == "one " + "zero " * 20 + "zero"
