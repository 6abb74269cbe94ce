"""Audio loading/saving: mono mix, resampling, trimming, loudness, and one-line errors for bad clips."""

import io

import numpy as np
import pytest
import soundfile as sf
import torch

from myxtts.audio import (
    AudioError,
    audio_info,
    load_audio,
    normalize_loudness,
    save_wav,
    trim_silence,
)
from myxtts.config import AudioConfig
from tests.helpers import LJSPEECH_MINI

RAW = AudioConfig(trim_silence=False, normalize_loudness=False)  # load untouched (rate aside)


def _sine(freq_hz: float, duration_s: float, sr: int, amp: float = 0.5) -> np.ndarray:
    t = np.arange(round(duration_s * sr)) / sr
    return (amp * np.sin(2 * np.pi * freq_hz * t)).astype(np.float32)


def _dominant_hz(wav: np.ndarray, sr: int) -> float:
    spectrum = np.abs(np.fft.rfft(wav * np.hanning(len(wav))))
    return float(np.fft.rfftfreq(len(wav), 1 / sr)[np.argmax(spectrum)])


def _rms_dbfs(wav: np.ndarray) -> float:
    return 20 * np.log10(np.sqrt(np.mean(np.square(wav, dtype=np.float64))))


# ---------------------------------------------------------------- loading


@pytest.mark.parametrize("fmt,ext,tol", [("WAV", "wav", 1e-4), ("FLAC", "flac", 1e-4),
                                         ("OGG", "ogg", 0.05)])
def test_stereo_is_mixed_to_mono(tmp_path, fmt, ext, tol):
    sr = 22050
    left, right = _sine(300, 1.0, sr, 0.4), _sine(300, 1.0, sr, 0.2)
    path = tmp_path / f"stereo.{ext}"
    sf.write(path, np.stack([left, right], axis=1), sr, format=fmt)
    wav = load_audio(path, RAW)
    assert wav.dtype == np.float32 and wav.ndim == 1 and len(wav) == len(left)
    mid = slice(2000, -2000)  # away from codec edge effects
    assert np.abs(wav[mid] - 0.5 * (left + right)[mid]).max() < tol


def test_resample_16k_to_22050_keeps_length_and_pitch(tmp_path):
    path = tmp_path / "sine16k.wav"
    sf.write(path, _sine(440, 1.0, 16000), 16000, subtype="FLOAT")
    wav = load_audio(path, RAW)
    assert len(wav) == 22050
    assert abs(_dominant_hz(wav, 22050) - 440) < 2.0
    assert abs(_rms_dbfs(wav) - _rms_dbfs(_sine(440, 1.0, 22050))) < 0.1  # level kept


def test_other_rate_without_resampling_is_an_error_with_the_fix(tmp_path):
    path = tmp_path / "clip16k.wav"
    sf.write(path, _sine(440, 0.5, 16000), 16000)
    with pytest.raises(AudioError) as e:
        load_audio(path, AudioConfig(resample=False))
    msg = str(e.value)
    for part in ("clip16k.wav", "16000", "22050", "--set audio.resample=true", "resample the data"):
        assert part in msg
    assert "\n" not in msg


