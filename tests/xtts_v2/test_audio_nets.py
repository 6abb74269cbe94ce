"""XTTS-v2's audio side against coqui-tts (the oracle) on the same seeded random weights: the
HiFi-GAN decoder (weight norm folded), the speaker encoder (its own features), the DVAE's
codes, the two mels and the conditioning chunks.

Tolerances (float32, CPU): the mels and the DVAE codes are compared exactly (the same
operations in the same order: PowerMel equals torchaudio bit for bit, and a code is an
argmax, where any drift could flip a near tie); the speaker embedding within 1e-5 and the
waveform within 1e-4 max abs (measured: 0 and ~5e-8 -- folding weight
norm once rounds differently from recomputing it per call).
"""

from __future__ import annotations

import pytest
import torch

from myxtts.artifacts.errors import ArtifactError
from myxtts.artifacts.xtts_v2.layout import speaker_features
from myxtts.artifacts.xtts_v2.model_file import normalise, released_state
from myxtts.artifacts.xtts_v2.weight_norm import fold_state
from myxtts.audio.io import AudioError
from myxtts.model.xtts_v2 import features
from myxtts.model.xtts_v2.config import XttsV2Args
from myxtts.model.xtts_v2.dvae import NUM_TOKENS, XttsDvae
from myxtts.model.xtts_v2.hifigan import XttsLatentDecoder, conv
from tests.xtts_v2.reference import (
    RELEASED,
    coqui,
    reference_config,
    reference_dvae,
    reference_model,
)

PREFIX = "hifigan_decoder."
TORCH_SPEC_PREFIX = PREFIX + "speaker_encoder.torch_spec."


def _decoder_state(full: dict) -> dict:
    """The loader's path for the decoder (``artifacts.xtts_v2``): fold, check and drop
    torch_spec, un-prefix."""
    state = normalise("test", {k: v for k, v in full.items() if k.startswith(PREFIX)})
    return {k[len(PREFIX):]: v for k, v in state.items()}


def _released(ours: dict) -> dict:
    """Our decoder's state in the released layout, as the writer makes it."""
    return released_state({PREFIX + k: v for k, v in ours.items()})


@pytest.fixture(scope="module")
def pair():
    """(reference Xtts at the reduced size, our decoder loaded from its state dict)."""
    coqui()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    ref = reference_model()
    ours = XttsLatentDecoder(XttsV2Args(decoder_input_dim=ref.args.decoder_input_dim)).eval()
    ours.load_state_dict(_decoder_state(ref.state_dict()), strict=True)
    yield ref, ours
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def dvae_pair():
    coqui()
    ref = reference_dvae()
    ours = XttsDvae().eval()
    ours.load_state_dict(ref.state_dict(), strict=True)  # dvae.pth as released: strict
    return ref, ours


