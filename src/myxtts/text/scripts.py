"""Which characters a language's transcripts may hold: its scripts.

Why: a character tokenizer turns every distinct character into a token, so Persian, Cyrillic
or emoji in rows labelled English would become vocabulary the model sees a few times and
cannot learn, and a row of punctuation alone would teach it to say something for nothing.
Each language declares the scripts of its letters (Unicode names start with the script:
"ARABIC LETTER PEH"); after cleaning, a letter, mark or symbol outside them is "outside the
language". Whitespace, digits, punctuation, the zero-width (non-)joiners and a few symbols
the cleaners keep or read out are allowed everywhere. A language not in
:data:`LANGUAGE_SCRIPTS` is not checked.
"""

from __future__ import annotations

import unicodedata

LATIN, ARABIC, CYRILLIC = frozenset({"LATIN"}), frozenset({"ARABIC"}), frozenset({"CYRILLIC"})
LANGUAGE_SCRIPTS: dict[str, frozenset[str]] = {
    **{code: LATIN for code in ("en", "fr", "de", "es", "it", "pt", "nl", "pl", "tr", "cs", "sv",
                                "da", "no", "fi", "hu", "ro", "id", "vi", "ca", "sk", "hr")},
    **{code: ARABIC for code in ("fa", "ar", "ur")},
    **{code: CYRILLIC for code in ("ru", "uk", "bg", "be")},
    "el": frozenset({"GREEK"}), "he": frozenset({"HEBREW"}), "hi": frozenset({"DEVANAGARI"}),
    "zh": frozenset({"CJK"}), "ja": frozenset({"CJK", "HIRAGANA", "KATAKANA"}),
    "ko": frozenset({"HANGUL"}),
}
ALLOWED_SYMBOLS = frozenset("%$€£&+=/@#°")
_JOINERS = frozenset("\u200c\u200d")


def script_of(ch: str) -> str:
    """The script a character's Unicode name starts with (``"LATIN"``, ``"ARABIC"``, ...);
    ``"?"`` for an unnamed character."""
    return unicodedata.name(ch, "?").split(" ", 1)[0]


def outside_language(text: str, language: str) -> list[str]:
    """Distinct characters of (cleaned) ``text`` that do not belong to ``language``, sorted;
    empty for a language without declared scripts."""
    scripts = LANGUAGE_SCRIPTS.get(language)
    if scripts is None:
        return []
    bad = set()
    for ch in set(text):
        if ch.isspace() or ch in _JOINERS or ch in ALLOWED_SYMBOLS or ch.isdigit():
            continue
        category = unicodedata.category(ch)
        if category[0] == "P":
            continue
        if category[0] in "LMS" or category[0] == "C":
            if category[0] in "LM" and script_of(ch) in scripts:
                continue
            bad.add(ch)
    return sorted(bad)


def languages_by_script(text: str, languages: list[str]) -> list[str]:
    """Those of ``languages`` (in their order) whose scripts hold every letter of ``text``;
    empty when ``text`` has no letter. A language without declared scripts never fits:
    nothing says which letters are its own."""
    scripts = {script_of(ch) for ch in set(text) if unicodedata.category(ch)[0] == "L"}
    if not scripts:
        return []
    return [lang for lang in languages if scripts <= LANGUAGE_SCRIPTS.get(lang, frozenset())]


def speakable(text: str) -> bool:
    """Whether (cleaned) ``text`` holds anything to say: a letter or a digit."""
    return any(ch.isalnum() for ch in text)


def drop_outside(text: str, characters: list[str]) -> str:
    """``text`` without ``characters`` (spaces tidied)."""
    drop = set(characters)
    return " ".join("".join(ch for ch in text if ch not in drop).split())


def describe(characters: list[str], limit: int = 12) -> str:
    """``'ж' (U+0436 CYRILLIC SMALL LETTER ZHE), ...`` for reports."""
    shown = [f"{ch!r} (U+{ord(ch):04X} {unicodedata.name(ch, '?')})" for ch in characters[:limit]]
    more = f" and {len(characters) - limit} more" if len(characters) > limit else ""
    return ", ".join(shown) + more
