"""``clean_text``: one entry point that turns raw transcript text into model text.

Why one function with a fixed order: prepare (training) and synthesize (inference) must
produce byte-identical text for the same input, or the model meets characters at
inference that it never saw in training. The steps are listed on :func:`clean_text`.
"""

from __future__ import annotations

import re
import unicodedata

from myxtts.config import TextConfig
from myxtts.text import english, persian

__all__ = ["clean_text", "generic_clean", "canonical_language", "LANGUAGE_CLEANERS"]

LANGUAGE_CLEANERS = ("en", "fa")  # languages with rules beyond the generic cleanup

_ALIASES = {"eng": "en", "english": "en", "fas": "fa", "per": "fa", "farsi": "fa",
            "persian": "fa"}

_KEEP_FORMAT = {"\u200c", "\u200d", "\u200b"}  # ZWNJ, ZWJ, ZWSP: decided later
_SPACE_LIKE_CONTROLS = {"\t", "\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f", "\x85"}

_PUNCT_MAP = str.maketrans({
    # double quotes and guillemets
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u00ab": '"', "\u00bb": '"',
    "\u2033": '"', "\u2039": '"', "\u203a": '"', "\u301d": '"', "\u301e": '"',
    # single quotes, apostrophes, primes, backtick
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'", "\u00b4": "'",
    "`": "'", "\u02bc": "'", "\u02bb": "'",
    # dashes and minus signs
    "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2212": "-", "\ufe63": "-",
    "\u2014": " - ", "\u2015": " - ", "\ufe58": " - ",
    "\u2026": "...", "\u2044": "/",
    "[": "(", "]": ")", "{": "(", "}": ")",
    # Arabic-script punctuation
    "\u060c": ",", "\u061b": ";", "\u061f": "?", "\u066a": "%", "\u066b": ".", "\u066c": ",",
    "\u06d4": ".",
    # purely typographic marks that are never spoken
    "*": None, "_": None, "~": None, "|": None, "\\": None, "^": None,
    "\u200b": None,  # zero-width space left over after the Persian step
}) | persian.DIGITS_TO_ASCII

_FULLWIDTH_RE = re.compile("[\uff01-\uff5e]")
_REPEAT_PUNCT_RE = re.compile(r"([!?,;:])(?:\s*\1)+")
_DOTS_RE = re.compile(r"\.{4,}")
_WS_RE = re.compile(r"\s+")
_SPACE_BEFORE_PUNCT_RE = re.compile(r"\s+([,.;:!?)])(?!\d)")
_SPACE_AFTER_OPEN_RE = re.compile(r"\(\s+")


def canonical_language(language: str) -> str:
    """``"EN-us"`` -> ``"en"``, ``"farsi"`` -> ``"fa"``; unknown codes pass through lowercased."""
    code = language.strip().lower().replace("_", "-").split("-", 1)[0]
    return _ALIASES.get(code, code)


def _strip_invisibles(text: str) -> str:
    if text.isprintable():  # fast path: no control, format, separator (but " ") characters
        return text
    out = []
    for ch in text:
        cat = unicodedata.category(ch)
        if cat[0] == "C" and ch not in _KEEP_FORMAT:
            if ch in _SPACE_LIKE_CONTROLS:
                out.append(" ")
            # other controls, bidi marks, BOM, soft hyphen, surrogates, private use: dropped
            continue
        if cat == "Zs" or cat in ("Zl", "Zp"):
            out.append(" ")
            continue
        out.append(ch)
    return "".join(out)


def _tidy_spaces(text: str) -> str:
    text = _WS_RE.sub(" ", text)
    text = _SPACE_BEFORE_PUNCT_RE.sub(r"\1", text)
    text = _SPACE_AFTER_OPEN_RE.sub("(", text)
    text = _DOTS_RE.sub("...", text)  # ". . . ." became "...." above
    return text.strip()


def generic_clean(text: str) -> str:
    """Steps 1, 2 and 4 of the module doc (language-independent)."""
    text = unicodedata.normalize("NFC", text)
    return _generic_punct(_strip_invisibles(text))


def _generic_punct(text: str) -> str:
    if _FULLWIDTH_RE.search(text):
        text = _FULLWIDTH_RE.sub(lambda m: unicodedata.normalize("NFKC", m.group(0)), text)
    text = text.translate(_PUNCT_MAP)
    if not text.isascii():
        # Compatibility characters (ligatures such as "ﬁ", superscripts, circled or
        # full-width forms) become the letters they stand for, never vocabulary of their
        # own. After the mapping above, so the marks it folds keep their ASCII forms;
        # Arabic-script letters have no compatibility forms left after step 3.
        folded = unicodedata.normalize("NFKC", text)
        if folded != text:
            text = folded.translate(_PUNCT_MAP)
    text = _REPEAT_PUNCT_RE.sub(r"\1", text)
    return _tidy_spaces(text)


def clean_text(text: str, language: str, cfg: TextConfig | None = None) -> str:
    """Normalise ``text`` written in ``language`` for training and synthesis.

    Deterministic, and idempotent on ordinary text: ``clean_text(clean_text(t)) == clean_text(t)``
    (so inference may clean text that was already cleaned). In order: (1) NFC; (2) invisible
    characters out (controls become spaces; zero-width joiners are kept for the scripts that
    need them); (3) Arabic-script characters get Persian forms, lose diacritics and tatweel
    (``persian.py``; Latin text untouched); (4) generic punctuation, digits and whitespace
    folded to ASCII forms, compatibility characters (ligatures, full-width letters) to
    the letters they stand for (NFKC); (5) ``en`` abbreviations and
    (``cfg.expand_numbers``) numbers, ``fa`` numbers, spelled out in the line's language -- other languages keep digits;
    (6) ``cfg.lowercase``, NFC again, a final whitespace tidy.
    """
    if not isinstance(text, str):
        raise TypeError(f"clean_text expects a str, got {type(text).__name__}")
    cfg = cfg if cfg is not None else TextConfig()
    lang = canonical_language(language)
    text = _strip_invisibles(unicodedata.normalize("NFC", text))
    if lang in LANGUAGE_CLEANERS:
        text = persian.normalize_arabic_script(text)
    text = _generic_punct(text)
    if lang == "en":
        text = english.normalize_english(text, expand_numbers_=cfg.expand_numbers)
    elif lang == "fa":
        text = persian.normalize_persian(text, expand_numbers_=cfg.expand_numbers)
    if cfg.lowercase:
        text = text.lower()
    text = unicodedata.normalize("NFC", text)
    return _tidy_spaces(text)
