"""Speaker similarity: resemblyzer's GE2E encoder rebuilt without its modules gives its
embeddings; a clip is its own voice (1), two clips of one speaker are near, two voices apart."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import soundfile as sf

from myxtts.metrics import missing, speaker
from tests.helpers import LJSPEECH_MINI


@pytest.fixture(scope="module")
def encoder():
    if missing("resemblyzer"):
        pytest.skip('resemblyzer is not installed (pip install "myxtts[eval]")')
    return speaker.SpeakerEncoder()


def _vowel(f0: float, formant: float, seconds: float = 2.5, sr: int = 16000) -> np.ndarray:
    """A voice-like buzz: harmonics of f0 shaped by one resonance at ``formant`` Hz."""
    t = np.arange(int(seconds * sr)) / sr
    wav = sum(np.sin(2 * np.pi * f0 * h * t) / (1 + ((f0 * h - formant) / 300) ** 2)
              for h in range(1, 30))
    return (0.1 * wav / np.abs(wav).max()).astype(np.float32)


def test_a_clip_is_its_own_voice_and_embeddings_have_unit_length(encoder):
    clip = _vowel(120, 700)
    e = encoder.embed(clip, 16000)
    assert e.shape == (256,) and np.linalg.norm(e) == pytest.approx(1.0, abs=1e-5)
    assert speaker.similarity(e, encoder.embed(clip, 16000)) == pytest.approx(1.0, abs=1e-6)
    assert speaker.similarity(e, encoder.embed(_vowel(240, 2000), 16000)) < 0.99


@pytest.mark.filterwarnings("ignore:Please import:DeprecationWarning")  # resemblyzer's scipy import
def test_the_embedding_is_resemblyzers(encoder, monkeypatch):
    """resemblyzer's own embed_utterance on the same levelled 16 kHz clip, its modules
    imported with a stand-in webrtcvad (whose real import needs pkg_resources; the VAD is
    not used by embed_utterance)."""
    monkeypatch.setitem(sys.modules, "webrtcvad", types.ModuleType("webrtcvad"))
    try:
        from resemblyzer import VoiceEncoder
    except ImportError as e:  # e.g. a scipy without scipy.ndimage.morphology
        pytest.skip(f"resemblyzer's modules do not import here: {e}")
    theirs = VoiceEncoder("cpu", verbose=False)
    rng = np.random.default_rng(0)
    clip = _vowel(150, 900, seconds=3.3) + 0.01 * rng.normal(size=int(3.3 * 16000)).astype(np.float32)
    clip = speaker._raise_volume(clip.astype(np.float32))
    np.testing.assert_allclose(encoder.embed_levelled(clip), theirs.embed_utterance(clip),
                               atol=1e-5)


def test_one_speaker_is_nearer_than_another_voice(encoder):
    """Two LJSpeech clips (one reader) are more alike than one of them and a buzz."""
    wavs = [LJSPEECH_MINI / "wavs" / f"{i}.wav" for i in ("LJ001-0160", "LJ001-0174")]  # 3.5 s
    if not all(w.is_file() for w in wavs):
        pytest.skip(f"LJSpeech mini clips not found at {LJSPEECH_MINI}")
    a, b = (encoder.embed(*sf.read(w, dtype="float32")) for w in wavs)
    same = speaker.similarity(a, b)
    other = speaker.similarity(a, encoder.embed(_vowel(220, 1200, seconds=3.0), 16000))
    assert same > 0.8 and other < same - 0.2
