"""Synthetic demo corpus: deterministic, in range, pitch follows the speaker, readable."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from myxtts.config import load_config
from myxtts.data.prepare.readers import read_dataset
from myxtts.synthetic import (
    DEMO_ALPHABET,
    demo_speaker,
    demo_speaker_f0,
    make_demo_data,
    synthesize_demo,
)

SR = 22050


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    return make_demo_data(tmp_path_factory.mktemp("demo") / "d", speakers=4, utterances=4, seed=0)


def _files(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_identical_bytes_other_seed_differs(demo_dir, tmp_path):
    again = make_demo_data(tmp_path / "again", speakers=4, utterances=4, seed=0)
    a, b = _files(demo_dir), _files(again)
    assert sorted(a) == sorted(b) and len(a) == 4 * 4 + 3
    assert all(a[k] == b[k] for k in a)
    other = _files(make_demo_data(tmp_path / "other", speakers=4, utterances=4, seed=1))
    assert other["metadata.csv"] != a["metadata.csv"]
    assert all(other[k] != a[k] for k in a if k.startswith("wavs/"))


def test_layout_format_and_durations(demo_dir):
    rows = [ln.split("|") for ln in (demo_dir / "metadata.csv").read_text().splitlines()]
    assert len(rows) == 16 and all(len(r) == 4 and r[1] == r[2] for r in rows)
    assert [r[0] for r in rows[:5]] == ["spk0_0000", "spk0_0001", "spk0_0002", "spk0_0003", "spk1_0000"]
    assert {r[3] for r in rows} == {"spk0", "spk1", "spk2", "spk3"}
    for uid, text, _, _ in rows:
        assert set(text) <= set(DEMO_ALPHABET + " ."), text
        assert text.endswith(".") and 2 <= min(len(w.strip(".")) for w in text.split())
        info = sf.info(str(demo_dir / "wavs" / f"{uid}.wav"))
        assert (info.samplerate, info.channels, info.subtype) == (SR, 1, "PCM_16")
        assert 0.5 <= info.frames / SR <= 5.0
        wav, _ = sf.read(str(demo_dir / "wavs" / f"{uid}.wav"))
        assert -3.5 < 20 * np.log10(np.abs(wav).max()) < -2.5
        floor_db = 20 * np.log10(wav[: int(0.02 * SR)].std())  # start of the 40 ms lead silence
        assert -66 < floor_db < -54
    assert "spk3" in (demo_dir / "README.txt").read_text()


def _f0_autocorr(wav: np.ndarray) -> float:
    """f0 of the loudest 50 ms (a vowel) by autocorrelation, searched in 60-400 Hz."""
    w = int(0.05 * SR)
    energy = np.convolve(wav**2, np.ones(w), "valid")
    seg = wav[int(np.argmax(energy)):][:w]
    seg = seg - seg.mean()
    ac = np.correlate(seg, seg, "full")[w - 1:]
    lo, hi = SR // 400, SR // 60
    return SR / (lo + int(np.argmax(ac[lo:hi])))


def test_pitch_follows_the_speaker(demo_dir):
    medians = []
    for s in range(4):
        est = [_f0_autocorr(sf.read(str(demo_dir / "wavs" / f"spk{s}_{k:04d}.wav"))[0]) for k in range(4)]
        medians.append(float(np.median(est)))
        assert abs(medians[-1] / demo_speaker_f0(s, 4) - 1) < 0.15, (s, est)
    assert medians == sorted(medians) and medians[-1] > 2.5 * medians[0]


def test_speaker_parameters():
    f0 = [demo_speaker_f0(i, 5) for i in range(5)]
    assert f0[0] == pytest.approx(90) and f0[-1] == pytest.approx(260)
    assert np.allclose(np.diff(np.log(f0)), np.log(260 / 90) / 4)  # log-spaced
    spk = [demo_speaker(i, 5) for i in range(5)]
    assert all(0.85 <= s.formant_scale <= 1.2 for s in spk)
    assert len({round(s.tilt_db_per_octave, 3) for s in spk}) == 5
    assert demo_speaker_f0(0, 1) == pytest.approx(np.sqrt(90 * 260))


def test_formants_scale_with_the_speaker():
    """'i' has a high F2 (2250 Hz x formant scale): its spectral centroid above 1.5 kHz moves up."""
    def centroid(spk):
        wav = synthesize_demo("iiii", spk, 4)[int(0.1 * SR):int(0.4 * SR)]
        mag = np.abs(np.fft.rfft(wav * np.hanning(wav.size)))
        f = np.fft.rfftfreq(wav.size, 1 / SR)
        band = (f > 1500) & (f < 4000)
        return float((mag[band] * f[band]).sum() / mag[band].sum())
    assert centroid(0) < centroid(3) * 0.9
    with pytest.raises(ValueError, match="not in the demo alphabet"):
        synthesize_demo("xyz", 0, 4)


def test_readers_load_demo_with_speakers(demo_dir):
    splits = read_dataset(demo_dir, load_config(overrides=["data.val_fraction=0.25"]))
    assert splits.format == "ljspeech" and len(splits.report) == 0
    assert splits.speakers == ["spk0", "spk1", "spk2", "spk3"]
    assert len(splits.train) == 12 and len(splits.val) == 4
    assert {u.speaker for u in splits.val} == {"spk0", "spk1", "spk2", "spk3"}  # stratified


def test_text_cleaner_leaves_demo_text_alone(demo_dir):
    text_mod = pytest.importorskip("myxtts.text")
    cfg = load_config()
    for line in (demo_dir / "metadata.csv").read_text().splitlines():
        text = line.split("|")[1]
        assert text_mod.clean_text(text, "en", cfg.text) == text
