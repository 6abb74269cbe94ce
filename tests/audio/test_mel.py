"""Log-mel features: librosa equivalence, per-clip reflect padding in padded batches, shapes."""


import numpy as np
import pytest
import soundfile as sf
import torch

from myxtts.audio.frames import n_frames_for
from myxtts.audio.mel import (
    MelSpectrogram,
    compute_mel,
    mel_filterbank,
    reflect_pad,
)
from myxtts.config import AudioConfig
from tests.helpers import LJSPEECH_MINI

librosa = pytest.importorskip("librosa")

LJSPEECH = LJSPEECH_MINI


def _ljspeech_clips(n: int) -> list[np.ndarray]:
    wavs = sorted((LJSPEECH / "wavs").glob("*.wav"))[:n] if (LJSPEECH / "wavs").is_dir() else []
    if not wavs:
        pytest.skip(f"LJSpeech mini clips not found at {LJSPEECH} (set MYXTTS_LJSPEECH_MINI)")
    out = []
    for w in wavs:
        y, sr = sf.read(w, dtype="float32")
        assert sr == 22050
        out.append(y)
    return out


def _chirp_plus_noise(n_samples: int = 22050 * 2, sr: int = 22050, seed: int = 0) -> np.ndarray:
    t = np.arange(n_samples) / sr
    f0, f1 = 60.0, 9000.0  # sweeps across (and past) the mel range
    phase = 2 * np.pi * (f0 * t + (f1 - f0) * t**2 / (2 * t[-1]))
    noise = np.random.default_rng(seed).standard_normal(n_samples)
    return (0.5 * np.sin(phase) + 0.05 * noise).astype(np.float32)


def _librosa_mel(y: np.ndarray, cfg: AudioConfig) -> np.ndarray:
    """Reference linear mel magnitude, transposed to our time-major [F, n_mels]."""
    return librosa.feature.melspectrogram(
        y=y, sr=cfg.sample_rate, n_fft=cfg.n_fft, hop_length=cfg.hop_length,
        win_length=cfg.win_length, center=True, pad_mode="reflect", power=1.0,
        n_mels=cfg.n_mels, fmin=cfg.fmin, fmax=cfg.fmax, htk=False, norm="slaney").T


