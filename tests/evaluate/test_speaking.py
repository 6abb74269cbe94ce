"""The harness scores any ``SpeakingModel``: a stand-in that speaks a tone as long as the
truth gets the three rows, another reference where it refuses one, and its own note on
utterances that did not stop; one whose audio cannot be made from a true clip is scored,
reported and written without the "truth, vocoded" row, with a note saying why."""

from __future__ import annotations

import csv
import functools
import json

import numpy as np
import pytest
import soundfile as sf
import torch

from myxtts.config import load_config
from myxtts.evaluate import harness, report
from myxtts.inference.errors import SynthesisError
from myxtts.metrics import missing
from myxtts.metrics.scorer import Scorer

pytestmark = pytest.mark.usefixtures("one_thread")

SR = 22050


class Tone:
    """A model that says every text as a 330 Hz tone as long as the true clip and never
    stops; its voice is the reference's loudness; ``vocodes``: whether its "vocoder" gives
    the true clip back unchanged, or cannot voice one at all (None)."""

    vocoder = "a test tone"
    length_limit = "the tone's own cap (9 s)"
    training_record = None
    device = torch.device("cpu")

    def __init__(self, vocodes: bool) -> None:
        self.config = load_config()
        self.sample_rate = self.config.audio.sample_rate
        self.languages = ["en"]
        self.vocodes = vocodes
        self.calls: list[str] = []
        self.refused: list[str] = []  # references voice_of could not use

    def load(self) -> None:
        self.calls.append("load")

    def voice_of(self, wav: np.ndarray, name: str) -> float:
        if len(wav) < self.sample_rate // 2:
            self.refused.append(name)
            raise SynthesisError(f"reference {name} is too short")
        return float(np.sqrt(np.mean(wav ** 2)))

    def warm_up(self, text: str, voice: float, language: str, seed: int) -> None:
        self.calls.append("warm up")

    def say(self, text: str, voice: float, language: str, seed: int,
            truth_samples: int) -> tuple[np.ndarray, bool]:
        self.calls.append("say")
        t = np.arange(truth_samples) / self.sample_rate
        return (voice * np.sqrt(2) * np.sin(2 * np.pi * 330 * t)).astype(np.float32), True

    def vocoded_truth(self, truth: np.ndarray) -> np.ndarray | None:
        return truth.copy() if self.vocodes else None

    def scoring_text(self, text: str, language: str) -> str:
        return text.lower()


@pytest.fixture(scope="module")
def tones(tmp_path_factory):
    """An LJSpeech folder of 4 one-second clips of one English speaker, each a tone of its
    own, one of them too short to clone a voice from."""
    root = tmp_path_factory.mktemp("tones")
    (root / "wavs").mkdir()
    lines = []
    for k, (hz, seconds) in enumerate([(180, 1.2), (220, 1.0), (260, 1.1), (300, 0.4)]):
        t = np.arange(int(seconds * SR)) / SR
        sf.write(root / "wavs" / f"u{k}.wav", (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32),
                 SR, subtype="PCM_16")
        lines.append(f"u{k}|Tone number {k}.|Tone number {k}.|anna|en")
    (root / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


@pytest.fixture(autouse=True)
def _no_dnsmos(monkeypatch):
    """The scorer without DNSMOS (seconds per clip, and nothing of the protocol)."""
    if missing("resemblyzer"):
        pytest.skip('the eval extra is not installed (pip install "myxtts[eval]")')
    monkeypatch.setattr(harness, "Scorer", functools.partial(Scorer, mos=False))


def test_any_speaking_model_is_scored_on_the_three_rows(tones):
    model = Tone(vocodes=True)
    ev = harness.score(model, "tone", tones, max_utterances=3, split="all", asr="none")
    assert ev.rows == harness.ROWS and ev.model == "tone" and ev.vocoder == "a test tone"
    assert ev.device == "cpu" and ev.training is None and ev.asr == "none"
    assert model.calls[:2] == ["load", "warm up"] and model.calls.count("warm up") == 1
    assert len(ev.cases) == 3 and all(c.reference_id != c.id for c in ev.cases)
    # u1's drawn reference, the short u3, gave way to another clip of the speaker
    assert model.refused == ["u3"] and "u3" not in {c.reference_id for c in ev.cases}
    for k in range(len(ev.cases)):
        truth, vocoded, spoken = (ev.scores[r][k] for r in ("truth", "truth, vocoded", "model"))
        assert truth.truth == vocoded.truth  # the stand-in "vocodes" the truth unchanged
        assert truth.truth["mcd_db"] == 0 and truth.truth["duration_ratio"] == 1
        assert spoken.truth["mcd_db"] > 0 and spoken.truth["duration_ratio"] == pytest.approx(1, abs=0.05)
        assert spoken.synthesis_s > 0 and truth.synthesis_s is None
    assert "3 of 3 utterances did not stop: cut at 3x the true length or at the tone's own " \
           "cap (9 s), the smaller" in ev.notes
    assert not any("left out" in n for n in ev.notes), ev.notes


def test_a_model_that_cannot_voice_a_true_clip_is_scored_without_that_row(tones, tmp_path):
    out, clips = tmp_path / "out", tmp_path / "out" / ".stage" / "audio"
    ev = harness.score(Tone(vocodes=False), "tone", tones, max_utterances=3, split="all",
                       asr="none", audio_dir=clips)
    assert ev.rows == ("model", "truth") and "truth, vocoded" not in ev.scores
    assert len(ev.cases) == 3 and all(len(ev.scores[r]) == 3 for r in ev.rows)
    said = [n for n in ev.notes if "truth, vocoded" in n]
    assert said == ["the 'truth, vocoded' row is left out: this model's audio (a test tone) "
                    "cannot be made from a true clip, so the vocoder's share of the error is "
                    "not measured"]
    assert sorted(p.name for p in clips.iterdir()) == [f"{c.id}.model.wav" for c in
                                                       sorted(ev.cases, key=lambda c: c.id)]

    text = report.text_report(ev)
    assert "truth, vocoded" in text.split("note: ", 1)[1] and "  truth, vocoded" not in text
    assert "  model" in text and "  truth" in text
    report.write(ev, out)
    written = json.loads((out / report.JSON_FILE).read_text())
    assert list(written["summary"]["en"]) == ["model", "truth"]
    assert written["summary"]["en"]["truth"]["mcd_db"] == 0 and said[0] in written["notes"]
    rows = list(csv.DictReader((out / report.CSV_FILE).open()))
    assert [r["row"] for r in rows] == ["model", "truth"] * 3


def test_a_model_whose_clips_and_data_rates_differ_is_refused(tones):
    model = Tone(vocodes=True)
    model.sample_rate = 24000
    with pytest.raises(ValueError, match="config.audio.sample_rate 22050 is not its sample_rate"):
        harness.score(model, "tone", tones, split="all", asr="none")
    assert model.calls == []  # refused before anything loads
