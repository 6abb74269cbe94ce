"""English normalisation: abbreviations, numbers, ordinals, years, times, currency, percent.

Why spell things out: the model reads characters. "1984" is four digit tokens whose
reading ("nineteen eighty-four") depends on conventions the model cannot learn from a
few hours of speech, and "Dr." is a pronunciation the audio never spells. Writing
them as words makes every character something that is actually pronounced. Abbreviations
are expanded whatever ``expand_numbers`` says (St. -> saint before a capitalised word,
street elsewhere). The number conventions are listed on :func:`expand_numbers`.
"""

from __future__ import annotations

import re

from myxtts.text._shared import MINUS_RE, NUMBER_BODY, split_number, sub_spaced, thousand_groups

__all__ = ["normalize_english", "expand_abbreviations", "expand_numbers", "number_to_words",
           "ordinal_to_words", "year_to_words", "digits_to_words", "decimal_to_words"]

_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
         "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
         "eighteen", "nineteen"]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_SCALES = ["", "thousand", "million", "billion", "trillion", "quadrillion", "quintillion"]
MAX_CARDINAL = 1000 ** len(_SCALES) - 1  # beyond this numbers are read digit by digit

_ORDINAL_IRREGULAR = {"one": "first", "two": "second", "three": "third", "five": "fifth",
                      "eight": "eighth", "nine": "ninth", "twelve": "twelfth"}


# ---------------------------------------------------------------- number words

def _below_1000(n: int) -> str:
    hundreds, rest = divmod(n, 100)
    parts = [f"{_ONES[hundreds]} hundred"] if hundreds else []
    if rest >= 20:
        tens, ones = divmod(rest, 10)
        parts.append(_TENS[tens] + (f"-{_ONES[ones]}" if ones else ""))
    elif rest or not parts:
        parts.append(_ONES[rest])
    return " ".join(parts)


def digits_to_words(digits: str) -> str:
    """``"007"`` -> ``"zero zero seven"`` (for codes, leading zeros, huge numbers)."""
    return " ".join(_ONES[int(d)] for d in digits if d.isdigit())


def number_to_words(n: int) -> str:
    """Cardinal words: ``1234`` -> ``"one thousand two hundred thirty-four"``."""
    if n < 0:
        return "minus " + number_to_words(-n)
    if n > MAX_CARDINAL:
        return digits_to_words(str(n))
    return " ".join(_below_1000(group) + (f" {_SCALES[scale]}" if scale else "")
                    for scale, group in thousand_groups(n))


def _ordinal_word(word: str) -> str:
    if word in _ORDINAL_IRREGULAR:
        return _ORDINAL_IRREGULAR[word]
    if word.endswith("y"):
        return word[:-1] + "ieth"
    return word + "th"


def ordinal_to_words(n: int) -> str:
    """``23`` -> ``"twenty-third"``; only the last word changes ("one hundred first")."""
    words = number_to_words(n)
    head, sep, last = max(((words.rpartition(" ")), (words.rpartition("-"))),
                          key=lambda t: len(t[0]))
    return head + sep + _ordinal_word(last)


def year_to_words(n: int) -> str:
    """Year reading for 1010..2099 (cardinal elsewhere): ``1984`` -> ``"nineteen eighty-four"``."""
    if not 1010 <= n <= 2099 or 2000 <= n <= 2009:
        return number_to_words(n)
    century, rest = divmod(n, 100)
    if rest == 0:
        return f"{number_to_words(century)} hundred"
    if rest < 10:
        return f"{number_to_words(century)} oh {_ONES[rest]}"
    return f"{number_to_words(century)} {number_to_words(rest)}"


def decimal_to_words(int_part: str, frac: str) -> str:
    """``("3", "14")`` -> ``"three point one four"`` (fraction digits read one by one)."""
    return f"{_integer_words(int_part)} point {digits_to_words(frac)}"


def _integer_words(digits: str, allow_year: bool = False) -> str:
    if len(digits) > 1 and digits.startswith("0"):
        return digits_to_words(digits)
    n = int(digits)
    if allow_year and len(digits) == 4:
        return year_to_words(n)
    return number_to_words(n)


def _body_words(body: str, allow_year: bool = False) -> str:
    int_part, frac = split_number(body)
    if frac is not None:
        return decimal_to_words(int_part, frac)
    # A comma-grouped number ("1,984") is a quantity, never a year.
    return _integer_words(int_part, allow_year=allow_year and "," not in body)


def _plural(words: str) -> str:
    """Pluralise the last word of a number ("nineteen eighty" -> "nineteen eighties")."""
    if words.endswith("y"):
        return words[:-1] + "ies"
    if words.endswith("x"):  # "six" -> "sixes"
        return words + "es"
    return words + "s"


# ---------------------------------------------------------------- number patterns