def _assert_matches_librosa(y: np.ndarray, cfg: AudioConfig) -> None:
    module = MelSpectrogram(cfg)
    with torch.no_grad():
        mag, n_frames = module.magnitude(torch.from_numpy(y)[None])
    ours = mag[0].numpy()
    ref = _librosa_mel(y, cfg)
    assert ours.shape == ref.shape == (1 + len(y) // cfg.hop_length, cfg.n_mels)
    assert int(n_frames[0]) == ref.shape[0]
    rel = np.linalg.norm(ours - ref) / np.linalg.norm(ref)
    assert rel < 1e-4, rel
    log_ours = compute_mel(y, cfg)
    loud = ref > 1e-3
    assert loud.mean() > 0.2  # the comparison covers a real share of the bins
    assert np.abs(log_ours[loud] - np.log(ref[loud])).max() < 5e-4
    floor = ref < cfg.log_floor * 0.5
    assert np.all(log_ours[floor] == pytest.approx(np.log(cfg.log_floor), abs=1e-5))


@pytest.mark.parametrize("kw", [
    {},
    dict(sample_rate=16000, n_fft=512, hop_length=128, win_length=400, n_mels=64, fmin=55.0,
         fmax=7600.0),
    dict(sample_rate=24000, n_fft=1024, hop_length=256, win_length=1024, n_mels=100, fmax=12000.0),
])
def test_filterbank_matches_librosa(kw):
    cfg = AudioConfig(**kw)
    ours = mel_filterbank(cfg)
    assert ours.dtype == torch.float32 and ours.shape == (cfg.n_fft // 2 + 1, cfg.n_mels)
    ref = librosa.filters.mel(sr=cfg.sample_rate, n_fft=cfg.n_fft, n_mels=cfg.n_mels,
                              fmin=cfg.fmin, fmax=cfg.fmax, htk=False, norm="slaney")
    np.testing.assert_allclose(ours.numpy().T, ref, rtol=1e-5, atol=1e-7 * ref.max())
    assert (ours.sum(0) > 0).all()  # no empty band


def test_mel_matches_librosa_on_speech():
    cfg = AudioConfig()
    for y in _ljspeech_clips(3):
        _assert_matches_librosa(y, cfg)


@pytest.mark.parametrize("kw", [{}, dict(win_length=800, hop_length=200)])
def test_mel_matches_librosa_on_chirp_and_noise(kw):
    _assert_matches_librosa(_chirp_plus_noise(), AudioConfig(**kw))


@pytest.mark.filterwarnings("ignore:n_fft=1024 is too large")
@pytest.mark.parametrize("n_samples", [700, 300])
def test_short_clip_matches_librosa_reflect(n_samples):
    # Shorter than n_fft. 300 samples is shorter than the 512-sample pad itself, so it needs
    # repeated reflection (numpy does it, torch.stft's own padding refuses): our map must too.
    _assert_matches_librosa(_chirp_plus_noise(n_samples, seed=1), AudioConfig())


def test_reflect_pad_equals_numpy_reflect_per_clip():
    n_samples, pad = 1000, 512
    lengths = [1, 2, 3, 5, 300, 513, 1000]
    rng = np.random.default_rng(2)
    batch = torch.from_numpy(rng.standard_normal((len(lengths), n_samples)).astype(np.float32))
    padded = reflect_pad(batch, torch.tensor(lengths), pad)
    assert padded.shape == (len(lengths), n_samples + 2 * pad)
    for i, n in enumerate(lengths):
        expected = np.pad(batch[i, :n].numpy(), pad, mode="reflect")
        np.testing.assert_array_equal(padded[i, : n + 2 * pad].numpy(), expected)


def test_padded_batch_gives_each_clips_own_frames():
    cfg = AudioConfig()
    module = MelSpectrogram(cfg)
    lengths = [22050, 12345, 5000, 777, 300, 256, 1]
    rng = np.random.default_rng(3)
    clips = [rng.standard_normal(n).astype(np.float32) * 0.3 for n in lengths]
    batch = torch.zeros(len(clips), max(lengths))
    for i, c in enumerate(clips):
        batch[i, : len(c)] = torch.from_numpy(c)
        batch[i, len(c):] = 0.7  # junk in the padding must not leak into any frame
    with torch.no_grad():
        log_mel, n_frames = module(batch, torch.tensor(lengths))
    assert log_mel.shape == (len(clips), 1 + max(lengths) // cfg.hop_length, cfg.n_mels)
    assert n_frames.tolist() == [1 + n // cfg.hop_length for n in lengths]
    for i, c in enumerate(clips):
        alone, n_alone = module(torch.from_numpy(c))
        assert int(n_alone) == n_frames[i] == alone.shape[0]
        torch.testing.assert_close(log_mel[i, : n_frames[i]], alone, rtol=1e-5, atol=1e-5)
        assert torch.all(log_mel[i, n_frames[i]:] == 0.0)  # padding frames are exactly 0.0


def test_shapes_and_frame_counts():
    cfg = AudioConfig()
    module = MelSpectrogram(cfg)
    for n in [1, 255, 256, 257, 1024, 22050]:
        wav = torch.randn(n) * 0.1
        log_mel, n_frames = module(wav)
        assert log_mel.shape == (1 + n // 256, 80) and log_mel.dtype == torch.float32
        assert n_frames.dim() == 0 and int(n_frames) == 1 + n // 256 == n_frames_for(n, cfg)
        out = compute_mel(wav.numpy(), cfg)
        assert isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == (1 + n // 256, 80)
    log_mel, n_frames = module(torch.randn(3, 1000))  # no lengths: every clip is full length
    assert log_mel.shape == (3, 4, 80) and n_frames.tolist() == [4, 4, 4]
    with pytest.raises(ValueError, match="wav"):
        module(torch.randn(2, 3, 100))


def test_log_floor_and_silence():
    cfg = AudioConfig(log_floor=1e-4)
    out = compute_mel(np.zeros(2048, dtype=np.float32), cfg)
    assert np.allclose(out, np.log(1e-4))


def test_module_buffers_precision_and_grad_free():
    cfg = AudioConfig()
    module = MelSpectrogram(cfg)
    assert module.state_dict() == {}  # window/filterbank rebuilt from config, never checkpointed
    assert {n for n, _ in module.named_buffers()} == {"window", "mel_basis"}
    wav = torch.from_numpy(_chirp_plus_noise(8000))
    ref, _ = module(wav)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # features never depend on caller precision
        auto, _ = module(wav)
    half, _ = module(wav.to(torch.bfloat16))
    assert auto.dtype == torch.float32 and torch.equal(auto, ref)
    assert half.dtype == torch.float32
    assert not ref.requires_grad


@pytest.mark.gpu
@pytest.mark.parametrize("tf32", [False, True])
def test_cpu_and_cuda_agree(tf32):
    """Also with TF32 matrix products allowed, as training allows them process-wide."""
    cfg = AudioConfig()
    module = MelSpectrogram(cfg)
    lengths = torch.tensor([20000, 7000, 300])
    batch = torch.randn(3, 20000) * 0.2
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        with torch.no_grad():
            cpu, n_cpu = module(batch, lengths)
            gpu, n_gpu = module.to("cuda")(batch.cuda(), lengths.cuda())
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    assert gpu.device.type == "cuda" and torch.equal(n_cpu, n_gpu.cpu())
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-4, atol=1e-4)


def test_fast_paths_equal_the_plain_formula():
    # CPU inference takes shortcuts (numpy complex abs, banded filterbank skipping exact
    # zeros, mirror-copy padding); autograd/GPU take the plain torch path. Both must give
    # |STFT| @ mel_basis, for a default and an unusual configuration.
    for cfg in (AudioConfig(), AudioConfig(sample_rate=16000, n_fft=512, hop_length=128,
                                           win_length=400, n_mels=64, fmin=55.0, fmax=7600.0)):
        module = MelSpectrogram(cfg)
        wav = torch.from_numpy(_chirp_plus_noise(9000, sr=cfg.sample_rate, seed=4))[None]
        padded = torch.from_numpy(np.pad(wav[0].numpy(), cfg.n_fft // 2, mode="reflect"))
        spec = torch.stft(padded, cfg.n_fft, cfg.hop_length, cfg.win_length, module.window,
                          center=False, return_complex=True)  # [n_freqs, F]
        plain = spec.abs().T @ module.mel_basis  # [F, n_mels]
        with torch.no_grad():
            fast, _ = module.magnitude(wav)
        graph, _ = module.magnitude(wav.clone().requires_grad_(True))
        assert graph.requires_grad  # the autograd path really ran
        torch.testing.assert_close(fast[0], plain, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(graph[0].detach(), plain, rtol=1e-5, atol=1e-6)
        assert module.n_used_freqs < cfg.n_fft // 2 + 1  # bins above fmax are skipped ...
        assert torch.all(module.mel_basis[module.n_used_freqs:] == 0)  # ... and weigh nothing
