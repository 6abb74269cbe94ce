"""XTTS-v2's text front end: ``XttsTokenizer`` (text -> the released vocabulary's ids, equal
to coqui-tts's ``VoiceBpeTokenizer.encode``), ``normalize`` (the per-language cleaning it
applies first) and ``LANGUAGES``."""

from myxtts.text.xtts_v2.normalize import base_language, normalize
from myxtts.text.xtts_v2.tables import CHAR_LIMITS, LANGUAGES
from myxtts.text.xtts_v2.tokenizer import XttsTokenizer

__all__ = ["XttsTokenizer", "normalize", "base_language", "LANGUAGES", "CHAR_LIMITS"]
