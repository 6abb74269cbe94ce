"""XTTS-v2's text front end: ``XttsTokenizer`` (text -> the released vocabulary's ids, equal
to coqui-tts's ``VoiceBpeTokenizer.encode``), ``normalize`` (the per-language cleaning it
applies first) and ``LANGUAGES``; ``grow`` adds a language to a vocabulary (Persian)."""

from myxtts.text.xtts_v2.normalize import base_language, language_tag, normalize
from myxtts.text.xtts_v2.tables import CHAR_LIMITS, LANGUAGES, OWN_CHAR_LIMITS
from myxtts.text.xtts_v2.tokenizer import XttsTokenizer

__all__ = ["XttsTokenizer", "normalize", "base_language", "language_tag", "LANGUAGES",
           "CHAR_LIMITS", "OWN_CHAR_LIMITS"]
