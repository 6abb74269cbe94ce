"""The second demo language (fa, Persian letters): who speaks it, its text, its sounds, and
that a bilingual demo corpus reads and prepares with both languages kept."""

from __future__ import annotations

import numpy as np
import pytest

from myxtts.config import load_config
from myxtts.data.prepare.readers import read_dataset
from myxtts.synthetic import (
    DEMO_ALPHABET,
    DEMO_ALPHABETS,
    demo_sentence,
    demo_speaker,
    make_demo_data,
    speaker_languages,
    synthesize_demo,
)
from myxtts.text import clean_text

SR = 22050
FA = DEMO_ALPHABETS["fa"]
SH, KH = "\u0634", "\u062e"


@pytest.fixture(scope="module")
def bilingual(tmp_path_factory):
    return make_demo_data(tmp_path_factory.mktemp("bi") / "d", speakers=3, utterances=6, seed=0,
                          languages=("en", "fa"))


def _rows(root):
    return [ln.split("|") for ln in (root / "metadata.csv").read_text(encoding="utf-8").splitlines()]


def test_speaker_languages_rule():
    got = speaker_languages(8, ("en", "fa"))
    assert got == {**{f"spk{i}": ["en"] for i in range(3)}, **{f"spk{i}": ["en", "fa"] for i in (3, 4, 5)},
                   "spk6": ["fa"], "spk7": ["fa"]}
    assert speaker_languages(2, ["en", "fa"]) == {"spk0": ["en"], "spk1": ["fa"]}
    assert speaker_languages(1, ["en", "fa"]) == {"spk0": ["en", "fa"]}
    assert speaker_languages(3, ["fa", "en"]) == {"spk0": ["fa"], "spk1": ["fa", "en"], "spk2": ["en"]}
    assert speaker_languages(4) == {f"spk{i}": ["en"] for i in range(4)}
    for n in range(3, 40):
        kinds = [tuple(v) for v in speaker_languages(n, ("en", "fa")).values()]
        assert {("en",), ("fa",), ("en", "fa")} == set(kinds), n
        assert kinds == sorted(kinds, key=[("en",), ("en", "fa"), ("fa",)].index)  # contiguous groups
    for bad in [(), ("en", "de"), ("en", "en"), ("fa", "en", "fa")]:
        with pytest.raises(ValueError, match="demo languages"):
            speaker_languages(4, bad)


def test_bilingual_corpus_layout_and_languages(bilingual):
    rows = _rows(bilingual)
    assert len(rows) == 18 and all(len(r) == 5 and r[1] == r[2] for r in rows)
    langs = {s: [r[4] for r in rows if r[3] == s] for s in ("spk0", "spk1", "spk2")}
    assert langs == {"spk0": ["en"] * 6, "spk1": ["en", "fa"] * 3, "spk2": ["fa"] * 6}
    for _, text, _, _, lang in rows:
        assert set(text) <= set(DEMO_ALPHABETS[lang] + " ."), text
        assert text.endswith(".")
        assert clean_text(text, lang) == text  # every letter survives cleaning
    fa_text = "".join(r[1] for r in rows if r[4] == "fa")
    assert {SH, KH} <= set(fa_text)
    readme = (bilingual / "README.txt").read_text(encoding="utf-8")
    assert "--languages en,fa" in readme and "id|text|text|speaker|language" in readme
    assert FA in readme and "sh" in readme and "speaks en+fa" in readme


def test_bilingual_corpus_is_deterministic_and_monolingual_voices_match(bilingual, tmp_path):
    again = make_demo_data(tmp_path / "again", speakers=3, utterances=6, seed=0, languages=["en", "fa"])
    for p in sorted(bilingual.rglob("*")):
        if p.is_file():
            assert p.read_bytes() == (again / p.relative_to(bilingual)).read_bytes(), p
    # An en-only voice says exactly what it says in the monolingual corpus.
    mono = make_demo_data(tmp_path / "mono", speakers=3, utterances=6, seed=0)
    assert (mono / "wavs" / "spk0_0003.wav").read_bytes() == (bilingual / "wavs" / "spk0_0003.wav").read_bytes()
    assert all(len(r) == 4 for r in _rows(mono))


