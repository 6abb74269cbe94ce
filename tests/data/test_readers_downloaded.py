"""Corpora as downloaded (Common Voice releases, LibriTTS trees) and the language of a row
whose dataset names none; fixtures are built here, in code."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from myxtts.cli.main import main
from myxtts.config import load_config
from myxtts.data.prepare.readers import read_dataset
from myxtts.data.prepare.records import (
    MISSING_AUDIO,
    MISSING_TRANSCRIPT,
    OUTSIDE_LANGUAGE,
    UNKNOWN_LANGUAGE,
    DatasetError,
)

SR = 22050
HAS_MP3 = "MP3" in sf.available_formats()
needs_mp3 = pytest.mark.skipif(not HAS_MP3, reason="this libsndfile cannot write MP3")
CV_HEADER = ["client_id", "path", "sentence_id", "sentence", "sentence_domain", "up_votes",
             "down_votes", "age", "gender", "accents", "variant", "locale", "segment"]
SPK_EN, SPK_FA = "a1b2c3" * 4, "f0e1d2" * 4


def _tone(seconds: float = 0.5, freq: float = 220.0) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    return (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def _cfg(*overrides: str):
    return load_config(overrides=list(overrides))


def _cv_row(client: str, clip: str, sentence: str, locale: str) -> list[str]:
    rec = {"client_id": client, "path": clip, "sentence": sentence, "locale": locale,
           "up_votes": "2", "down_votes": "0", "sentence_id": "s" + clip[:-4]}
    return [rec.get(c, "") for c in CV_HEADER]


def _tsv(path: Path, rows: list[list[str]], header: list[str] = CV_HEADER) -> None:
    path.write_text("\n".join("\t".join(r) for r in [header, *rows]) + "\n", encoding="utf-8")


def _common_voice(root: Path) -> Path:
    """A bilingual release: en and fa speakers; train.tsv line 5 names a missing clip and
    line 6 an unreadable one; line 4 holds a '"' in its sentence."""
    clips = root / "clips"
    clips.mkdir(parents=True)
    train = [_cv_row(SPK_EN, "en_1.mp3", "Hello there, friend.", "en"),
             _cv_row(SPK_FA, "fa_1.mp3", "سلام دوست من", "fa"),
             _cv_row(SPK_EN, "en_2.mp3", 'He said "yes" twice.', "en-US"),
             _cv_row(SPK_EN, "gone.mp3", "This clip was never downloaded.", "en"),
             _cv_row(SPK_FA, "bad.mp3", "این فایل خراب است", "fa-IR"),
             _cv_row(SPK_FA, "fa_2.mp3", "روز خوبی است", "fa")]
    dev = [_cv_row(SPK_EN, "en_3.mp3", "Good morning.", "en"),
           _cv_row(SPK_FA, "fa_3.mp3", "صبح بخیر", "fa")]
    test = [_cv_row(SPK_EN, "en_4.mp3", "Never trained on.", "en")]
    other = [_cv_row(SPK_EN, "en_5.mp3", "Not yet validated.", "en")]
    for name in ("en_1", "fa_1", "en_2", "fa_2", "en_3", "fa_3", "en_4", "en_5"):
        sf.write(clips / f"{name}.mp3", _tone(0.6, 180 + 20 * len(name)), SR, format="MP3")
    (clips / "bad.mp3").write_bytes(b"\x00not an mp3 at all" * 20)
    _tsv(root / "train.tsv", train)
    _tsv(root / "dev.tsv", dev)
    _tsv(root / "test.tsv", test)
    _tsv(root / "validated.tsv", train + dev + test)
    _tsv(root / "other.tsv", other)
    _tsv(root / "invalidated.tsv", [])
    return root


@needs_mp3
def test_common_voice_release_is_read_with_its_own_split(tmp_path):
    root = _common_voice(tmp_path / "cv-corpus" / "fa")
    splits = read_dataset(root, _cfg("text.languages=[en, fa]"))
    assert splits.format == "common_voice" and splits.split == "release"
    assert sorted(u.id for u in splits.train) == ["bad", "en_1", "en_2", "fa_1", "fa_2"]
    assert sorted(u.id for u in splits.val) == ["en_3", "fa_3"]
    by_id = {u.id: u for u in splits.all}
    assert {k: u.language for k, u in by_id.items()} == {
        "bad": "fa", "en_1": "en", "en_2": "en", "fa_1": "fa", "fa_2": "fa", "en_3": "en",
        "fa_3": "fa"}  # en-US -> en, fa-IR -> fa
    assert by_id["en_2"].text == 'He said "yes" twice.'  # a quote is text, not quoting
    assert by_id["fa_1"].speaker == SPK_FA and by_id["fa_1"].audio_path == root / "clips" / "fa_1.mp3"
    missing = splits.report.by_reason(MISSING_AUDIO)
    assert [(Path(p.source).name, p.line, p.utterance_id) for p in missing] == [("train.tsv", 5, "gone")]
    assert len(splits.report) == 1
    assert "train.tsv (train), dev.tsv (val)" in splits.note
    for name in ("test.tsv", "validated.tsv", "other.tsv", "invalidated.tsv"):
        assert name in splits.note.split("left out:")[1]


@needs_mp3
def test_inspect_data_on_a_bilingual_release_needs_no_set(tmp_path, capsys):
    root = _common_voice(tmp_path / "fa")
    assert main(["inspect-data", str(root)]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "format common_voice, split the release's own" in out
    assert "left out: " in out and "test.tsv (the release's test set)" in out
    assert "languages: en 3, fa 4" in out  # the languages the release declares, no --set
    assert "text.languages [en, fa] (default en): the languages of the Common Voice release" \
        in captured.err and "--set" not in out
    assert "speakers: 2" in out and SPK_EN in out and SPK_FA in out
    # the missing and the unreadable clip, each by its row
    assert "train.tsv:5 [gone] missing audio" in out
    assert "train.tsv:6 [bad] unreadable audio" in out and "delete line 6 of train.tsv" in out


@needs_mp3
def test_common_voice_locales_and_validated_only(tmp_path):
    root = _common_voice(tmp_path / "fa")
    for name in ("train.tsv", "dev.tsv"):
        (root / name).unlink()
    splits = read_dataset(root, _cfg("text.languages=[en, fa]", "data.val_fraction=0.3"))
    assert splits.split == "release-seeded" and len(splits.val) > 0
    assert "validated.tsv (train), a seeded val split of it" in splits.note
    assert "test.tsv" in splits.note.split("left out:")[1]
    only_fa = read_dataset(root, _cfg("text.languages=[fa]", "text.default_language=fa"))
    unknown = only_fa.report.by_reason(UNKNOWN_LANGUAGE)
    assert {p.utterance_id for p in unknown} == {"en_1", "en_2", "gone", "en_3", "en_4"}
    assert "locale 'en-US'" in next(p.fix for p in unknown if p.utterance_id == "en_2")
    assert only_fa.report.language_fix.set_args == "--set text.languages=[fa,en]"


def test_common_voice_header_without_sentence_is_one_line(tmp_path):
    root = tmp_path / "cv"
    (root / "clips").mkdir(parents=True)
    _tsv(root / "train.tsv", [["x", "a.mp3", "hi"]], header=["client_id", "path", "text"])
    # not detected as Common Voice (no sentence column): read as what it looks like
    with pytest.raises(DatasetError):
        read_dataset(root, _cfg())
    with pytest.raises(DatasetError, match=r"data.format=common_voice expects clips/"):
        read_dataset(root, _cfg("data.format=common_voice"))


def _libritts_clip(chapter: Path, stem: str, normalized: str | None, original: str | None = None):
    chapter.mkdir(parents=True, exist_ok=True)
    sf.write(chapter / f"{stem}.wav", _tone(), SR, subtype="PCM_16")
    if normalized is not None:
        (chapter / f"{stem}.normalized.txt").write_text(normalized, encoding="utf-8")
    if original is not None:
        (chapter / f"{stem}.original.txt").write_text(original, encoding="utf-8")


def _libritts(root: Path) -> Path:
    for subset, speakers in (("train-clean-100", ("19", "26")), ("dev-clean", ("84",)),
                             ("test-clean", ("61",))):
        for spk in speakers:
            ch = root / subset / spk / "198"
            for k in range(2):
                _libritts_clip(ch, f"{spk}_198_000000_00000{k}", f"Sentence {k} of {spk}.",
                               f"Sentence {k} of {spk}!")
    _libritts_clip(root / "train-clean-100" / "26" / "198", "26_198_000001_000000", None, "Only 2 raw.")
    _libritts_clip(root / "train-clean-100" / "26" / "198", "26_198_000002_000000", None)
    (root / "speakers.tsv").write_text("READER\tGENDER\tSUBSET\tNAME\n19\tF\ttrain-clean-100\tA\n")
    return root


def test_libritts_tree_uses_its_subsets_as_splits(tmp_path):
    root = _libritts(tmp_path / "LibriTTS")
    splits = read_dataset(root, _cfg())
    assert splits.format == "libritts" and splits.split == "release"
    assert sorted(u.speaker for u in splits.train) == ["19", "19", "26", "26", "26"]
    assert sorted(u.id for u in splits.val) == ["84_198_000000_000000", "84_198_000000_000001"]
    by_id = {u.id: u for u in splits.all}
    assert by_id["19_198_000000_000001"].text == "Sentence 1 of 19."  # normalized, not original
    assert by_id["26_198_000001_000000"].text == "Only 2 raw."  # only the original exists
    missing = splits.report.by_reason(MISSING_TRANSCRIPT)
    assert [p.utterance_id for p in missing] == ["26_198_000002_000000"]
    assert "train-clean-100 (train), dev-clean (val); left out: test-clean" in splits.note


def test_a_single_libritts_subset_folder(tmp_path):
    root = _libritts(tmp_path / "LibriTTS")
    splits = read_dataset(root / "train-clean-100", _cfg("data.val_fraction=0.3"))
    assert splits.format == "libritts" and splits.split == "release-seeded"
    assert {u.speaker for u in splits.all} == {"19", "26"} and len(splits.val) > 0


# ---------------------------------------------------------------- language by script

def _speakers(root: Path, texts: dict[str, str]) -> Path:
    """Speaker folders (no language anywhere): ``{"spk/id": text}``."""
    for key, text in texts.items():
        spk, uid = key.split("/")
        (root / spk).mkdir(parents=True, exist_ok=True)
        sf.write(root / spk / f"{uid}.wav", _tone(), SR, subtype="PCM_16")
        (root / spk / f"{uid}.txt").write_text(text, encoding="utf-8")
    return root


BILINGUAL = {"ann/a1": "Hello there.", "ann/a2": "Good day.", "bo/b1": "سلام دنیا",
             "bo/b2": "روز خوبی است", "bo/b3": "سلام hello"}


def test_a_row_takes_the_language_of_its_script(tmp_path):
    root = _speakers(tmp_path / "d", BILINGUAL)
    splits = read_dataset(root, _cfg("data.val_fraction=0", "text.languages=[en, fa]"))
    langs = {u.id: u.language for u in splits.train}
    assert langs == {"ann_a1": "en", "ann_a2": "en", "bo_b1": "fa", "bo_b2": "fa"}
    mixed = splits.report.by_reason(OUTSIDE_LANGUAGE)  # two scripts: the default, reported
    assert [p.utterance_id for p in mixed] == ["bo_b3"] and "'en' text holds" in mixed[0].detail
    assert splits.report.language_fix is None  # no setting fixes a mixed row


def test_the_setting_that_removes_every_language_problem_is_named(tmp_path, capsys):
    root = _speakers(tmp_path / "d", {k: v for k, v in BILINGUAL.items() if k != "bo/b3"})
    splits = read_dataset(root, _cfg("data.val_fraction=0"))
    assert len(splits.report.by_reason(OUTSIDE_LANGUAGE)) == 2
    fix = splits.report.language_fix
    assert fix.set_args == "--set text.languages=[en,fa]" and fix.n_problems == 2
    assert "all 2 language problem(s) go away with --set text.languages=[en,fa]" in splits.report.format()
    # Persian only under the default en: every row is rejected, the error names the setting
    fa_root = _speakers(tmp_path / "fa", {"bo/b1": "سلام دنیا", "bo/b2": "روز خوبی است"})
    with pytest.raises(DatasetError, match=r"--set text.languages=\[fa\] --set text.default_language=fa"):
        read_dataset(fa_root, _cfg())
    assert main(["inspect-data", str(fa_root)]) == 0
    out = capsys.readouterr().out
    assert "languages: fa 2" in out and "read with --set text.languages=[fa] --set text.default_language=fa" in out
    assert main(["inspect-data", str(fa_root), "--set", "text.languages=[fa]",
                 "--set", "text.default_language=fa"]) == 0
    assert "read with" not in capsys.readouterr().out


def test_prepare_names_the_setting(tmp_path):
    from myxtts.data.prepare.build import prepare_store

    root = _speakers(tmp_path / "d", {k: v for k, v in BILINGUAL.items() if k != "bo/b3"})
    lines: list[str] = []
    prepare_store(root, tmp_path / "store", _cfg("data.val_fraction=0"), workers=1,
                  progress=False, echo=lines.append)
    assert "go away with --set text.languages=[en,fa]" in "\n".join(lines)
