"""The languages a downloaded corpus declares (a Common Voice release's ``locale``) are
taken from it unless the config sets ``text.languages``; the store records them and
``train`` takes them from it; ``doctor`` says what ``prepare`` would drop for language."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from myxtts.cli.main import build_parser, main
from tests.test_bad_inputs import _wav

HEADER = ["client_id", "path", "sentence", "up_votes", "down_votes", "locale"]
FA = ["سلام دوست من", "روز خوبی است", "این کتاب خوب است", "ما به خانه رفتیم",
      "هوا سرد است", "او نامه را نوشت"]
EN = ["hello there my friend", "the cat sat on the mat"]


def _release(root: Path, rows: list[tuple[str, str]]) -> Path:
    """A Common Voice release of WAV clips: ``rows`` of (sentence, locale) in train.tsv."""
    lines = []
    for i, (sentence, locale) in enumerate(rows):
        _wav(root / "clips" / f"c{i}.wav", seconds=0.5 + 0.05 * (i % 3))
        lines.append([f"spk{i % 3}", f"c{i}.wav", sentence, "2", "0", locale])
    (root / "train.tsv").write_text("\n".join("\t".join(r) for r in [HEADER, *lines]) + "\n",
                                    encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    """Persian and English rows, Persian written ``fa-IR`` in some of them."""
    rows = [(s, "fa" if i % 2 else "fa-IR") for i, s in enumerate(FA * 2)] + [(s, "en") for s in EN]
    return _release(tmp_path_factory.mktemp("cv") / "fa", rows)


PREPARE = ["--workers", "1", "--quiet", "--set", "data.val_fraction=0"]


def test_prepare_trains_every_language_the_release_declares(release, tmp_path, capsys):
    store = tmp_path / "store"
    assert main(["prepare", str(release), "--out", str(store), *PREPARE]) == 0
    captured = capsys.readouterr()
    assert "kept 14 of 14 utterances" in captured.out, captured.out
    assert "text.languages [en, fa] (default en): the languages of the Common Voice release" \
        in captured.err
    manifest = json.loads((store / "manifest.json").read_text())
    assert manifest["text"]["languages"] == ["en", "fa"] and manifest["languages"] == ["en", "fa"]
    # the same command again: the same settings, nothing to do
    assert main(["prepare", str(release), "--out", str(store), *PREPARE]) == 0
    assert "nothing to do" in capsys.readouterr().out
    # train takes the store's text section (no --set on every command)
    from myxtts.cli.common import config_from_args

    args = build_parser().parse_args(["train", str(store)])
    assert config_from_args(args, data=args.data).text.languages == ["en", "fa"]
    # doctor on the release: it reads as prepare does, so nothing is dropped
    assert main(["doctor", str(release), "--set", "train.compile=off", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "14 utterances" in out and "no problems" in out and "drop" not in out


def test_a_configured_text_languages_wins_and_doctor_names_the_drop(release, tmp_path, capsys):
    store = tmp_path / "store"
    assert main(["prepare", str(release), "--out", str(store), *PREPARE,
                 "--set", "text.languages=[en]"]) == 0
    captured = capsys.readouterr()
    assert "kept 2 of 2 utterances" in captured.out and "unknown language: 12" in captured.out
    assert "--set text.languages=[en,fa]" in captured.out and "the languages of" not in captured.err
    rc = main(["doctor", str(release), "--set", "text.languages=[en]", "--set",
               "train.compile=off", "--device", "cpu"])
    out = capsys.readouterr().out
    assert rc == 0 and "with text.languages=[en] prepare and train drop 12 row(s) for their " \
                       "language" in out and "--set text.languages=[en,fa]" in out, out
    config = tmp_path / "mine.yaml"  # set in a config file: as explicit as --set
    config.write_text("text:\n  languages: [fa]\n  default_language: fa\n")
    assert main(["prepare", str(release), "--out", str(tmp_path / "s2"), *PREPARE,
                 "--config", str(config)]) == 0
    assert "kept 12 of 12 utterances" in capsys.readouterr().out


def test_doctor_fails_when_prepare_would_drop_every_row(tmp_path, capsys):
    release = _release(tmp_path / "fa", [(s, "fa") for s in FA])
    rc = main(["doctor", str(release), "--set", "text.languages=[en]", "--set",
               "train.compile=off", "--device", "cpu"])
    out = capsys.readouterr().out
    assert rc == 1 and "drop every row (6 reported for its language)" in out, out
    # with the config's default the release's own language is read: nothing dropped
    assert main(["doctor", str(release), "--set", "train.compile=off", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "6 utterances" in out and "drop" not in out


def test_what_a_release_declares_and_what_it_cannot(tmp_path):
    from myxtts.config import load_config
    from myxtts.data.prepare.readers import MAX_DECLARED_LANGUAGES, declared_languages

    cfg = load_config()
    fa = _release(tmp_path / "fa", [(s, "fa-IR") for s in FA[:2]])
    found = declared_languages(fa, cfg)
    assert (found.languages, found.default_language) == (("fa",), "fa")  # no en row: no en
    en = _release(tmp_path / "en", [(s, "en") for s in EN])
    assert declared_languages(en, cfg) is None  # the config's own already
    codes = ["de", "fr", "es", "it", "nl", "pl", "sv", "da", "fi", "pt"][:MAX_DECLARED_LANGUAGES + 1]
    many = _release(tmp_path / "many", [("hallo welt", c) for c in codes])
    assert declared_languages(many, cfg) is None  # not turned into that many tokens
    odd = _release(tmp_path / "odd", [(FA[0], "fa"), (EN[0], "../../x"), (EN[1], "en us")])
    assert declared_languages(odd, cfg).languages == ("fa",)  # not language codes: reported