def test_demo_sentences():
    en, fa = demo_sentence("en"), demo_sentence("fa")
    assert en == "lamo tesi kunapo. miresu."
    assert set(fa) <= set(FA + " .") and {SH, KH} <= set(fa) and abs(len(fa) - len(en)) <= 5
    assert clean_text(fa, "fa") == fa and fa.count(".") == 2
    assert synthesize_demo(fa, 0, 4).size > 0.5 * SR
    with pytest.raises(ValueError, match="demo language"):
        demo_sentence("de")


def _band_share(wav: np.ndarray, lo: float, hi: float) -> float:
    spec = np.abs(np.fft.rfft(wav * np.hanning(wav.size))) ** 2
    f = np.fft.rfftfreq(wav.size, 1 / SR)
    return float(spec[(f >= lo) & (f < hi)].sum() / spec.sum())


def _centroid(wav: np.ndarray, lo: float, hi: float) -> float:
    spec = np.abs(np.fft.rfft(wav * np.hanning(wav.size))) ** 2
    f = np.fft.rfftfreq(wav.size, 1 / SR)
    band = (f >= lo) & (f < hi)
    return float((spec[band] * f[band]).sum() / spec[band].sum())


def test_fa_sounds_are_their_own():
    """sh is noise at 2.5-5 kHz, kh at 1-2 kHz (formant scale 1.0 for voice 2 of 5)."""
    assert demo_speaker(2, 5).formant_scale == pytest.approx(1.025)
    sh = synthesize_demo(SH * 4, 2, 5)[int(0.1 * SR):int(0.4 * SR)]
    kh = synthesize_demo(KH * 4, 2, 5)[int(0.1 * SR):int(0.4 * SR)]
    assert _band_share(sh, 2500, 5200) > 0.8 and _band_share(kh, 1000, 2100) > 0.8
    # The long vowel aa is not en's a: different spectrum at the same voice.
    aa = synthesize_demo("\u0627" * 3, 2, 5)[int(0.1 * SR):int(0.4 * SR)]
    a = synthesize_demo("aaaa", 2, 5)[int(0.1 * SR):int(0.4 * SR)]
    assert _centroid(aa, 400, 2000) < 0.95 * _centroid(a, 400, 2000)  # F2 1000 vs 1150 Hz
    # Shared letters are the same sound: fa's و is en's u.
    assert np.array_equal(synthesize_demo("\u0648", 1, 3, seed=5), synthesize_demo("u", 1, 3, seed=5))
    assert set(DEMO_ALPHABET).isdisjoint(FA)


def test_bilingual_corpus_reads_and_prepares_with_both_languages(bilingual, tmp_path):
    from myxtts.data.prepare.build import prepare_store
    from myxtts.data.prepare.records import UNKNOWN_LANGUAGE
    from myxtts.data.store import FeatureStore

    cfg = load_config(None, None, ["text.languages=[en, fa]"])
    splits = read_dataset(bilingual, cfg)
    assert len(splits.report) == 0 and {u.language for u in splits.all} == {"en", "fa"}
    result = prepare_store(bilingual, tmp_path / "store", cfg, workers=1, progress=False,
                           echo=lambda *a: None)
    assert result.rejected == {} and sum(result.kept.values()) == 18
    stores = [FeatureStore.open(tmp_path / "store", split) for split in ("train", "val")]
    assert len(set(np.concatenate([s.language_ids for s in stores]).tolist())) == 2
    # Without fa in text.languages the fa rows are reported, not silently read as en.
    only_en = read_dataset(bilingual, load_config())
    assert {u.language for u in only_en.all} == {"en"}
    assert len(only_en.report.by_reason(UNKNOWN_LANGUAGE)) == 9


def test_make_demo_data_cli_languages_flag(tmp_path, capsys):
    from myxtts.cli.main import main

    out = tmp_path / "cli"
    assert main(["make-demo-data", str(out), "--speakers", "3", "--utterances", "2",
                 "--languages", "en,fa"]) == 0
    assert [r[4] for r in _rows(out)] == ["en", "en", "en", "fa", "fa", "fa"]
    assert main(["make-demo-data", str(tmp_path / "bad"), "--languages", "en,de"]) == 2
    assert "--languages must be" in capsys.readouterr().err
