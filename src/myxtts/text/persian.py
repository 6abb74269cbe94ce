"""Persian (Farsi) normalisation: letter forms, diacritics, ZWNJ, digits, number words.

Why: Persian text mixes Arabic and Persian code points that look the same (ي/ی, ك/ک),
optional short-vowel marks, tatweel (ـ) and invisible joiners, so a character-level model
would learn several spellings of one word. The zero-width non-joiner (U+200C) is part of
correct spelling ("کتاب‌ها"), so it is kept where it does something and removed where it
cannot (``fix_zwnj``). ``normalize_arabic_script`` touches only Arabic-script characters
and joiners, so it is safe on mixed lines; ``cleaners.clean_text`` runs it for English and
Persian text (an Arabic-script word in an English line is taken to be Persian).
"""

from __future__ import annotations

import re
import unicodedata

from myxtts.text._shared import MINUS_RE, NUMBER_BODY, split_number, sub_spaced, thousand_groups

__all__ = ["normalize_persian", "normalize_arabic_script", "fix_zwnj", "expand_numbers",
           "number_to_words", "ordinal_to_words", "DIGITS_TO_ASCII", "ZWNJ"]

ZWNJ = "\u200c"
ZWJ = "\u200d"
ZWSP = "\u200b"

# Extended Arabic-Indic (Persian ۰-۹) and Arabic-Indic (٠-٩) digits -> 0-9.
DIGITS_TO_ASCII = {0x06F0 + i: str(i) for i in range(10)} | {0x0660 + i: str(i) for i in range(10)}

# Arabic code points (or Persian variants used by other languages) -> the Persian letter.
_LETTER_MAP = str.maketrans({
    "\u064a": "\u06cc",  # ARABIC YEH ي -> FARSI YEH ی
    "\u0649": "\u06cc",  # ALEF MAKSURA ى -> ی
    "\u06d0": "\u06cc",  # YEH (Pashto/Uyghur E) ې -> ی
    "\u0643": "\u06a9",  # ARABIC KAF ك -> KEHEH ک
    "\u06aa": "\u06a9",  # SWASH KAF ڪ -> ک
    "\u0629": "\u0647",  # TEH MARBUTA ة -> HEH ه (Persian spells Arabic loanwords with ه)
    "\u06c3": "\u0647",  # TEH MARBUTA GOAL ۃ -> ه
    "\u06d5": "\u0647",  # AE ە -> ه
    "\u06c1": "\u0647",  # HEH GOAL ہ -> ه
    "\u06be": "\u0647",  # HEH DOACHASHMEE ھ -> ه
    "\u06c2": "\u06c0",  # HEH GOAL WITH HAMZA ۂ -> HEH WITH YEH ABOVE ۀ (ezafe)
    "\u0671": "\u0627",  # ALEF WASLA ٱ -> ALEF ا
    "\u0625": "\u0627",  # ALEF WITH HAMZA BELOW إ -> ا (not written in Persian)
    "\u0640": None,      # TATWEEL ـ (pure stretching)
})

# Short vowels, tanween, shadda, sukun, superscript alef and Quranic annotation marks.
# Hamza above (U+0654) and madda (U+0653) are handled first because they form letters.
_DIACRITICS_RE = re.compile(
    "[\u0610-\u061a\u064b-\u0652\u0655-\u065f\u0670\u06d6-\u06dc\u06df-\u06e8"
    "\u06ea-\u06ed\u08d3-\u08e1\u08e3-\u08ff]"
)
_HAMZA_COMPOSE = {"\u0647\u0654": "\u06c0", "\u06cc\u0654": "\u0626", "\u0648\u0654": "\u0624",
                  "\u0627\u0654": "\u0623", "\u0627\u0653": "\u0622"}
_HAMZA_RE = re.compile("|".join(_HAMZA_COMPOSE))
_LEFTOVER_MARKS_RE = re.compile("[\u0653\u0654]")
_PRESENTATION_RE = re.compile("[\ufb50-\ufdff\ufe70-\ufefe]")

