"""`myxtts evaluate` scores an XTTS-v2 folder like any model: the model and truth rows, no
"truth, vocoded" row (its audio comes from GPT latents, not a mel), decoding capped at the
truth's length in codes."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import soundfile as sf

from myxtts.evaluate import harness
from myxtts.evaluate.speaking import open_speaking_model
from myxtts.evaluate.xtts_speaking import XttsV2SpeakingModel
from myxtts.metrics import EvaluationError, missing
from myxtts.metrics.scorer import Scorer

pytestmark = pytest.mark.usefixtures("one_thread")
SR = 22050


@pytest.fixture(scope="module")
def voices(tmp_path_factory):
    """An LJSpeech folder of 3 voiced clips of one English speaker."""
    root = tmp_path_factory.mktemp("voices")
    (root / "wavs").mkdir()
    lines = []
    for k, hz in enumerate((110, 140, 170)):
        t = np.arange(int(1.1 * SR)) / SR
        wav = 0.3 * np.sin(2 * np.pi * hz * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))
        sf.write(root / "wavs" / f"u{k}.wav", wav.astype(np.float32), SR, subtype="PCM_16")
        lines.append(f"u{k}|Number {k} is here.|Number {k} is here.|anna|en")
    (root / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


@pytest.mark.slow
def test_an_xtts_folder_is_scored_without_the_vocoded_row(reduced_folder, voices, monkeypatch):
    if missing("resemblyzer"):
        pytest.skip('the eval extra is not installed (pip install "myxtts[eval]")')
    monkeypatch.setattr(harness, "Scorer", functools.partial(Scorer, mos=False))
    model = open_speaking_model(reduced_folder, device="cpu")
    assert isinstance(model, XttsV2SpeakingModel) and model.sample_rate == 24000
    ev = harness.score(model, str(reduced_folder), voices, max_utterances=2, split="all",
                       asr="none")
    assert ev.rows == ("model", "truth") and len(ev.cases) == 2
    assert ev.vocoder == "XTTS-v2's HiFi-GAN decoder" and ev.training is None
    for spoken in ev.scores["model"]:
        # random weights never stop: cut at 3x the truth's codes (1.1 s: 23 codes -> 70)
        assert 2.5 < spoken.truth["duration_ratio"] < 3.5 and spoken.synthesis_s > 0
    assert any("did not stop" in n and "gpt_max_audio_tokens (605)" in n for n in ev.notes)
    assert any("'truth, vocoded' row is left out" in n for n in ev.notes)


def test_a_vocoder_for_xtts_is_refused(reduced_folder):
    with pytest.raises(EvaluationError, match="own HiFi-GAN decoder"):
        open_speaking_model(reduced_folder, device="cpu", vocoder="runs/voc")
