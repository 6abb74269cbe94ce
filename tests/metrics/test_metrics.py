"""The metrics against the ground truth, on cases with known answers: MCD, F0 and voicing,
duration. A clip against itself scores the ceiling; a pitch moved by a known ratio costs
that ratio in cents."""

from __future__ import annotations

import math

import numpy as np
import pytest

from myxtts.config import AudioConfig
from myxtts.metrics.cepstrum import cepstrum_matrix, mcd, mel_cepstra
from myxtts.metrics.pitch import f0_errors, yin
from myxtts.metrics.truth import against_truth

SR = 22050
CFG = AudioConfig()


def voiced(f0, seconds: float = 1.5, sr: int = SR, harmonics: int = 8) -> np.ndarray:
    """A buzzy vowel: harmonics of ``f0`` (Hz, or an array of per-sample Hz) with a 1/h
    spectrum, faded in and out."""
    t = np.arange(int(seconds * sr)) / sr
    phase = 2 * np.pi * (np.cumsum(np.broadcast_to(f0, t.shape)) / sr)
    wav = sum(np.sin(h * phase) / h for h in range(1, harmonics + 1))
    fade = np.minimum(1.0, np.minimum(t, t[-1] - t) / 0.05)
    return (0.2 * wav * fade).astype(np.float32)


def gliding(seconds: float = 1.5, lo: float = 110.0, hi: float = 180.0) -> np.ndarray:
    """A vowel whose pitch rises and falls (speech-like, so frames differ along time)."""
    t = np.arange(int(seconds * SR)) / SR
    return voiced(lo + (hi - lo) * np.sin(np.pi * t / seconds) ** 2, seconds)


def test_cepstra_are_the_dct_at_the_mcd_scale():
    scipy_fft = pytest.importorskip("scipy.fft")
    x = np.random.default_rng(0).normal(size=(5, 80))
    expected = scipy_fft.dct(x, type=2, axis=-1)[:, :25] / (2 * 80)
    np.testing.assert_allclose(x @ cepstrum_matrix(80, 25), expected, rtol=1e-10, atol=1e-12)
    assert mel_cepstra(x).shape == (5, 24)


def test_mcd_is_zero_on_itself_blind_to_gain_and_its_formula_on_an_offset():
    rng = np.random.default_rng(1)
    log_mel = 3 * rng.normal(size=(40, 80))  # frames far apart: the diagonal is the best path
    cep = mel_cepstra(log_mel)
    assert mcd(cep, cep)[0] == 0.0
    assert mcd(mel_cepstra(log_mel + 2.0), cep)[0] == pytest.approx(0.0, abs=1e-9)  # c0 only
    shifted = cep.copy()
    shifted[:, 0] += 0.1  # c1 off by 0.1 in every frame
    value, pairs = mcd(shifted, cep)
    assert value == pytest.approx(10 / math.log(10) * math.sqrt(2) * 0.1, rel=1e-9)
    assert (pairs[:, 0] == pairs[:, 1]).all()


@pytest.mark.parametrize("f0", [85.0, 150.0, 260.0, 440.0])
def test_yin_finds_the_pitch_of_a_harmonic_tone(f0):
    hz, is_voiced = yin(voiced(f0), SR, 256)
    assert len(hz) == 1 + len(voiced(f0)) // 256
    assert is_voiced[5:-5].all()
    assert np.median(hz[is_voiced]) == pytest.approx(f0, rel=2e-3)


def test_yin_calls_noise_and_silence_unvoiced():
    noise = np.random.default_rng(2).normal(size=SR).astype(np.float32) * 0.1
    assert not yin(noise, SR, 256)[1].any()
    assert not yin(np.zeros(SR, np.float32), SR, 256)[1].any()


def test_a_known_pitch_ratio_costs_its_cents():
    """A semitone up is 100 cents; a fifth down 702; the same clip 0."""
    a = yin(voiced(150.0), SR, 256)
    pairs = np.stack([np.arange(len(a[0]))] * 2, axis=1)
    for ratio, cents in ((2 ** (1 / 12), 100.0), (2 / 3, 701.955)):
        b = yin(voiced(150.0 * ratio), SR, 256)
        rmse, voicing = f0_errors(*a, *b, pairs)
        assert rmse == pytest.approx(cents, abs=1.5)
        assert voicing < 0.03  # a frame of the fades may differ
    assert f0_errors(*a, *a, pairs) == (0.0, 0.0)


def test_voicing_error_counts_disagreeing_pairs_and_no_voiced_pair_is_nan():
    hz = np.full(4, 100.0)
    pairs = np.stack([np.arange(4)] * 2, axis=1)
    rmse, voicing = f0_errors(hz, np.array([1, 1, 0, 0], bool), hz, np.array([1, 0, 1, 0], bool),
                              pairs)
    assert rmse == 0.0 and voicing == 0.5
    rmse, voicing = f0_errors(hz, np.zeros(4, bool), hz, np.ones(4, bool), pairs)
    assert math.isnan(rmse) and voicing == 1.0


def test_a_clip_against_itself_scores_the_ceiling():
    clip = gliding()
    scores = against_truth(clip, clip, CFG)
    assert scores.to_dict() == {"mcd_db": 0.0, "f0_rmse_cents": 0.0, "voicing_error": 0.0,
                                "duration_ratio": 1.0}


def test_against_truth_trims_silence_and_measures_a_pitch_shift_through_the_alignment():
    def pad(wav, before_s, after_s):
        return np.concatenate([np.zeros(int(before_s * SR), np.float32), wav,
                               np.zeros(int(after_s * SR), np.float32)])

    clip = gliding()
    ratio = against_truth(pad(clip, 0.5, 1.0), pad(clip, 0.2, 0.1), CFG).duration_ratio
    assert ratio == pytest.approx(1.0, abs=0.01)
    slow = gliding(3.0)  # the same contour over twice the time (trimming keeps ~50 ms margins)
    assert 1.85 < against_truth(pad(slow, 0.3, 0.3), pad(clip, 0.3, 0.3), CFG).duration_ratio <= 2
    up = against_truth(voiced(150.0 * 2 ** (2 / 12)), voiced(150.0), CFG)
    assert up.f0_rmse_cents == pytest.approx(200.0, abs=3.0)
    assert up.mcd_db > 0.0


def test_a_silent_or_tiny_synthesis_is_scored_not_refused():
    clip = gliding()
    silent = against_truth(np.zeros(SR, np.float32), clip, CFG)
    assert math.isnan(silent.f0_rmse_cents) and silent.voicing_error > 0.5
    tiny = against_truth(np.zeros(10, np.float32), clip, CFG)
    assert tiny.duration_ratio < 0.05 and tiny.mcd_db > 0
