"""XTTS-v2's text cleaning, language by language: what the released model's tokenizer does
to a text before its byte-pair encoding (coqui-tts 0.28's ``preprocess_text``).

Every language but Japanese: double quotes removed, Turkish İ Ö Ü lowered by hand (Python
lowers İ to "i" plus a combining dot), lower-cased, numbers read out (Chinese: in Chinese
numerals, punctuation folded to commas), abbreviations and symbols read out, whitespace
collapsed; then Chinese becomes tone-numbered pinyin and Korean is romanised. Japanese
only becomes lower-cased Hepburn romaji (cutlet): its numbers are cutlet's business.
The word lists are in tables.py; numbers.py and chinese.py read the numbers.

A language beyond the reference's (``OWN_CHAR_LIMITS``: Persian), which a model speaks
once its vocabulary and text rows were grown (grow.py) and it was fine-tuned, is cleaned
by this project's own front end (``text.cleaners.clean_text``: for Persian its letter
forms, digits, ZWNJ and number words), then as the reference treats its languages: double
quotes removed (the model never read one), symbols read as words, whitespace collapsed.
"""

from __future__ import annotations

import re

from myxtts.text.cleaners import clean_text
from myxtts.text.tokenizer import TokenizerError
from myxtts.text.xtts_v2.chinese import normalize_chinese, to_pinyin
from myxtts.text.xtts_v2.numbers import expand_numbers
from myxtts.text.xtts_v2.tables import (
    ABBREVIATION_NEEDS_DOT,
    ABBREVIATIONS,
    CODES,
    LANGUAGES,
    OWN_CHAR_LIMITS,
    OWN_SYMBOL_NAMES,
    SYMBOL_NAMES,
    SYMBOLS,
)

__all__ = ["base_language", "clean_multilingual", "clean_own", "language_tag", "normalize",
           "romanize_korean", "JapaneseRomaji"]

_WHITESPACE = re.compile(r"\s+")
_TURKISH_CAPITALS = str.maketrans({"İ": "i", "Ö": "ö", "Ü": "ü"})
# Case-insensitive like the reference's, which matters after lower-casing only for the
# characters Unicode folds together (a long s "ſ" matches "s").
_ABBREVIATION_RES = {
    lang: tuple((re.compile(rf"\b{re.escape(short)}" + (r"\." if lang in ABBREVIATION_NEEDS_DOT
                                                         else r"\b"), re.IGNORECASE), long)
                for short, long in pairs)
    for lang, pairs in ABBREVIATIONS.items()}


def base_language(language: str) -> str:
    """The base code XTTS-v2's cleaning keys on: the region dropped as the reference drops it
    ("zh-cn" -> "zh", "en-us" -> "en"); one of the released languages or of those myxtts can
    add (``OWN_CHAR_LIMITS``); a TokenizerError listing both otherwise."""
    code = str(language).split("-")[0]
    if code not in CODES and code not in OWN_CHAR_LIMITS:
        raise TokenizerError(f"XTTS-v2 does not speak {language!r}; its languages: "
                             f"{', '.join(LANGUAGES)} (or 'zh' for 'zh-cn'); myxtts can add "
                             f"{', '.join(OWN_CHAR_LIMITS)} to a model (myxtts.text.xtts_v2.grow)")
    return code


def language_tag(lang: str) -> str:
    """The vocabulary's language token for base code ``lang``: "[zh-cn]" for "zh"."""
    return f"[{'zh-cn' if lang == 'zh' else lang}]"


def clean_multilingual(text: str, lang: str) -> str:
    """The reference's ``multilingual_cleaners(text, lang)`` for base code ``lang`` (not ja)."""
    text = text.replace('"', "")
    if lang == "tr":
        text = text.translate(_TURKISH_CAPITALS)
    text = text.lower()
    text = normalize_chinese(text) if lang == "zh" else expand_numbers(text, lang)
    for pattern, reading in _ABBREVIATION_RES[lang]:
        text = pattern.sub(reading, text)
    for symbol, name in zip(SYMBOLS, SYMBOL_NAMES[lang]):
        text = text.replace(symbol, f" {name} ")
    return _WHITESPACE.sub(" ", text).strip()


def clean_own(text: str, lang: str) -> str:
    """A language beyond the reference's (base code ``lang``, in ``OWN_CHAR_LIMITS``) as a
    grown model reads it: the project's ``clean_text`` (lower-cased, numbers in words), then
    the reference's last steps (no double quotes, symbols in words, one space)."""
    text = clean_text(text, lang).replace('"', "")
    for symbol, name in zip(SYMBOLS, OWN_SYMBOL_NAMES.get(lang, ())):
        text = text.replace(symbol, f" {name} ")
    return _WHITESPACE.sub(" ", text).strip()


def romanize_korean(text: str) -> str:
    """Hangul in the academic romanisation of ko-speech-tools (the reference's library)."""
    try:
        from ko_speech_tools import hangul_romanize  # optional: Korean only
    except ImportError:
        raise ImportError("Korean text needs ko-speech-tools: pip install ko-speech-tools "
                          "(or pip install 'myxtts[xtts]')") from None
    return hangul_romanize(text)


class JapaneseRomaji:
    """Japanese as lower-cased Hepburn romaji through cutlet (MeCab with the UniDic-lite
    dictionary); the converter loads its dictionary once, on first use (about a second)."""

    def __init__(self) -> None:
        self._cutlet = None

    def __call__(self, text: str) -> str:
        if self._cutlet is None:
            try:
                import cutlet  # optional: Japanese only
            except ImportError:
                raise ImportError("Japanese text needs cutlet: pip install cutlet "
                                  "'fugashi[unidic-lite]' (or pip install 'myxtts[xtts]')"
                                  ) from None
            self._cutlet = cutlet.Cutlet()
        return self._cutlet.romaji(text).lower()


def normalize(text: str, language: str, romaji: JapaneseRomaji | None = None) -> str:
    """``text`` as XTTS-v2's tokenizer sees it before byte-pair encoding (the reference's
    ``preprocess_text``); ``romaji`` reuses a loaded Japanese converter."""
    lang = base_language(language)
    if lang in OWN_CHAR_LIMITS:
        return clean_own(text, lang)
    if lang == "ja":
        return (romaji or JapaneseRomaji())(text)
    text = clean_multilingual(text, lang)
    if lang == "zh":
        return to_pinyin(text)
    if lang == "ko":
        return romanize_korean(text)
    return text