def test_trim_removes_leading_and_trailing_silence(tmp_path):
    sr = 22050
    rng = np.random.default_rng(0)
    hiss = (rng.standard_normal(sr // 2) * 1e-4).astype(np.float32)  # -80 dB: "silence"
    tone = _sine(500, 1.0, sr)
    path = tmp_path / "padded.wav"
    sf.write(path, np.concatenate([hiss, tone, hiss]), sr, subtype="FLOAT")
    wav = load_audio(path, AudioConfig(trim_silence=True))
    margin = round(0.05 * sr)
    assert len(tone) + 2 * margin - 200 <= len(wav) <= len(tone) + 2 * margin + round(0.03 * sr)
    # the tone itself is intact: its first sample sits ~margin into the trimmed clip
    onset = int(np.flatnonzero(np.abs(wav) > 0.01)[0])
    assert margin - round(0.015 * sr) <= onset <= margin + round(0.015 * sr)
    # a clip without silence is left alone
    assert len(trim_silence(tone, sr, 40.0)) == len(tone)
    # trim_db is relative to the clip's peak: a quiet but clean clip is kept whole
    assert len(trim_silence(tone * 1e-2, sr, 40.0)) == len(tone)


@pytest.mark.parametrize("subtype", ["PCM_16", "FLOAT"])
def test_a_plain_clips_span_reads_back_the_same_samples(tmp_path, subtype):
    from myxtts.audio.io import load_audio_span, read_span

    sr = 22050
    hiss = (np.random.default_rng(1).standard_normal(sr // 2) * 1e-4).astype(np.float32)
    path = tmp_path / "padded.wav"
    sf.write(path, np.concatenate([hiss, _sine(300, 1.0, sr), hiss]), sr, subtype=subtype)
    cfg = AudioConfig(trim_silence=True)
    wav, (start, stop) = load_audio_span(path, cfg)
    assert start > 0 and stop - start == len(wav)
    np.testing.assert_array_equal(wav, load_audio(path, cfg))
    np.testing.assert_array_equal(read_span(path, start + 100, start + 5000), wav[100:5000])
    # not a plain slice of the file: resampled, mixed from two channels, levelled
    sf.write(tmp_path / "16k.wav", _sine(300, 1.0, 16000), 16000)
    assert load_audio_span(tmp_path / "16k.wav", cfg)[1] is None
    sf.write(tmp_path / "two.wav", np.stack([_sine(300, 1.0, sr)] * 2, 1), sr)
    assert load_audio_span(tmp_path / "two.wav", cfg)[1] is None
    assert load_audio_span(path, AudioConfig(normalize_loudness=True))[1] is None
    with pytest.raises(AudioError, match="changed while in use"):
        read_span(path, len(hiss) * 2 + sr - 10, len(hiss) * 2 + sr + 10)  # past its end


def test_loudness_normalisation_hits_target_and_never_clips(tmp_path):
    sr = 22050
    path = tmp_path / "quiet.wav"
    sf.write(path, _sine(220, 1.0, sr, amp=0.01), sr, subtype="FLOAT")
    wav = load_audio(path, AudioConfig(trim_silence=False, normalize_loudness=True, target_dbfs=-24.0))
    assert abs(_rms_dbfs(wav) - (-24.0)) < 0.01
    # a spiky clip cannot reach -3 dBFS RMS without clipping: the gain stops at the peak ceiling
    spiky = np.zeros(sr, dtype=np.float32)
    spiky[::1000] = 0.5
    out = normalize_loudness(spiky, -3.0)
    assert 0.98 <= np.abs(out).max() <= 0.99 + 1e-6
    assert _rms_dbfs(out) < -3.0
    assert np.array_equal(normalize_loudness(np.zeros(10, np.float32), -20.0), np.zeros(10))


def test_real_speech_loads(tmp_path):
    root = LJSPEECH_MINI
    wavs = sorted((root / "wavs").glob("*.wav"))[:2] if (root / "wavs").is_dir() else []
    if not wavs:
        pytest.skip(f"LJSpeech mini clips not found at {root}")
    for w in wavs:
        info = audio_info(w)
        raw = load_audio(w, RAW)
        trimmed = load_audio(w, AudioConfig())
        assert info.sample_rate == 22050 and info.channels == 1 and len(raw) == info.n_samples
        assert 0.5 * len(raw) < len(trimmed) <= len(raw)


# ---------------------------------------------------------------- info and saving


def test_audio_info_reads_the_header(tmp_path):
    path = tmp_path / "info.flac"
    sf.write(path, np.zeros((16000 * 2, 2), dtype=np.float32) + 0.1, 16000)
    info = audio_info(path)
    assert info == (16000, 32000, 2, 2.0)
    assert info.duration_s == 2.0 and info.channels == 2


def test_save_wav_round_trip_clips_and_is_atomic(tmp_path):
    path = tmp_path / "out" / "synth.wav"
    wav = np.array([0.0, 0.5, -0.5, 2.0, -3.0, np.nan], dtype=np.float32)
    save_wav(path, wav, 22050)
    assert sf.info(path).subtype == "PCM_16" and sf.info(path).samplerate == 22050
    back, _ = sf.read(path, dtype="float32")
    np.testing.assert_allclose(back, [0.0, 0.5, -0.5, 32767 / 32768, -1.0, 0.0], atol=1 / 32768)
    save_wav(path, torch.full((100,), 0.25), 16000)  # torch input, overwrite in place
    assert audio_info(path) == (16000, 100, 1, 100 / 16000)
    assert sorted(p.name for p in path.parent.iterdir()) == ["synth.wav"]  # no temp files left


# ---------------------------------------------------------------- bad input


def _valid_wav_bytes(n: int = 2205, subtype: str = "PCM_16") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, _sine(440, n / 22050, 22050), 22050, format="WAV", subtype=subtype)
    return buf.getvalue()


def _write_float_wav(path, value: float) -> None:
    wav = _sine(440, 0.2, 22050)
    wav[100:110] = value
    sf.write(path, wav, 22050, subtype="FLOAT")


BAD_CLIPS = {
    "missing.wav": None,
    "random_bytes.wav": lambda p: p.write_bytes(np.random.default_rng(0).bytes(4000)),
    "empty_file.wav": lambda p: p.write_bytes(b""),
    "truncated_header.wav": lambda p: p.write_bytes(_valid_wav_bytes()[:20]),
    "zero_length.wav": lambda p: sf.write(p, np.zeros(0, np.float32), 22050),
    "has_nan.wav": lambda p: _write_float_wav(p, np.nan),
    "has_inf.wav": lambda p: _write_float_wav(p, np.inf),
    "all_zero.wav": lambda p: sf.write(p, np.zeros(22050, np.float32), 22050),
    "near_silent.wav": lambda p: sf.write(
        p, (np.random.default_rng(1).standard_normal(22050) * 1e-5).astype(np.float32), 22050,
        subtype="FLOAT"),
    "a_folder.wav": lambda p: p.mkdir(),
}
EXPECTED_WORDS = {
    "missing.wav": "does not exist", "random_bytes.wav": "cannot decode",
    "empty_file.wav": "cannot decode", "truncated_header.wav": "cannot decode",
    "zero_length.wav": "zero samples", "has_nan.wav": "NaN or infinite",
    "has_inf.wav": "NaN or infinite", "all_zero.wav": "silent", "near_silent.wav": "silent",
    "a_folder.wav": "not a file",
}


@pytest.mark.parametrize("name", sorted(BAD_CLIPS))
@pytest.mark.parametrize("trim", [True, False])
def test_bad_clips_raise_one_line_audio_error_naming_the_file(tmp_path, name, trim):
    path = tmp_path / name
    if BAD_CLIPS[name] is not None:
        BAD_CLIPS[name](path)
    with pytest.raises(AudioError) as e:
        load_audio(path, AudioConfig(trim_silence=trim, normalize_loudness=True))
    msg = str(e.value)
    assert name in msg and EXPECTED_WORDS[name] in msg
    assert "\n" not in msg and ";" in msg  # one line: what is wrong; what to do


@pytest.mark.parametrize("name", ["missing.wav", "random_bytes.wav", "truncated_header.wav"])
def test_audio_info_errors_name_the_file(tmp_path, name):
    path = tmp_path / name
    if BAD_CLIPS[name] is not None:
        BAD_CLIPS[name](path)
    with pytest.raises(AudioError, match=name):
        audio_info(path)


def test_audio_error_is_printed_as_a_cli_user_error():
    from myxtts.cli.main import _user_errors

    assert AudioError in _user_errors()


@pytest.mark.parametrize("frame_length,hop_length", [(441, 110), (320, 80), (100, 100), (7, 3)])
def test_frame_rms_db_equals_per_frame_mean_square(frame_length, hop_length):
    from myxtts.audio.processing import frame_rms_db

    rng = np.random.default_rng(5)
    for n in (1, 2, frame_length - 1, frame_length, frame_length + 1, 5 * hop_length + 3, 4000):
        wav = (rng.standard_normal(n) * rng.uniform(1e-3, 1.0)).astype(np.float32)
        n_frames = 1 + max(0, -(-(n - frame_length) // hop_length))
        padded = np.concatenate([wav.astype(np.float64), np.zeros(frame_length + hop_length)])
        expected = [10 * np.log10(max(np.mean(padded[i * hop_length:i * hop_length + frame_length] ** 2),
                                      1e-20)) for i in range(n_frames)]
        np.testing.assert_allclose(frame_rms_db(wav, frame_length, hop_length), expected,
                                   rtol=0, atol=1e-4)


@pytest.mark.skipif(not sf.__libsndfile_version__.startswith("1.2"),
                    reason="the rule is libsndfile 1.2's")
def test_to_pcm16_is_what_libsndfile_writes_and_clips_and_silences():
    from myxtts.audio.io import to_pcm16

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-1, 1, 50000), rng.normal(0, 1e-3, 50000),
                        (np.arange(-3000, 3000) + 0.5) / 32768, [1.0, -1.0, 0.0]]).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, x, 22050, format="WAV", subtype="PCM_16")  # libsndfile's own conversion
    buf.seek(0)
    assert np.array_equal(to_pcm16(x), sf.read(buf, dtype="int16")[0])
    edge = to_pcm16(np.array([2.0, -3.0, np.nan, np.inf, -np.inf, 0.5, -0.5], np.float32))
    assert edge.tolist() == [32767, -32768, 0, 32767, -32768, 16384, -16384]
