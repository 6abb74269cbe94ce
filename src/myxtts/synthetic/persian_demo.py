"""The second demo language (``fa``): a made-up language written in Persian letters.

Why a second language: a multilingual model must learn that one voice can speak several
languages and that sounds belong to the language, not to its speakers. Cross-lingual cloning
(an ``en``-only voice speaking ``fa``) is testable only when the languages differ in sounds
and script yet share some sounds, as real pairs do. So ``fa`` shares و ی م ن ل ر س ف ت ک پ
with ``en`` and has its own ا (an open back vowel), ش "sh", خ "kh" and ز "z" (voiced and
noisy at once); ``voices`` merges these tables into the one phone set. Persian letters have
no case, none is rewritten by ``clean_text(.., "fa")``, and the syllables never need a
zero-width non-joiner, so a generated sentence survives text cleaning unchanged.
"""

from __future__ import annotations

FA_ALPHABET = "\u0627\u0648\u06cc\u0645\u0646\u0644\u0631\u0633\u0641\u062a\u06a9\u067e\u0634\u062e\u0632"
# ا و ی م ن ل ر س ف ت ک پ ش خ ز (in this order)
_A, _W, _Y, _M, _N, _L, _R, _S, _F, _T, _K, _P, _SH, _KH, _Z = FA_ALPHABET

FA_VOWELS = _A + _W + _Y
FA_CONSONANTS = _M + _N + _L + _R + _S + _F + _T + _K + _P + _SH + _KH + _Z
FA_CODAS = _N + _M + _S + _L + _SH  # consonants allowed at the end of a word

# Phones only fa has, appended after en's so en's phone ids (and bytes) never change.
FA_PHONES = ("aa", "sh", "kh", "z")
# Voiced phones: formants (Hz, at formant scale 1.0), formant gains (dB), level (dB RMS).
FA_VOICED = {
    "aa": ((700, 1000, 2600), (0, -2, -12), 0.0),
    "z": ((250, 1600, 2600), (0, -18, -20), -12.0),
}
# Noise phones: band centre (Hz), band width (Hz, gaussian sigma), level (dB RMS).
FA_NOISE = {
    "sh": (3750.0, 625.0, -9.0),
    "kh": (1500.0, 250.0, -11.0),
    "z": (5600.0, 900.0, -17.0),
}
# Letter -> [(phone, base duration in ms)].
FA_LETTERS: dict[str, list[tuple[str, float]]] = {
    _A: [("aa", 170)], _W: [("u", 120)], _Y: [("i", 110)],
    _M: [("m", 80)], _N: [("n", 75)], _L: [("l", 70)], _R: [("r", 70)],
    _S: [("s", 100)], _F: [("f", 90)],
    _T: [("sil", 35), ("t", 30)], _K: [("sil", 40), ("k", 35)], _P: [("sil", 40), ("p", 25)],
    _SH: [("sh", 110)], _KH: [("kh", 100)], _Z: [("z", 90)],
}
FA_LETTER_KIND = {
    _A: "vowel", _W: "vowel", _Y: "vowel", _M: "nasal", _N: "nasal", _L: "liquid", _R: "liquid",
    _S: "fricative", _F: "fricative", _T: "stop", _K: "stop", _P: "stop",
    _SH: "fricative", _KH: "fricative", _Z: "fricative",
}
# How each letter is said, for the corpus README (a reader may not read Persian script).
FA_LETTER_NAMES = {
    _A: "aa", _W: "u", _Y: "i", _M: "m", _N: "n", _L: "l", _R: "r", _S: "s", _F: "f",
    _T: "t", _K: "k", _P: "p", _SH: "sh", _KH: "kh", _Z: "z",
}

# Similar length to en's "lamo tesi kunapo. miresu." (4 words, 2 sentences); uses ش خ ز ا.
FA_DEMO_SENTENCE = (f"{_SH}{_A}{_M}{_W} {_KH}{_A}{_R}{_Y} {_S}{_W}{_N}{_A}{_L}{_Y}. "
                    f"{_Z}{_Y}{_SH}{_A}{_F}{_A}.")
