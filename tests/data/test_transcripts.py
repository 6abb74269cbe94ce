"""Transcripts fit for training: a row with nothing to say, or with characters outside its
language's scripts, is reported by file and line and rejected, stripped or kept as
``text.unknown_chars`` says; inspect-data lists them before a prepare."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging

import pytest

from myxtts.cli.main import main
from myxtts.config import Config, load_config
from myxtts.data.prepare.readers import read_dataset
from myxtts.data.prepare.records import NOTHING_TO_SAY, OUTSIDE_LANGUAGE
from myxtts.text.scripts import outside_language, speakable
from tests.data.test_readers import _ljspeech

ROWS = ["a1|Hello there.|hello there.|ann|en",
        "a2|!!! ... ?|!!! ... ?|ann|en",                 # line 2: nothing to say
        "a3|Hello привет 🙂 world|hello привет 🙂 world|ann|en",  # line 3: outside 'en'
        "a4|سلام دنیا||bo|fa",                          # Persian in a Persian row: fine
        "a5|Good day to you|good day to you|ann|en"]


def test_scripts_of_a_language():
    assert outside_language("hello, world! 42% café", "en") == []
    assert outside_language("hello привет 🙂", "en") == ["в", "е", "и", "п", "р", "т", "🙂"]
    assert outside_language("می\u200cخواهم", "fa") == []  # the ZWNJ belongs to Persian
    assert outside_language("سلام hello", "fa") == ["e", "h", "l", "o"]
    assert outside_language("anything 🙂 ж", "xx") == []  # a language without declared scripts
    assert speakable("a.") and speakable("42") and not speakable("... !? -")


@pytest.mark.parametrize("policy", ["reject", "drop", "keep"])
def test_rows_are_reported_by_line_and_follow_the_policy(tmp_path, policy, caplog):
    root = _ljspeech(tmp_path / "d", ROWS)
    cfg = load_config(overrides=["data.val_fraction=0", "text.languages=[en, fa]",
                                 f"text.unknown_chars={policy}"])
    with caplog.at_level(logging.WARNING):
        splits = read_dataset(root, cfg)
    kept = {u.id: u.text for u in splits.train}
    empty = splits.report.by_reason(NOTHING_TO_SAY)
    assert [(p.line, p.utterance_id) for p in empty] == [(2, "a2")]
    outside = splits.report.by_reason(OUTSIDE_LANGUAGE)
    if policy == "reject":
        assert sorted(kept) == ["a1", "a4", "a5"]
        assert [(p.line, p.utterance_id) for p in outside] == [(3, "a3")]
        assert "'п' (U+043F CYRILLIC SMALL LETTER PE)" in outside[0].detail
        assert "SLIGHTLY SMILING FACE" in outside[0].detail and "unknown_chars" in outside[0].fix
    else:
        assert sorted(kept) == ["a1", "a3", "a4", "a5"] and outside == []
        assert ("metadata.csv:3" in caplog.text and "CYRILLIC" in caplog.text
                and f"by text.unknown_chars={policy}" in caplog.text)
        assert kept["a3"] == ("hello world" if policy == "drop" else ROWS[2].split("|")[2])


def test_inspect_data_lists_them_before_a_prepare(tmp_path, capsys):
    root = _ljspeech(tmp_path / "d", ROWS)
    main(["inspect-data", str(root), "--set", "text.languages=[en, fa]"])
    out = capsys.readouterr().out
    assert "characters outside the language (1)" in out and "metadata.csv:3 [a3]" in out
    assert "nothing to say (1)" in out and "metadata.csv:2 [a2]" in out


def test_the_default_policy_keeps_the_hash_of_existing_stores():
    cfg = Config()
    legacy = dataclasses.asdict(cfg.text)
    del legacy["unknown_chars"]  # what stores prepared before the key hashed
    blob = json.dumps({"audio": dataclasses.asdict(cfg.audio), "text": legacy}, sort_keys=True)
    assert cfg.feature_hash() == hashlib.sha256(blob.encode()).hexdigest()[:16]
    assert load_config(overrides=["text.unknown_chars=drop"]).feature_hash() != cfg.feature_hash()
