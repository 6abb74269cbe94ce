"""Character tokenizer with reserved special ids and one token per language.

Id layout (binding for the data pipeline and the model):
``PAD=0, BOS=1, EOS=2, UNK=3``, then ``<lang>`` for each language in ``languages``
order, then the characters sorted by code point. Sorting (not first-seen order) is
what makes the same data give the same ids whatever order it was read in, so a
re-prepare never silently reshuffles the embedding table of a trained model.

``encode(text, lang) = [BOS, <lang>, chars..., EOS]``. A character outside the
vocabulary becomes UNK: inference text may contain anything, and crashing mid-batch
helps nobody. Each distinct unknown character is logged once (with its code point, so
an invisible one can be identified) and counted in ``unknown_chars``.
"""

from __future__ import annotations

import json
import logging
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from myxtts.system import atomic_write

__all__ = ["Tokenizer", "TokenizerError", "PAD", "BOS", "EOS", "UNK", "SPECIAL_TOKENS"]

log = logging.getLogger(__name__)

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
FORMAT = "myxtts-tokenizer"
VERSION = 1
UNK_CHAR = "\ufffd"  # what decode() writes for UNK


class TokenizerError(ValueError):
    """A tokenizer file or definition is unusable (message names the file and the fix)."""


def _language_token(lang: str) -> str:
    return f"<{lang}>"