_ARABIC_LETTER_RANGES = [(0x0620, 0x064A), (0x066E, 0x066F), (0x0671, 0x06D3), (0x06D5, 0x06D5),
                         (0x06EE, 0x06EF), (0x06FA, 0x06FC), (0x06FF, 0x06FF),
                         (0x0750, 0x077F), (0x08A0, 0x08C9)]
ARABIC_LETTERS = frozenset(chr(c) for lo, hi in _ARABIC_LETTER_RANGES for c in range(lo, hi + 1))
_ARABIC_CLASS = "".join(f"\\u{lo:04x}-\\u{hi:04x}" for lo, hi in _ARABIC_LETTER_RANGES)
# Letters that never join the following letter: a ZWNJ after them changes nothing visible,
# so "آرزو‌ها" and "آرزوها" are one spelling.
_RIGHT_JOINING = frozenset(
    "\u0621\u0622\u0623\u0624\u0625\u0627\u0629\u062f\u0630\u0631\u0632\u0648\u0671\u0698"
    "\u06c0\u06d5\u06c4\u06c5\u06c6\u06c7\u06c8\u06c9\u06ca\u06cb\u06cd\u06cf\u06ee\u06ef"
    + "".join(chr(c) for c in range(0x0688, 0x069A))
)
_ZWNJ_RUN_RE = re.compile("\u200c{2,}")
_ZWSP_IN_WORD_RE = re.compile(f"(?<=[{_ARABIC_CLASS}])\u200b+(?=[{_ARABIC_CLASS}])")


def _presentation_form(m: re.Match[str]) -> str:
    # NFKC maps positional forms (ﻻ, ﮐ, ...) to base letters; isolated vowel-mark forms
    # become a space + mark, which is dropped with the other diacritics.
    base = unicodedata.normalize("NFKC", m.group(0))
    stripped = base.strip()
    return "" if all(unicodedata.combining(c) for c in stripped) else base


def fix_zwnj(text: str) -> str:
    """Keep a ZWNJ only between an Arabic-script letter that joins forward and a letter.

    Runs collapse to one; a ZWNJ next to a space, punctuation, digit, Latin letter, the
    text edge, or after a non-joining letter (ا د ذ ر ز ژ و ...) has no effect and goes.
    A zero-width space typed inside a Persian word (a common stand-in for the ZWNJ)
    becomes one; a zero-width joiner is dropped (it only forces the default shaping).
    """
    if ZWSP in text:
        text = _ZWSP_IN_WORD_RE.sub(ZWNJ, text)
    text = text.replace(ZWJ, "")
    if ZWNJ not in text:
        return text
    text = _ZWNJ_RUN_RE.sub(ZWNJ, text)
    out = []
    last = len(text) - 1
    for i, ch in enumerate(text):
        if ch == ZWNJ:
            prev = text[i - 1] if i > 0 else ""
            nxt = text[i + 1] if i < last else ""
            if not (prev in ARABIC_LETTERS and prev not in _RIGHT_JOINING
                    and nxt in ARABIC_LETTERS):
                continue
        out.append(ch)
    return "".join(out)


def normalize_arabic_script(text: str) -> str:
    """Persian letter forms, no diacritics/tatweel, tidy joiners; other scripts untouched."""
    if _PRESENTATION_RE.search(text):
        text = _PRESENTATION_RE.sub(_presentation_form, text)
    text = text.translate(_LETTER_MAP)
    text = _DIACRITICS_RE.sub("", text)
    text = _HAMZA_RE.sub(lambda m: _HAMZA_COMPOSE[m.group(0)], text)
    text = _LEFTOVER_MARKS_RE.sub("", text)
    return fix_zwnj(text)


# ---------------------------------------------------------------- number words

_ONES = ["صفر", "یک", "دو", "سه", "چهار", "پنج", "شش", "هفت", "هشت", "نه", "ده", "یازده",
         "دوازده", "سیزده", "چهارده", "پانزده", "شانزده", "هفده", "هجده", "نوزده"]
_TENS = ["", "", "بیست", "سی", "چهل", "پنجاه", "شصت", "هفتاد", "هشتاد", "نود"]
_HUNDREDS = ["", "صد", "دویست", "سیصد", "چهارصد", "پانصد", "ششصد", "هفتصد", "هشتصد", "نهصد"]
_SCALES = ["", "هزار", "میلیون", "میلیارد", "تریلیون", "کوادریلیون"]
MAX_CARDINAL = 1000 ** len(_SCALES) - 1  # beyond this numbers are read digit by digit
_AND = " و "  # Persian joins every part of a number with "va": 21 = "bist o yek"


