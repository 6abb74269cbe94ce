"""Numbers read out as words for XTTS-v2's alphabetic languages (every language but Chinese
and Japanese), through num2words, in the reference's order: thousands separators dropped,
currency amounts, decimals, ordinals, then the remaining integers.

The order and the patterns decide what a number becomes, so they follow the reference
(coqui-tts 0.28) exactly, quirks included, because the released model learnt from its
output: English and Russian group thousands with commas, the others with a period, where
the reference's pattern accepts ANY character between groups ("1 234" is matched too, but
only periods are removed, so only period-grouped numbers change); a currency amount that
num2words cannot read stops the currency pass for the currencies after it (£, then $, then
€), leaving their symbols to be read as words; Turkish has no decimals pass.

Where the reference raises (num2words lacks the conversion: any number in Hindi, Czech
ordinals; a number beyond num2words' range), this module keeps going: an ordinal it cannot
read is left for the cardinal pass, and a number it cannot read stays as digits.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from myxtts.text.xtts_v2.tables import CURRENCY_SEPARATOR, DOT_BEFORE_SPACE, ORDINAL_SUFFIXES

__all__ = ["expand_numbers", "num2words_function"]

# Thousands grouped by commas, optionally with a decimal part: English and Russian.
_COMMA_GROUPED = re.compile(r"\b\d{1,3}(?:,\d{3})*(?:\.\d+)?\b")
# Thousands grouped by a period for the other languages; the separator is any character but
# a newline (the reference's unescaped "."), and only periods are removed from a match.
_PERIOD_GROUPED = re.compile(r"\b\d{1,3}(?:[^\n]\d{3})*(?:,\d+)?\b")
# (num2words currency code, pattern): the symbol before or after digits and separators.
_CURRENCIES = tuple(
    (code, re.compile(f"{re.escape(sym)}[0-9.,]*[0-9]+|[0-9.,]*[0-9]+{re.escape(sym)}"))
    for code, sym in (("GBP", "£"), ("USD", "$"), ("EUR", "€")))
_DECIMAL = re.compile(r"[0-9]+[.,][0-9]+")
_INTEGER = re.compile(r"[0-9]+")
_NOT_AMOUNT = re.compile(r"[^\d.]")
_ORDINAL_CACHE: dict[str, re.Pattern[str]] = {}


def num2words_function() -> Callable[..., str]:
    """num2words' entry point, or a one-line ImportError naming the package to install."""
    try:
        from num2words import num2words  # optional: the xtts extra
    except ImportError:
        raise ImportError("XTTS-v2 text needs num2words: pip install num2words "
                          "(or pip install 'myxtts[xtts]')") from None
    return num2words


def _ordinal_re(lang: str) -> re.Pattern[str]:
    if lang not in _ORDINAL_CACHE:
        alternatives = [r"\.(?=\s|$)" if s == DOT_BEFORE_SPACE else re.escape(s)
                        for s in ORDINAL_SUFFIXES[lang]]
        _ORDINAL_CACHE[lang] = re.compile(f"([0-9]+)(?:{'|'.join(alternatives)})")
    return _ORDINAL_CACHE[lang]


def _currency_words(amount_text: str, code: str, lang: str, n2w: Callable[..., str]) -> str:
    """``amount_text`` ("$20", "20,15€") read as money. A decimal comma counts as a point and
    every other character but digits and points is dropped, so "1.000.000" is no amount
    (float() fails) and stops the currency pass, as in the reference."""
    amount = float(_NOT_AMOUNT.sub("", amount_text.replace(",", ".")))
    words = n2w(amount, to="currency", currency=code, lang=lang)
    if amount.is_integer():
        cut = words.rfind(CURRENCY_SEPARATOR[lang])
        if cut != -1:
            words = words[:cut]
    return words


def _or_kept(read: Callable[[], str], kept: str) -> str:
    """``read()``, or ``kept`` where num2words cannot read this number in this language (the
    reference raises there; keeping the text lets a later pass or the digits stand)."""
    try:
        return read()
    except (NotImplementedError, OverflowError):
        return kept


def expand_numbers(text: str, lang: str) -> str:
    """Lower-cased ``text`` of base language ``lang`` (not zh/ja) with its numbers in words."""
    n2w = num2words_function()
    if lang in ("en", "ru"):
        text = _COMMA_GROUPED.sub(lambda m: m.group(0).replace(",", ""), text)
    else:
        text = _PERIOD_GROUPED.sub(lambda m: m.group(0).replace(".", ""), text)
    for code, pattern in _CURRENCIES:
        try:
            text = pattern.sub(lambda m, c=code: _currency_words(m.group(0), c, lang, n2w), text)
        except Exception:  # whatever num2words or float() raised: the reference stops here
            break
    if lang != "tr":
        text = _DECIMAL.sub(lambda m: _or_kept(
            lambda: n2w(float(m.group(0).replace(",", ".")), lang=lang), m.group(0)), text)
    text = _ordinal_re(lang).sub(lambda m: _or_kept(
        lambda: n2w(int(m.group(1)), ordinal=True, lang=lang), m.group(0)), text)
    return _INTEGER.sub(lambda m: _or_kept(lambda: n2w(int(m.group(0)), lang=lang), m.group(0)),
                        text)