class Tokenizer:
    """Maps cleaned text to ids and back. Build with ``Tokenizer.build``, persist with ``save``."""

    def __init__(self, languages: Sequence[str], chars: Iterable[str]) -> None:
        languages = list(languages)
        chars = list(chars)
        if not languages:
            raise TokenizerError("a tokenizer needs at least one language, e.g. ['en']")
        for lang in languages:
            if not isinstance(lang, str) or not lang or any(c in lang for c in "<> \t\n"):
                raise TokenizerError(f"invalid language code {lang!r}: use a short code like 'en'")
        if len(set(languages)) != len(languages):
            raise TokenizerError(f"languages must be unique, got {languages}")
        for ch in chars:
            if not isinstance(ch, str) or len(ch) != 1 or "\ud800" <= ch <= "\udfff":
                raise TokenizerError(f"vocabulary entries must be single characters, got {ch!r}")
        if len(set(chars)) != len(chars):
            dupes = sorted(c for c, n in Counter(chars).items() if n > 1)
            raise TokenizerError(f"duplicate characters in the vocabulary: {dupes}")
        self._languages: tuple[str, ...] = tuple(languages)
        self._chars: tuple[str, ...] = tuple(chars)
        self._lang_token_id = {lang: len(SPECIAL_TOKENS) + i for i, lang in enumerate(languages)}
        first_char_id = len(SPECIAL_TOKENS) + len(languages)
        self._char_to_id = {ch: first_char_id + i for i, ch in enumerate(chars)}
        self._first_char_id = first_char_id
        self.unknown_chars: Counter[str] = Counter()

    # ------------------------------------------------------------ construction

    @classmethod
    def build(cls, cleaned_texts: Iterable[str], languages: Sequence[str],
              extra_chars: str = "") -> Tokenizer:
        """Vocabulary = every character in ``cleaned_texts`` (+ ``extra_chars``), sorted."""
        seen: set[str] = set(extra_chars)
        for text in cleaned_texts:
            if not isinstance(text, str):
                raise TokenizerError(f"Tokenizer.build expects strings, got {type(text).__name__}")
            seen.update(text)
        return cls(languages, sorted(seen))

    # ------------------------------------------------------------ properties

    @property
    def languages(self) -> list[str]:
        return list(self._languages)

    @property
    def chars(self) -> list[str]:
        return list(self._chars)

    @property
    def vocab_size(self) -> int:
        return self._first_char_id + len(self._chars)

    def __len__(self) -> int:
        return self.vocab_size

    @property
    def tokens(self) -> list[str]:
        """Token string of every id, in id order (specials, language tokens, characters)."""
        return [*SPECIAL_TOKENS, *map(_language_token, self._languages), *self._chars]

    def language_id(self, lang: str) -> int:
        """0-based index of ``lang`` in ``languages`` (for a language embedding)."""
        return self.language_token_id(lang) - len(SPECIAL_TOKENS)

    def language_token_id(self, lang: str) -> int:
        """Token id of ``<lang>``."""
        try:
            return self._lang_token_id[lang]
        except KeyError:
            raise TokenizerError(
                f"language {lang!r} is not known to this tokenizer (it knows "
                f"{', '.join(self._languages)}); add it to text.languages and re-prepare"
            ) from None

    # ------------------------------------------------------------ growing (fine-tuning)

    def extended(self, other: Tokenizer) -> Tokenizer:
        """This vocabulary grown to cover ``other``'s: its languages, then ``other``'s new
        ones; its characters in their order, then ``other``'s new ones sorted. Specials and
        this tokenizer's language tokens keep their ids; its characters keep theirs unless a
        language is added (the layout puts language tokens before characters: each new
        language moves them up by one id, in order). ``self`` if nothing is new."""
        languages = [*self._languages, *(x for x in other._languages if x not in self._lang_token_id)]
        chars = [*self._chars, *sorted(c for c in other._chars if c not in self._char_to_id)]
        if len(languages) == len(self._languages) and len(chars) == len(self._chars):
            return self
        return Tokenizer(languages, chars)

    def id_map(self, other: Tokenizer) -> list[int]:
        """For each token id of ``other``, the id of the same token here (``other``'s
        vocabulary must be covered: see :meth:`extended`)."""
        ids = {tok: i for i, tok in enumerate(self.tokens)}
        missing = [tok for tok in other.tokens if tok not in ids]
        if missing:
            raise TokenizerError(f"this vocabulary lacks {missing} of the other; extend it first")
        return [ids[tok] for tok in other.tokens]

    # ------------------------------------------------------------ encode / decode

    def knows(self, ch: str) -> bool:
        """Whether the character has its own token (else it encodes as UNK)."""
        return ch in self._char_to_id

    def encode(self, cleaned_text: str, language: str, report: bool = True) -> list[int]:
        """``[BOS, <language>, char ids..., EOS]``; unknown characters become UNK (each
        logged once per tokenizer unless ``report`` is off: the caller reported them)."""
        lang_id = self.language_token_id(language)
        lookup = self._char_to_id
        ids = [lookup.get(ch, UNK) for ch in cleaned_text]
        if UNK in ids and report:
            self._report_unknown(cleaned_text)
        return [BOS, lang_id, *ids, EOS]

    def _report_unknown(self, text: str) -> None:
        for ch in text:
            if ch not in self._char_to_id:
                if ch not in self.unknown_chars:
                    log.warning("tokenizer: character %r (U+%04X %s) is not in the vocabulary; "
                                "encoded as <unk>", ch, ord(ch), _char_name(ch))
                self.unknown_chars[ch] += 1

    def decode(self, ids: Iterable[int]) -> str:
        """Characters of ``ids``; PAD/BOS/EOS/language tokens are skipped, UNK reads as U+FFFD."""
        out = []
        first = self._first_char_id
        for i in ids:
            i = int(i)
            if i >= first:
                if i >= self.vocab_size:
                    raise TokenizerError(f"token id {i} is out of range (vocab_size {self.vocab_size})")
                out.append(self._chars[i - first])
            elif i == UNK:
                out.append(UNK_CHAR)
            elif i < 0:
                raise TokenizerError(f"token id {i} is negative")
        return "".join(out)

    # ------------------------------------------------------------ persistence

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "languages": list(self._languages),
                "tokens": self.tokens}

    @classmethod
    def from_dict(cls, d: Any) -> Tokenizer:
        """Inverse of ``to_dict``; checks that the stored ids match the fixed layout."""
        if not isinstance(d, dict):
            raise TokenizerError(f"expected a JSON object, got {type(d).__name__}")
        if d.get("format") != FORMAT:
            raise TokenizerError(f"'format' is {d.get('format')!r}, expected {FORMAT!r}")
        if d.get("version") != VERSION:
            raise TokenizerError(f"unsupported version {d.get('version')!r} (this code reads {VERSION})")
        languages, tokens = d.get("languages"), d.get("tokens")
        if not isinstance(languages, list) or not isinstance(tokens, list):
            raise TokenizerError("'languages' and 'tokens' must be lists")
        n_head = len(SPECIAL_TOKENS) + len(languages)
        expected_head = [*SPECIAL_TOKENS, *(_language_token(str(x)) for x in languages)]
        if tokens[:n_head] != expected_head:
            raise TokenizerError(f"the first {n_head} tokens must be {expected_head}, "
                                 f"got {tokens[:n_head]}")
        return cls(languages, tokens[n_head:])

    def to_json(self) -> str:
        """The vocabulary file's text (what ``save`` writes and ``load`` reads)."""
        return json.dumps(self.to_dict(), ensure_ascii=False, indent=1) + "\n"

    def save(self, path: str | Path) -> None:
        """Write the vocabulary as JSON, atomically (a killed run leaves the old file)."""
        atomic_write(Path(path), self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Read a file written by ``save``; any problem is a one-line TokenizerError naming it."""
        p = Path(path)
        fix = "rebuild it by re-running prepare"
        try:
            raw = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise TokenizerError(f"{p}: tokenizer file not found; {fix}") from None
        except (OSError, UnicodeDecodeError) as e:
            raise TokenizerError(f"{p}: cannot read tokenizer file ({e}); {fix}") from None
        try:
            d = json.loads(raw)
        except json.JSONDecodeError as e:
            raise TokenizerError(f"{p}:{e.lineno}: not valid JSON ({e.msg}); {fix}") from None
        try:
            return cls.from_dict(d)
        except TokenizerError as e:
            raise TokenizerError(f"{p}: not a myxtts tokenizer file: {e}; {fix}") from None

    # ------------------------------------------------------------ misc

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tokenizer):
            return NotImplemented
        return self._languages == other._languages and self._chars == other._chars

    __hash__ = None  # type: ignore[assignment]  # mutable (unknown_chars), compared by value

    def __repr__(self) -> str:
        return (f"Tokenizer(languages={list(self._languages)}, n_chars={len(self._chars)}, "
                f"vocab_size={self.vocab_size})")


def _char_name(ch: str) -> str:
    return unicodedata.name(ch, "unnamed")