def _audio(seconds: float, rate: int, batch: int = 1, seed: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(int(seconds * rate)) / rate
    tone = 0.3 * torch.sin(2 * torch.pi * 180.0 * t * (1 + torch.arange(batch)[:, None]))
    return tone + 0.05 * torch.randn(batch, t.numel(), generator=g)


# -- weight-norm folding and the released layout ---------------------------------------------

@pytest.mark.slow
def test_both_weight_norm_spellings_fold_alike(pair):
    ref, _ = pair
    full = ref.state_dict()
    legacy = {k.replace(".parametrizations.weight.original0", ".weight_g")
               .replace(".parametrizations.weight.original1", ".weight_v"): v for k, v in full.items()}
    new, old = _decoder_state(full), _decoder_state(legacy)
    assert new.keys() == old.keys()
    assert all(torch.equal(new[k], old[k]) for k in new)
    # the folded weight is the one the reference computes
    up = ref.hifigan_decoder.waveform_decoder.ups[1]
    torch.testing.assert_close(new["waveform_decoder.ups.1.weight"], up.weight, rtol=0, atol=1e-7)


def test_released_layout_round_trips(pair):
    ref, ours = pair
    written = _released(ours.state_dict())
    released = {k: v for k, v in ref.state_dict().items() if k.startswith(PREFIX)}
    assert {k: v.shape for k, v in written.items()} == {k: v.shape for k, v in released.items()}
    for key, value in _decoder_state(written).items():
        torch.testing.assert_close(value, ours.state_dict()[key], rtol=1e-6, atol=1e-7)


def test_torch_spec_buffers_are_the_reference_features(pair):
    ref, _ = pair
    released = {k: v for k, v in ref.state_dict().items() if k.startswith(TORCH_SPEC_PREFIX)}
    ours = speaker_features()
    assert released.keys() == ours.keys()
    assert all(torch.equal(released[k], ours[k]) for k in ours)
    bad = dict(released)
    bad[TORCH_SPEC_PREFIX + "1.mel_scale.fb"] = released[TORCH_SPEC_PREFIX + "1.mel_scale.fb"] * 1.01
    with pytest.raises(ArtifactError, match="mel_scale.fb"):
        normalise("test", bad)


def test_missing_weight_norm_half_is_one_line():
    with pytest.raises(ArtifactError, match=r"ups\.0.*original0 comes without .*original1"):
        fold_state({"waveform_decoder.ups.0.parametrizations.weight.original0": torch.ones(2, 1, 1)},
                   "test")


# -- networks ------------------------------------------------------------------------------------

def test_speaker_embedding_equals_reference(pair):
    ref, ours = pair
    audio = _audio(3.0, 16000, batch=2)
    with torch.no_grad():
        want = ref.hifigan_decoder.speaker_encoder(audio.clone(), l2_norm=True)
        got = ours.speaker_encoder(audio, l2_norm=True)
    assert got.shape == (2, 512)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert (want[0] - want[1]).abs().max() > 5e-3  # the embedding depends on the audio
    # and through the reference's entry point, from 22.05 kHz audio
    import torchaudio

    clip = _audio(2.5, 22050, seed=5)
    want = ref.get_speaker_embedding(clip, 22050)
    with torch.no_grad():
        got = ours.speaker_embedding(torchaudio.functional.resample(clip, 22050, 16000))
    assert got.shape == want.shape == (1, 512, 1)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("layout", [torch.channels_last, torch.contiguous_format])
def test_generator_convs_equal_their_1d_layers_in_either_layout(layout):
    """The generator runs each Conv1d / ConvTranspose1d as the 2-D conv over ``[B, C, 1, T]``
    (channels-last on the CPU, the usual layout elsewhere): the same as the layer itself,
    dilation, stride and padding included, and the output keeps the input's layout."""
    torch.manual_seed(0)
    layers = [torch.nn.Conv1d(8, 8, 11, dilation=5, padding=25),
              torch.nn.Conv1d(8, 4, 7, padding=3, bias=False),
              torch.nn.ConvTranspose1d(8, 4, 16, 8, padding=4)]
    x = torch.randn(2, 8, 50)
    with torch.no_grad():
        for layer in layers:
            got = conv(layer, x.unsqueeze(2).contiguous(memory_format=layout))
            assert got.is_contiguous(memory_format=layout)
            want = layer(x)
            assert got.shape == (*want.shape[:2], 1, want.shape[-1])
            torch.testing.assert_close(got.squeeze(2), want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.slow
def test_waveform_equals_reference(pair, batch):
    ref, ours = pair
    g = torch.Generator().manual_seed(11)
    latents = torch.randn(batch, 13, ref.args.decoder_input_dim, generator=g)
    emb = torch.nn.functional.normalize(torch.randn(batch, 512, 1, generator=g), dim=1)
    with torch.no_grad():
        want = ref.hifigan_decoder(latents, g=emb)
        got = ours(latents, emb)
    assert got.shape == want.shape == (batch, 1, 256 * int(int(13 * 4) * 24000 / 22050))
    assert (got - want).abs().max() <= 1e-4
    # not an output that any network would match: it depends on the latents and the speaker
    assert want.std() > 1e-3
    with torch.no_grad():
        other = ours(latents, torch.nn.functional.normalize(emb + 0.5, dim=1))
        shifted = ours(latents.roll(1, dims=1), emb)
    assert (other - got).abs().max() > 1e-3 and (shifted - got).abs().max() > 1e-3


def test_dvae_codes_identical(dvae_pair):
    ref, ours = dvae_pair
    g = torch.Generator().manual_seed(4)
    for frames in (64, 61):  # a multiple of 4 and not: the last code sees the zero padding
        mel = torch.randn(2, 80, frames, generator=g)
        want = ref.get_codebook_indices(mel)
        got = ours.codes(mel)
        assert got.shape == (2, -(-frames // 4))
        assert torch.equal(got, want)
    assert len(torch.unique(got)) > 1


def test_dvae_codes_from_audio_as_the_trainer_makes_them(pair, dvae_pair):
    from TTS.tts.layers.tortoise.arch_utils import TorchMelSpectrogram

    ref_model, _ = pair
    ref, ours = dvae_pair
    stats = ref_model.mel_stats
    trainer_mel = TorchMelSpectrogram(mel_norm_file=None, sampling_rate=22050)
    trainer_mel.mel_norms = stats
    wav = _audio(1.7, 22050, batch=2)
    want = ref.get_codebook_indices(trainer_mel(wav.unsqueeze(1)))
    got = ours.codes(features.dvae_mel(wav, stats))
    assert torch.equal(got, want)
    decoded = ours.decode(got)
    assert decoded.shape == (2, 80, 4 * got.shape[1])


# -- features ------------------------------------------------------------------------------------

def test_mels_equal_reference(pair):
    from TTS.tts.layers.xtts.dvae import dvae_wav_to_mel
    from TTS.tts.models.xtts import wav_to_mel_cloning

    ref, _ = pair
    stats = ref.mel_stats
    wav = _audio(1.3, 22050, batch=2)
    want = wav_to_mel_cloning(wav, mel_norms=stats, n_fft=2048, hop_length=256, win_length=1024,
                              power=2, normalized=False, sample_rate=22050, f_min=0, f_max=8000,
                              n_mels=80)
    assert torch.equal(features.cloning_mel(wav, stats), want)
    assert torch.equal(features.dvae_mel(wav, stats), dvae_wav_to_mel(wav, mel_norms=stats))


def _reference_chunks(ref, audio, length, chunk_length):
    """The mels the reference's get_gpt_cond_latents hands its conditioning encoder."""
    seen = []

    def record(mel, _mask):
        seen.append(mel.clone())
        return torch.zeros(1, ref.args.gpt_n_model_channels, 32)

    original = ref.gpt.get_style_emb
    ref.gpt.get_style_emb = record
    try:
        ref.get_gpt_cond_latents(audio, 22050, length=length, chunk_length=chunk_length)
    finally:
        ref.gpt.get_style_emb = original
    return seen


@pytest.mark.parametrize(("seconds", "length", "chunk"), [
    (9.2, 30, 4),  # 4 + 4 + 1.2 s
    (8.2, 30, 4),  # the last 0.2 s dropped
    (9.2, 6, 4),  # cut at 6 s: 4 + 2 s
    (5.0, -1, 6),  # all of it, one chunk
])
def test_cond_chunks_equal_reference(pair, seconds, length, chunk):
    ref, _ = pair
    audio = _audio(seconds, 22050)
    want = _reference_chunks(ref, audio, length, chunk)
    got = features.cond_mel_chunks(audio, ref.mel_stats, length=length, chunk_length=chunk)
    assert [m.shape for m in got] == [m.shape for m in want]
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_too_short_reference_audio_is_refused(pair):
    ref, _ = pair
    audio = _audio(0.3, 22050)
    with pytest.raises(RuntimeError):
        _reference_chunks(ref, audio, 30, 4)
    with pytest.raises(AudioError, match=r"too short.*0\.33 s"):
        features.cond_mel_chunks(audio, ref.mel_stats)


# -- the released size, shapes only -------------------------------------------------------------

def test_released_size_keys_and_shapes():
    coqui()
    from TTS.tts.layers.xtts.hifigan_decoder import HifiDecoder

    args = reference_config(RELEASED).model_args
    # the reference's decoder on the CPU (torchaudio's filterbank cannot be made on meta)
    ref = HifiDecoder(input_sample_rate=args.input_sample_rate,
                      output_sample_rate=args.output_sample_rate,
                      output_hop_length=args.output_hop_length,
                      ar_mel_length_compression=args.gpt_code_stride_len,
                      decoder_input_dim=args.decoder_input_dim, d_vector_dim=args.d_vector_dim,
                      cond_d_vector_in_each_upsampling_layer=args.cond_d_vector_in_each_upsampling_layer)
    with torch.device("meta"):
        ours = XttsLatentDecoder()
    assert args.decoder_input_dim == 1024
    released = {PREFIX + k: v.shape for k, v in ref.state_dict().items()}
    written = _released(ours.state_dict())
    assert {k: v.shape for k, v in written.items()} == released
    # the DVAE has one size (the fixture's is the released one, loaded strictly above) with
    # as many codes as the released GPT's audio tokens less start and stop
    assert args.gpt_num_audio_tokens - 2 == NUM_TOKENS
