"""Pieces shared by the English and Persian number expanders.

Why a shared module: both languages scan the same digit shapes ("1,234.5", ".5",
"-3") and must glue the spelled-out words to their neighbours the same way, so a
number written against a word ("mp3", "کتاب۳") becomes two words, not one.
"""

from __future__ import annotations

import re
from collections.abc import Callable

# A number as written in running text: grouped thousands ("1,234,567") or a plain
# digit run, an optional decimal part, or a bare decimal (".5").
NUMBER_BODY = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+"

# A minus sign only where it cannot be a hyphen or a range dash: at the start of
# the text or after whitespace / an opening bracket ("-5", "(-5)" but not "5-3").
MINUS_RE = re.compile(r"(?<![^\s(])-(?=\.?\d)")


def sub_spaced(pattern: re.Pattern[str], words_for: Callable[[re.Match[str]], str | None],
               text: str) -> str:
    """``pattern.sub`` whose replacement is padded with a space where it touches a letter/digit.

    ``words_for`` returns the replacement words, or None to keep the match unchanged.
    """

    def repl(m: re.Match[str]) -> str:
        words = words_for(m)
        if words is None:
            return m.group(0)
        s = m.string
        if m.start() > 0 and s[m.start() - 1].isalnum():
            words = " " + words
        if m.end() < len(s) and s[m.end()].isalnum():
            words = words + " "
        return words

    return pattern.sub(repl, text)


def split_number(body: str) -> tuple[str, str | None]:
    """``"1,234.50"`` -> ``("1234", "50")``; ``".5"`` -> ``("0", "5")``; ``"7"`` -> ``("7", None)``."""
    body = body.replace(",", "")
    if "." in body:
        int_part, frac = body.split(".", 1)
        return int_part or "0", frac
    return body, None


def thousand_groups(n: int) -> list[tuple[int, int]]:
    """``(scale, group)`` of a non-negative number in groups of three digits, most significant
    first, zero groups left out (but ``0`` itself is ``[(0, 0)]``): ``1_002_030`` ->
    ``[(2, 1), (1, 2), (0, 30)]``. Both languages spell each group and join them their way."""
    if n == 0:
        return [(0, 0)]
    out = []
    scale = 0
    while n:
        n, group = divmod(n, 1000)
        if group:
            out.append((scale, group))
        scale += 1
    return out[::-1]
