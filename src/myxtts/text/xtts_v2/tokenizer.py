"""``XttsTokenizer``: XTTS-v2's text to token ids over the released ``vocab.json`` (a
byte-pair vocabulary of the ``tokenizers`` library), equal to coqui-tts 0.28's
``VoiceBpeTokenizer.encode``; and ``split``, which cuts long text into pieces the model
speaks whole.

An encoded text is the language token, then the cleaned text (normalize.py) with every
space written as the [SPACE] token: "[en]hello[SPACE]world". The ids are the library's own
encoding of that string, so they match the reference for any vocabulary.

A language myxtts adds (Persian, ``tables.OWN_CHAR_LIMITS``) is spoken where the vocabulary
has its token ("[fa]", added by grow.py); elsewhere it is an error naming how to add it.
"""

from __future__ import annotations

from os import PathLike
from pathlib import Path

from myxtts.text.tokenizer import TokenizerError
from myxtts.text.xtts_v2.normalize import JapaneseRomaji, base_language, language_tag, normalize
from myxtts.text.xtts_v2.split import split_text
from myxtts.text.xtts_v2.tables import CHAR_LIMITS, LANGUAGES, OWN_CHAR_LIMITS

__all__ = ["XttsTokenizer", "load_bpe", "START", "STOP", "SPACE"]

START, STOP, SPACE = "[START]", "[STOP]", "[SPACE]"
_FIX = "use the vocab.json of the XTTS-v2 download"


def load_bpe(path: Path, text: str | None = None):
    """The ``tokenizers`` Tokenizer in ``path`` (or in ``text``, the JSON a bundle carries,
    with ``path`` naming where it came from); one-line errors name the file."""
    try:
        from tokenizers import Tokenizer  # optional: the xtts extra
    except ImportError:
        raise ImportError("XTTS-v2 text needs tokenizers: pip install tokenizers "
                          "(or pip install 'myxtts[xtts]')") from None
    if text is None and not path.is_file():
        raise TokenizerError(f"{path}: vocabulary file not found; {_FIX}")
    try:
        return Tokenizer.from_str(text) if text is not None else Tokenizer.from_file(str(path))
    except Exception as e:  # the library raises a bare Exception for any unreadable file
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise TokenizerError(f"{path}: not a tokenizers vocabulary ({reason}); {_FIX}") from None


class XttsTokenizer:
    """XTTS-v2's tokenizer over ``vocab_file``.

    ``encode(text, language)`` gives the ids the released model reads (the language token
    first, no [START]/[STOP]: the model adds those). Languages: ``LANGUAGES`` (a region
    suffix is dropped, so "zh" and "zh-cn" are the same), and those of ``OWN_CHAR_LIMITS``
    whose token the vocabulary has; Chinese needs pypinyin, Japanese cutlet with
    fugashi[unidic-lite], Korean ko-speech-tools, imported on first use.
    """

    def __init__(self, vocab_file: str | PathLike[str], text: str | None = None) -> None:
        """``text``: the vocabulary's JSON itself (as a bundle carries it), ``vocab_file``
        then only names its source in messages."""
        self.path = Path(vocab_file)
        self._bpe = load_bpe(self.path, text)
        self._vocab = self._bpe.get_vocab()
        for token in (START, STOP):
            if token not in self._vocab:
                raise TokenizerError(f"{self.path}: the vocabulary has no {token} token; {_FIX}")
        self._romaji = JapaneseRomaji()
        # the languages myxtts added to this vocabulary (grow.py), in the order of their ids
        self._own = tuple(sorted((lang for lang in OWN_CHAR_LIMITS
                                  if language_tag(lang) in self._vocab),
                                 key=lambda lang: self._vocab[language_tag(lang)]))

    # -- the vocabulary

    @property
    def start_token(self) -> int:
        """Id of [START], which opens the text the GPT reads."""
        return self._vocab[START]

    @property
    def stop_token(self) -> int:
        """Id of [STOP], which closes it."""
        return self._vocab[STOP]

    @property
    def n_tokens(self) -> int:
        """Largest id + 1: the size of the model's text embedding (config's
        ``number_text_tokens``)."""
        return max(self._vocab.values()) + 1

    @property
    def languages(self) -> tuple[str, ...]:
        """The released languages, then those added to this vocabulary."""
        return LANGUAGES + self._own

    @property
    def char_limits(self) -> dict[str, int]:
        """Characters per piece of text, by base language code, beyond which the released
        model tends to truncate its audio (and the estimates for the added languages)."""
        return CHAR_LIMITS | {lang: OWN_CHAR_LIMITS[lang] for lang in self._own}

    def char_limit(self, language: str) -> int:
        return self.char_limits[self._spoken(language)]

    def _spoken(self, language: str) -> str:
        """The base code of ``language``; a TokenizerError where it is a language myxtts can
        add but this vocabulary lacks (no "[fa]" token), naming how to add it. The released
        languages are not checked, as the reference does not check them."""
        lang = base_language(language)
        if lang in OWN_CHAR_LIMITS and lang not in self._own:
            raise TokenizerError(
                f"{self.path} has no {language_tag(lang)} token: this XTTS-v2 model does not "
                f"speak {language!r} (its languages: {', '.join(self.languages)}); add it: "
                f"grow the vocabulary and the model (myxtts.text.xtts_v2.grow.grow_vocab, "
                f"myxtts.model.xtts_v2.grow.grow_text_rows) and fine-tune on {lang} speech")
        return lang

    # -- text to ids

    def normalize(self, text: str, language: str) -> str:
        """``text`` cleaned as the model expects (lower case, numbers and symbols in words,
        Chinese as pinyin, Japanese and Korean romanised)."""
        return normalize(text, self._spoken(language), self._romaji)

    def encode(self, text: str, language: str) -> list[int]:
        """Token ids of ``text`` in ``language``: the language token, then the cleaned text."""
        lang = self._spoken(language)
        cleaned = normalize(text, lang, self._romaji)
        return list(self._bpe.encode(f"{language_tag(lang)}{cleaned}".replace(" ", SPACE)).ids)

    def decode(self, ids) -> str:
        """The cleaned text behind ``ids`` ([SPACE] as a space, [STOP] and [UNK] dropped; the
        language token stays), for logs and tests."""
        text = self._bpe.decode([int(i) for i in ids], skip_special_tokens=False)
        text = text.replace(" ", "").replace(SPACE, " ")
        return text.replace(STOP, "").replace("[UNK]", "")

    # -- long text

    def split(self, text: str, language: str) -> list[str]:
        """``text`` cut into pieces of at most ``char_limit(language)`` characters, at
        sentence ends, then clause marks, then spaces (split.py); nothing is lost."""
        lang = self._spoken(language)
        return split_text(text, lang, self.char_limits[lang])
