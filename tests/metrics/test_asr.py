"""Intelligibility: error rates with known answers, pocketsphinx on real speech within a
bound, whisper only from weights on disk, and the missing extra named in one line."""

from __future__ import annotations

import math
import sys
import types

import numpy as np
import pytest
import soundfile as sf

from myxtts.metrics import EvaluationError, asr, missing, require
from tests.helpers import LJSPEECH_MINI


def test_normalize_keeps_words_and_contractions_only():
    assert asr.normalize("Hello, World! It's \u2018quoted\u2019 -- 'twas  (sic)") == \
        "hello world it's quoted twas sic"
    assert asr.normalize("Caf\u00e9 NO.5") == "caf\u00e9 no 5"


@pytest.mark.parametrize("ref,hyp,edits", [
    ("kitten", "sitting", 3), ("", "abc", 3), ("abc", "", 3), ("abc", "abc", 0),
    ("flaw", "lawn", 2), (["a", "b", "c"], ["a", "c"], 1), (["a"], ["b", "a", "c"], 2)])
def test_edit_distance_known_answers(ref, hyp, edits):
    assert asr.edit_distance(ref, hyp) == edits


def test_error_rates_pool_over_utterances():
    a = asr.ErrorCounts.of("The cat sat.", "the cat sad")  # 1 char, 1 word of 11 chars, 3 words
    b = asr.ErrorCounts.of("on the mat", "on the mat")
    assert (a.char_edits, a.chars, a.word_edits, a.words) == (1, 11, 1, 3)
    total = a + b
    assert total.cer == pytest.approx(1 / 21) and total.wer == pytest.approx(1 / 6)
    assert math.isnan(asr.ErrorCounts.of("", "words").cer)


def test_recognizer_names():
    assert asr.recognizer("none") is None
    with pytest.raises(EvaluationError, match="not a recognizer"):
        asr.recognizer("kaldi")


def test_a_missing_package_is_named_with_the_install_line(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "pocketsphinx" else real(name, *a))
    assert missing("pocketsphinx", "numpy") == ["pocketsphinx"]
    with pytest.raises(EvaluationError) as e:
        require("pocketsphinx", "numpy")
    assert str(e.value) == ('the speech metrics need pocketsphinx, not installed: '
                            'pip install "myxtts[eval]"')
    with pytest.raises(EvaluationError, match="pocketsphinx, not installed"):
        asr.recognizer("pocketsphinx")


def test_pocketsphinx_understands_real_speech_and_not_noise():
    """A real LJSpeech clip is transcribed with a bounded CER (0.13 on this one; pooled over
    the mini set about 0.3); noise is not (CER near 1)."""
    if missing("pocketsphinx"):
        pytest.skip('pocketsphinx is not installed (pip install "myxtts[eval]")')
    metadata = LJSPEECH_MINI / "metadata.csv"
    if not metadata.is_file():
        pytest.skip(f"LJSpeech mini clips not found at {LJSPEECH_MINI}")
    rows = dict(line.split("|")[0::2] for line in metadata.read_text(encoding="utf-8").splitlines())
    clip_id = "LJ001-0160"  # "by that made in America, which is the worst conceivable." 3.6 s
    wav, sr = sf.read(LJSPEECH_MINI / "wavs" / f"{clip_id}.wav", dtype="float32")
    recognizer = asr.recognizer("pocketsphinx")
    assert recognizer.speaks("en") and not recognizer.speaks("fa")
    heard = asr.ErrorCounts.of(rows[clip_id], recognizer.transcribe(wav, sr, "en"))
    assert heard.cer < 0.4 and heard.wer < 0.6
    noise = np.random.default_rng(0).normal(size=sr * 3 // 2).astype(np.float32) * 0.05
    assert asr.ErrorCounts.of(rows[clip_id], recognizer.transcribe(noise, sr, "en")).cer > 0.8


def test_whisper_reads_only_weights_on_disk(monkeypatch, tmp_path):
    """openai-whisper (a stand-in module here) is loaded from XDG_CACHE_HOME/whisper/SIZE.pt;
    without that file the error names it and nothing is downloaded."""
    loaded = []

    class Model:
        def transcribe(self, audio, language, fp16):
            assert audio.dtype == np.float32 and language == "fa" and fp16 is False
            return {"text": " salam donya"}

    fake = types.ModuleType("whisper")
    fake.load_model = lambda name, device: loaded.append(name) or Model()
    monkeypatch.setitem(sys.modules, "whisper", fake)
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
        importlib.util.spec_from_loader("whisper", loader=None) if name == "whisper"
        else real(name, *a)))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(EvaluationError, match=r"no weights at .*whisper/base\.pt"):
        asr.recognizer("whisper:base")
    assert not loaded
    (tmp_path / "whisper").mkdir()
    (tmp_path / "whisper" / "base.pt").write_bytes(b"weights")
    recognizer = asr.recognizer("whisper:base")
    assert loaded == [str(tmp_path / "whisper" / "base.pt")] and recognizer.speaks("fa")
    assert recognizer.transcribe(np.zeros(22050, np.float32), 22050, "fa") == " salam donya"
