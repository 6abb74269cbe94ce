"""Behaviour of the character Tokenizer: id layout, round trip, persistence, unknown chars."""

from __future__ import annotations

import json
import logging

import pytest

from myxtts.config import TextConfig
from myxtts.text import BOS, EOS, PAD, UNK, Tokenizer, TokenizerError, clean_text

CFG = TextConfig(languages=["en", "fa"])
RAW = [("en", "Mr. Smith paid $3.50 in 1984."), ("en", "Hello, world!"),
       ("fa", "من ۱۲۳ کتاب دارم، می\u200cروم.")]
TEXTS = [(lang, clean_text(t, lang, CFG)) for lang, t in RAW]


@pytest.fixture
def tok() -> Tokenizer:
    return Tokenizer.build([t for _, t in TEXTS], ["en", "fa"])


def test_special_ids_and_layout(tok):
    assert (PAD, BOS, EOS, UNK) == (0, 1, 2, 3)
    assert tok.tokens[:6] == ["<pad>", "<bos>", "<eos>", "<unk>", "<en>", "<fa>"]
    assert tok.language_token_id("en") == 4 and tok.language_token_id("fa") == 5
    assert tok.language_id("en") == 0 and tok.language_id("fa") == 1
    chars = tok.chars
    assert chars == sorted(chars) and len(set(chars)) == len(chars)
    assert tok.vocab_size == 6 + len(chars) == len(tok.tokens)


def test_encode_layout_and_round_trip(tok):
    for lang, text in TEXTS:
        ids = tok.encode(text, lang)
        assert ids[0] == BOS and ids[1] == tok.language_token_id(lang) and ids[-1] == EOS
        assert len(ids) == len(text) + 3
        assert all(6 <= i < tok.vocab_size for i in ids[2:-1])
        assert tok.decode(ids) == text
    assert tok.unknown_chars == {}


def test_decode_skips_padding_and_rejects_bad_ids(tok):
    ids = tok.encode("hello", "en") + [PAD, PAD]
    assert tok.decode(ids) == "hello"
    with pytest.raises(TokenizerError, match="out of range"):
        tok.decode([tok.vocab_size])


def test_language_tokens_distinct(tok):
    text = "hello"
    en_ids, fa_ids = tok.encode(text, "en"), tok.encode(text, "fa")
    assert en_ids[1] != fa_ids[1]
    assert en_ids[2:] == fa_ids[2:]
    with pytest.raises(TokenizerError, match="'de' is not known"):
        tok.encode(text, "de")


def test_deterministic_regardless_of_order():
    texts = [t for _, t in TEXTS]
    a = Tokenizer.build(texts, ["en", "fa"])
    b = Tokenizer.build(list(reversed(texts)), ["en", "fa"])
    assert a == b and a.tokens == b.tokens
    assert a.encode(texts[0], "en") == b.encode(texts[0], "en")


def test_save_load_equality(tok, tmp_path):
    path = tmp_path / "sub" / "tokenizer.json"
    tok.save(path)
    loaded = Tokenizer.load(path)
    assert loaded == tok
    assert loaded.tokens == tok.tokens and loaded.languages == ["en", "fa"]
    for lang, text in TEXTS:
        assert loaded.encode(text, lang) == tok.encode(text, lang)
    assert Tokenizer.from_dict(tok.to_dict()) == tok
    assert not list(path.parent.glob("*.tmp"))  # atomic write left no temp file


def test_unknown_char_maps_to_unk_and_is_reported_once(tok, caplog):
    assert "@" not in tok.chars and "\u00e9" not in tok.chars
    with caplog.at_level(logging.WARNING, logger="myxtts.text.tokenizer"):
        ids = tok.encode("a@e@", "en")
        ids2 = tok.encode("@\u00e9", "en")
    assert ids[2:-1] == [tok.encode("a", "en")[2], UNK, tok.encode("e", "en")[2], UNK]
    assert ids2[2:-1] == [UNK, UNK]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "'@'" in warnings[0] and "U+0040" in warnings[0]
    assert "U+00E9" in warnings[1]
    assert tok.unknown_chars == {"@": 3, "\u00e9": 1}
    assert tok.decode(ids) == "a\ufffde\ufffd"


@pytest.mark.parametrize("content, match", [
    ("{not json", r"bad\.json:1: not valid JSON"),
    ("[1, 2]", "bad.json: not a myxtts tokenizer file: expected a JSON object"),
    (json.dumps({"format": "other"}), "bad.json: not a myxtts tokenizer file: 'format'"),
    (json.dumps({"format": "myxtts-tokenizer", "version": 1, "languages": ["en"],
                 "tokens": ["<pad>", "<bos>", "<eos>", "<unk>", "<fa>", "a"]}), "first 5 tokens"),
    (json.dumps({"format": "myxtts-tokenizer", "version": 1, "languages": ["en"],
                 "tokens": ["<pad>", "<bos>", "<eos>", "<unk>", "<en>", "ab"]}), "single characters"),
    (json.dumps({"format": "myxtts-tokenizer", "version": 1, "languages": ["en"],
                 "tokens": ["<pad>", "<bos>", "<eos>", "<unk>", "<en>", "a", "a"]}), "duplicate"),
])
def test_load_malformed_raises_one_line_value_error(tmp_path, content, match):
    path = tmp_path / "bad.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=match) as info:
        Tokenizer.load(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_load_missing_file(tmp_path):
    path = tmp_path / "missing.json"
    with pytest.raises(ValueError, match="missing.json: tokenizer file not found") as info:
        Tokenizer.load(path)
    assert "\n" not in str(info.value)


def test_invalid_definitions():
    with pytest.raises(TokenizerError, match="at least one language"):
        Tokenizer([], ["a"])
    with pytest.raises(TokenizerError, match="unique"):
        Tokenizer(["en", "en"], ["a"])
    with pytest.raises(TokenizerError, match="expects strings"):
        Tokenizer.build([b"x"], ["en"])  # type: ignore[list-item]


def test_extra_chars_and_tensor_ids(tok):
    t = Tokenizer.build(["ab"], ["en"], extra_chars="z")
    assert t.chars == ["a", "b", "z"]
    torch = pytest.importorskip("torch")
    ids = torch.tensor(t.encode("zab", "en"))
    assert t.decode(ids) == "zab"


def test_extended_keeps_old_ids_and_appends_new_symbols():
    old = Tokenizer(["en"], [" ", "a", "b"])
    assert old.extended(Tokenizer(["en"], ["a"])) is old  # nothing new: the same tokenizer
    letters = old.extended(Tokenizer(["en"], ["z", "a", "c"]))
    assert letters.tokens == [*old.tokens, "c", "z"]  # old ids kept, new letters sorted after
    both = old.extended(Tokenizer(["fa", "en"], ["ش", " "]))
    assert both.languages == ["en", "fa"] and both.chars == [" ", "a", "b", "ش"]
    assert Tokenizer.from_dict(both.to_dict()) == both  # the store's format holds it
    fa = Tokenizer(["fa"], [" ", "ش"])
    assert [both.tokens[i] for i in both.id_map(fa)] == fa.tokens
    with pytest.raises(TokenizerError, match="lacks"):
        old.id_map(fa)