def _below_1000(n: int) -> str:
    hundreds, rest = divmod(n, 100)
    parts = [_HUNDREDS[hundreds]] if hundreds else []
    if rest >= 20:
        tens, ones = divmod(rest, 10)
        parts.append(_TENS[tens])
        if ones:
            parts.append(_ONES[ones])
    elif rest or not parts:
        parts.append(_ONES[rest])
    return _AND.join(parts)


def digits_to_words(digits: str) -> str:
    """``"0912"`` -> ``"صفر نه یک دو"`` (codes, phone numbers, leading zeros)."""
    return " ".join(_ONES[int(d)] for d in digits if d.isdigit())


def number_to_words(n: int) -> str:
    """Persian cardinal: ``1234`` -> ``"هزار و دویست و سی و چهار"`` (1000 is "هزار")."""
    if n < 0:
        return "منفی " + number_to_words(-n)
    if n > MAX_CARDINAL:
        return digits_to_words(str(n))
    groups = []
    for scale, group in thousand_groups(n):
        if scale == 0:
            groups.append(_below_1000(group))
        elif scale == 1 and group == 1:
            groups.append(_SCALES[1])  # "hezar", not "yek hezar"
        else:
            groups.append(f"{_below_1000(group)} {_SCALES[scale]}")
    return _AND.join(groups)


def ordinal_to_words(n: int, superlative: bool = False) -> str:
    """``3`` -> ``"سوم"``, ``30`` -> ``"سی‌ام"``, ``25`` -> ``"بیست و پنجم"``; ``...مین`` form
    ("پنجمین") when ``superlative``."""
    words = number_to_words(n)
    if words.endswith("سه"):
        words = words[:-2] + "سوم"
    elif words.endswith("سی"):
        words = words + ZWNJ + "ام"
    else:
        words = words + "م"
    return words + "ین" if superlative else words


def _integer_words(digits: str) -> str:
    if len(digits) > 1 and digits.startswith("0"):
        return digits_to_words(digits)
    return number_to_words(int(digits))


def _body_words(body: str) -> str:
    int_part, frac = split_number(body)
    words = _integer_words(int_part)
    if frac is None:
        return words
    # "3.05" -> "se momayyez sefr panj": leading zeros of the fraction are read out.
    zeros = len(frac) - len(frac.lstrip("0"))
    frac_words = [_ONES[0]] * zeros + ([number_to_words(int(frac))] if frac.lstrip("0") else [])
    return f"{words} ممیز {' '.join(frac_words)}"


_PERCENT_RE = re.compile(r"(?<![\d.,])(" + NUMBER_BODY + r")\s?%")
_ORDINAL_RE = re.compile(r"(?<![\d.,])(\d+)\u200c?(امین|ام|مین|م)(?!\w)")
_NUMBER_RE = re.compile(r"(?<![\d,])(" + NUMBER_BODY + r")(?!\d)")


def _ordinal_words(m: re.Match[str]) -> str | None:
    digits = m.group(1)
    if len(digits) > 1 and digits.startswith("0"):
        return None
    return ordinal_to_words(int(digits), superlative=m.group(2).endswith("ین"))


def expand_numbers(text: str) -> str:
    """Spell out percentages, ordinals (۵م, ۲۰مین), signs and every number in Persian words."""
    text = sub_spaced(_PERCENT_RE, lambda m: f"{_body_words(m.group(1))} درصد", text)
    text = sub_spaced(_ORDINAL_RE, _ordinal_words, text)
    text = MINUS_RE.sub("منفی ", text)
    text = sub_spaced(_NUMBER_RE, lambda m: _body_words(m.group(1)), text)
    return text


def normalize_persian(text: str, expand_numbers_: bool = True) -> str:
    """Persian-specific cleaning of generically cleaned text (letters already normalised)."""
    text = normalize_arabic_script(text)  # idempotent; cheap when already normalised
    if expand_numbers_:
        text = expand_numbers(text)
    return text
