"""The front ends of models trained with torchaudio (XTTS-v2's mels and resampler) equal
torchaudio's own, bit for bit, on the CPU (torchaudio is a test-only dependency)."""

from __future__ import annotations

import pytest
import torch

from myxtts.audio.power_mel import PowerMel, htk_filterbank
from myxtts.audio.sinc_resample import sinc_resample

torchaudio = pytest.importorskip("torchaudio", reason="torchaudio is the oracle of these front ends")


@pytest.mark.parametrize("old, new", [(22050, 16000), (24000, 22050), (44100, 22050),
                                      (16000, 22050), (48000, 24000)])
def test_sinc_resample_equals_torchaudio(old, new):
    audio = torch.randn(2, 3 * old // 2, generator=torch.Generator().manual_seed(old + new))
    ours = sinc_resample(audio, old, new)
    theirs = torchaudio.functional.resample(audio, old, new)
    assert ours.shape == theirs.shape
    assert torch.equal(ours, theirs)


def test_resampling_to_the_same_rate_is_the_audio_itself():
    audio = torch.randn(100)
    assert sinc_resample(audio, 16000, 16000) is audio


@pytest.mark.parametrize("kw, window, norm", [
    (dict(sample_rate=22050, n_fft=2048, win_length=1024, hop_length=256, n_mels=80, f_min=0,
          f_max=8000), "hann", "slaney"),  # XTTS-v2's cloning mel
    (dict(sample_rate=22050, n_fft=1024, win_length=1024, hop_length=256, n_mels=80, f_min=0,
          f_max=8000), "hann", "slaney"),  # its DVAE's mel
    (dict(sample_rate=16000, n_fft=512, win_length=400, hop_length=160, n_mels=64),
     "hamming", None),  # its speaker encoder's
])
def test_power_mel_equals_torchaudio(kw, window, norm):
    audio = torch.randn(2, kw["sample_rate"], generator=torch.Generator().manual_seed(3)) * 0.3
    ours = PowerMel(**kw, window=window, slaney_norm=norm is not None)(audio)
    make = {"hann": torch.hann_window, "hamming": torch.hamming_window}[window]
    theirs = torchaudio.transforms.MelSpectrogram(**kw, power=2.0, norm=norm, window_fn=make)(audio)
    assert ours.shape == theirs.shape == (2, kw["n_mels"], 1 + kw["sample_rate"] // kw["hop_length"])
    assert torch.equal(ours, theirs)


def test_the_filterbank_is_torchaudios_and_not_the_slaney_scale():
    ours = htk_filterbank(16000, 512, 64, slaney_norm=False)
    theirs = torchaudio.functional.melscale_fbanks(257, 0.0, 8000.0, 64, 16000, None, "htk")
    assert torch.equal(ours, theirs)
    slaney_scale = torchaudio.functional.melscale_fbanks(257, 0.0, 8000.0, 64, 16000, None, "slaney")
    assert not torch.allclose(ours, slaney_scale)
