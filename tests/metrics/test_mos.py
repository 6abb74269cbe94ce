"""DNSMOS from the models in the speechmos wheel: real read speech predicts a good score,
noise a bad one."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from myxtts.metrics import missing
from tests.helpers import LJSPEECH_MINI


def test_clean_speech_scores_well_and_noise_badly():
    if missing("speechmos", "onnxruntime", "librosa"):
        pytest.skip('speechmos/onnxruntime are not installed (pip install "myxtts[eval]")')
    clip = LJSPEECH_MINI / "wavs" / "LJ001-0160.wav"
    if not clip.is_file():
        pytest.skip(f"LJSpeech mini clips not found at {LJSPEECH_MINI}")
    from myxtts.metrics.mos import DNSMOS

    mos = DNSMOS()
    wav, sr = sf.read(clip, dtype="float32")
    speech = mos.score(wav, sr)
    assert 3.0 < speech.ovrl < 4.0 and speech.sig > 3.0 and speech.bak > 3.5
    noise = mos.score(np.random.default_rng(0).normal(size=sr * 2).astype(np.float32) * 0.1, sr)
    assert noise.ovrl < speech.ovrl - 1.0 and noise.bak < 2.5