_CURRENCIES = {  # symbol: (unit, units, subunit, subunits); subunit None = no minor unit
    "$": ("dollar", "dollars", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "€": ("euro", "euros", "cent", "cents"),
    "¥": ("yen", "yen", None, None),
}
_CURRENCY_RE = re.compile(
    r"(?<![^\s(\"'])(-)?([$£€¥])\s?(" + NUMBER_BODY + r")"
    r"(?:\s?(thousand|million|billion|trillion)\b)?"
)
_PERCENT_RE = re.compile(r"(?<![\d.,])(" + NUMBER_BODY + r")\s?%")
_TIME_RE = re.compile(
    r"(?<![\d.:,])([01]?\d|2[0-3]):([0-5]\d)(?![\d:])(?:\s?([AaPp])\.?[Mm]\b(\.)?)?"
)
_HOUR_AMPM_RE = re.compile(r"(?<![\d.:,])(1[0-2]|0?[1-9])\s?([AaPp])\.?[Mm]\b(\.)?")
_ORDINAL_RE = re.compile(r"(?<![\d.,])(\d{1,3}(?:,\d{3})+|\d+)(st|nd|rd|th)\b", re.IGNORECASE)
_DECADE_RE = re.compile(r"(?<![\d.,])(?:(\d{3}0)|'?(\d0))'?s\b")
_NUMBER_RE = re.compile(r"(?<![\d,])(" + NUMBER_BODY + r")(?!\d)")
_DOTTED_RE = re.compile(r"(?<![\d.,])\d+(?:\.\d+){2,}(?![\d.]\d)")  # versions "1.2.3"
_DEGREES_RE = re.compile(r"(?<=\d)\s?°\s?([CF]\b)?")
_DEGREE_UNITS = {"C": " degrees celsius", "F": " degrees fahrenheit", None: " degrees"}


def _keeps_period(text: str, end: int) -> bool:
    """Does a period consumed at ``end`` also end the sentence (text end or a capital next)?"""
    rest = text[end:]
    return not rest.strip() or re.match(r"\s+[A-Z\"']", rest) is not None


def _currency_words(m: re.Match[str]) -> str:
    minus, symbol, body, scale = m.group(1), m.group(2), m.group(3), m.group(4)
    unit, units, sub, subs = _CURRENCIES[symbol]
    sign = "minus " if minus else ""
    if scale:
        return f"{sign}{_body_words(body)} {scale} {units}"
    int_part, frac = split_number(body)
    if frac is None or sub is None or len(frac) > 2:
        amount = _body_words(body)
        return f"{sign}{amount} {unit if amount == 'one' else units}"
    whole, cents = int(int_part), int(frac.ljust(2, "0"))
    parts = []
    if whole or not cents:
        parts.append(f"{number_to_words(whole)} {unit if whole == 1 else units}")
    if cents:
        parts.append(f"{number_to_words(cents)} {sub if cents == 1 else subs}")
    return sign + ", ".join(parts)


def _time_words(m: re.Match[str]) -> str:
    hours, minutes = int(m.group(1)), int(m.group(2))
    if minutes == 0:
        words = f"{number_to_words(hours)} o'clock" if not m.group(3) else number_to_words(hours)
    elif minutes < 10:
        words = f"{number_to_words(hours)} oh {_ONES[minutes]}"
    else:
        words = f"{number_to_words(hours)} {number_to_words(minutes)}"
    if m.group(3):
        words += f" {m.group(3).lower()} m"
        if m.group(4) and _keeps_period(m.string, m.end()):
            words += "."
    return words


def _hour_ampm_words(m: re.Match[str]) -> str:
    words = f"{number_to_words(int(m.group(1)))} {m.group(2).lower()} m"
    if m.group(3) and _keeps_period(m.string, m.end()):
        words += "."
    return words


def _ordinal_words(m: re.Match[str]) -> str:
    digits = m.group(1).replace(",", "")
    if len(digits) > 1 and digits.startswith("0"):
        return m.group(0)  # "05th" is not an ordinal anyone writes; leave it to the digit pass
    return ordinal_to_words(int(digits))


def _decade_words(m: re.Match[str]) -> str:
    if m.group(1):
        return _plural(year_to_words(int(m.group(1))))
    return _plural(number_to_words(int(m.group(2))))


def expand_numbers(text: str) -> str:
    """Spell out currency, percentages, times, ordinals, decades, then every other number.

    American conventions, no "and" inside numbers: a leading zero or a number past the
    scale words (>= 10**21) is read digit by digit; a plain 1010..2099 outside 2000..2009
    is a year ("1,984" gives the cardinal); $3.50 -> "three dollars, fifty cents"; 7:05 pm
    -> "seven oh five p m"; 3:00 -> "three o'clock"; "1.2.3" -> "one point two point three".
    """
    text = sub_spaced(_CURRENCY_RE, _currency_words, text)
    text = sub_spaced(_PERCENT_RE, lambda m: f"{_body_words(m.group(1))} percent", text)
    text = sub_spaced(_TIME_RE, _time_words, text)
    text = sub_spaced(_HOUR_AMPM_RE, _hour_ampm_words, text)
    text = sub_spaced(_ORDINAL_RE, _ordinal_words, text)
    text = sub_spaced(_DECADE_RE, _decade_words, text)
    text = _DEGREES_RE.sub(lambda m: _DEGREE_UNITS[m.group(1)], text)
    text = sub_spaced(_DOTTED_RE, lambda m: " point ".join(
        _integer_words(part) for part in m.group(0).split(".")), text)
    text = MINUS_RE.sub("minus ", text)
    text = sub_spaced(_NUMBER_RE, lambda m: _body_words(m.group(1), allow_year=True), text)
    return text


# ---------------------------------------------------------------- abbreviations

# Titles precede a name, so their period never ends a sentence and is dropped.
_TITLES = {
    "mr": "mister", "mrs": "missus", "ms": "miz", "dr": "doctor", "prof": "professor",
    "gen": "general", "gov": "governor", "capt": "captain", "col": "colonel",
    "lt": "lieutenant", "sgt": "sergeant", "rev": "reverend", "hon": "honorable",
    "mt": "mount", "maj": "major", "messrs": "messieurs", "pres": "president",
    "sen": "senator",
}
# These may close a sentence: at the end of the text (or before a capital) the period stays.
_TERMINAL = {
    "jr": "junior", "sr": "senior", "etc": "et cetera", "inc": "incorporated",
    "ltd": "limited", "co": "company", "corp": "corporation", "vs": "versus",
    "approx": "approximately", "dept": "department", "ave": "avenue", "blvd": "boulevard",
    "jan": "january", "feb": "february", "mar": "march", "apr": "april", "jun": "june",
    "jul": "july", "aug": "august", "sep": "september", "sept": "september",
    "oct": "october", "nov": "november", "dec": "december",
}
# Matched in any case; the rest only when capitalised ("Mar." but not "mar." the verb).
_ANY_CASE = {"mr", "mrs", "ms", "dr", "etc", "vs", "approx", "jr", "sr", "inc", "ltd"}
_ABBREV_RE = re.compile(
    r"(?<![\w.'])(" + "|".join(sorted({*_TITLES, *_TERMINAL}, key=len, reverse=True)) + r")\.",
    re.IGNORECASE,
)
_ST_RE = re.compile(r"(?<![\w.'])(St|st|ST)\.")
_LATIN_RE = re.compile(r"(?<![\w.])(e\.g|i\.e)\.", re.IGNORECASE)
_NUMBER_SIGN_RE = re.compile(r"(?<![\w.])(?:(?:No|NO)\.\s?|#\s?)(?=\d)")
_VS_RE = re.compile(r"(?<![\w.])vs(?![\w.])", re.IGNORECASE)


def _match_case(word: str, like: str) -> str:
    return word[:1].upper() + word[1:] if like[:1].isupper() else word


def _abbrev_words(m: re.Match[str]) -> str | None:
    abbr = m.group(1)
    key = abbr.lower()
    if key not in _ANY_CASE and not abbr[:1].isupper():
        return None
    if key in _TITLES:
        return _match_case(_TITLES[key], abbr)
    words = _match_case(_TERMINAL[key], abbr)
    return words + "." if _keeps_period(m.string, m.end()) else words


def _st_words(m: re.Match[str]) -> str:
    # "St. Louis" / "to St. Paul's" -> saint; "Main St." / "5th st." / "Main St. Then" -> street.
    if re.match(r"\s+[A-Z]", m.string[m.end():]) and not _after_street_name(m):
        return _match_case("saint", m.group(1))
    words = _match_case("street", m.group(1))
    return words + "." if _keeps_period(m.string, m.end()) else words


def _after_street_name(m: re.Match[str]) -> bool:
    """Is "St." preceded by a capitalised word that is not itself sentence-initial?"""
    before = m.string[: m.start()].rstrip()
    head, _, prev = before.rpartition(" ")
    if not (prev[:1].isalpha() and prev[:1].isupper()):
        return False
    head = head.rstrip()
    return bool(head) and not head.endswith((".", "!", "?", ":", '"'))


def expand_abbreviations(text: str) -> str:
    """Expand common abbreviations (titles, Latin, months, company suffixes, No./#)."""
    text = _NUMBER_SIGN_RE.sub("number ", text)
    text = sub_spaced(_LATIN_RE, lambda m: "for example" if m.group(1).lower() == "e.g"
                      else "that is", text)
    text = sub_spaced(_ST_RE, _st_words, text)
    text = sub_spaced(_ABBREV_RE, _abbrev_words, text)
    text = _VS_RE.sub("versus", text)
    return text


def normalize_english(text: str, expand_numbers_: bool = True) -> str:
    """English-specific cleaning of already generically cleaned text (see module doc)."""
    text = expand_abbreviations(text)
    text = re.sub(r"\s*&\s*", " and ", text)
    if expand_numbers_:
        text = expand_numbers(text)
        # Spelling out "3etc." leaves "three etc." - an abbreviation only now separated.
        text = expand_abbreviations(text)
    return text
