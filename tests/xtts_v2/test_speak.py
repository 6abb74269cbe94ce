"""XTTS-v2 speaking end to end, against coqui-tts on the same seeded weights (reduced size):
the folder as downloaded -> voice from a reference file -> greedy codes -> 24 kHz waveform,
equal to the reference's ``inference``; streaming equal to the reference's chunk
arithmetic; the bundle and the re-exported folder speak the same; the command line."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf
import torch

from myxtts.inference.errors import SynthesisError
from myxtts.inference.xtts_v2.decode import generate_codes
from tests.xtts_v2.reference import fix_reference_generation, load_reference

TEXT = "Hello world, how are you today?"
CODES = 24
pytestmark = pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")


@pytest.fixture(scope="module")
def folder(reduced_folder):
    torch.set_num_threads(1)
    return reduced_folder


@pytest.fixture(scope="module")
def ref(folder):
    model = load_reference(folder)
    fix_reference_generation(model)
    return model


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    """A voiced 16-bit reference clip at 16 kHz (resampled on both sides to 22050 Hz)."""
    t = np.arange(16000 * 5) / 16000
    f0 = 120 + 20 * np.sin(2 * np.pi * 0.5 * t)
    wav = 0.3 * np.sin(2 * np.pi * np.cumsum(f0) / 16000) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
    wav += 0.01 * np.random.default_rng(0).standard_normal(t.size)
    path = tmp_path_factory.mktemp("ref") / "ref.wav"
    sf.write(path, wav.astype(np.float32), 16000, subtype="PCM_16")
    return path


@pytest.fixture(scope="module")
def synth(folder):
    from myxtts.inference.xtts_v2.synthesizer import XttsV2Synthesizer

    s = XttsV2Synthesizer.from_path(folder, device="cpu")
    s.with_decoding(greedy=True, max_codes=CODES)
    return s


def _reference_voice(ref, clip):
    """The reference's voice from the clip as tensors (its ``load_audio`` is torchaudio.load,
    which the oracle's pure-Python torchaudio lacks: the same steps on tensors)."""
    import torchaudio

    wav, sr = sf.read(str(clip), dtype="float32", always_2d=True)
    audio = torchaudio.functional.resample(torch.from_numpy(wav.mean(axis=1))[None], sr, 22050)
    audio = audio.clip(-1, 1)[:, :22050 * ref.config.max_ref_len]
    latents = ref.get_gpt_cond_latents(audio, 22050, length=ref.config.gpt_cond_len,
                                       chunk_length=ref.config.gpt_cond_chunk_len)
    return latents, ref.get_speaker_embedding(audio, 22050)


def _reference_say(ref, latents, embedding, text=TEXT):
    with torch.no_grad():
        return ref.inference(text, "en", latents, embedding, do_sample=False,
                             repetition_penalty=ref.config.repetition_penalty,
                             max_new_tokens=CODES)["wav"]


@pytest.mark.slow
def test_voice_from_a_file_equals_the_reference(ref, synth, clip):
    latents, embedding = _reference_voice(ref, clip)
    voice = synth.voice([clip])
    assert voice.latents.shape == latents.shape == (1, 32, 256)
    torch.testing.assert_close(voice.latents, latents, rtol=0, atol=1e-5)
    torch.testing.assert_close(voice.speaker, embedding, rtol=0, atol=1e-5)
    other = synth.voice([clip, clip])  # two clips: embeddings averaged, audio joined
    torch.testing.assert_close(other.speaker, voice.speaker, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_greedy_codes_and_waveform_equal_the_reference(ref, synth, clip):
    latents, embedding = _reference_voice(ref, clip)
    voice = synth.voice([clip])
    expected = _reference_say(ref, latents, embedding)
    tokens = synth.tokens(TEXT, "en")
    ref_tokens = torch.IntTensor(ref.tokenizer.encode(TEXT.strip().lower(), lang="en"))[None]
    assert torch.equal(tokens.int(), ref_tokens)
    with torch.no_grad():
        codes = generate_codes(synth.model.gpt, voice.latents, tokens,
                               synth.decoding.sampling, greedy=True, max_codes=CODES)
        ref_codes = ref.gpt.generate(latents, ref_tokens, do_sample=False, num_beams=1,
                                     repetition_penalty=ref.config.repetition_penalty,
                                     max_new_tokens=CODES)
    assert torch.equal(codes, ref_codes)
    wav, unstopped = synth.say(TEXT, voice, "en")
    assert wav.shape == expected.shape and wav.dtype == np.float32
    assert np.abs(wav - expected).max() < 1e-4
    assert np.abs(wav).max() > 1e-3  # not a silent pass
    assert unstopped == (not bool((codes == synth.model.gpt.stop_audio_token).any()))
    again, _ = synth.say(TEXT, voice, "en")
    assert np.array_equal(wav, again)  # greedy: the same audio every time


@pytest.mark.slow
def test_streaming_equals_the_reference_chunk_arithmetic_on_full_decodes(synth, clip):
    """Ours decodes only a window per chunk; the reference decodes everything so far each
    time and cuts with its ``handle_chunks``. The same latents through both: equal."""
    from TTS.tts.models.xtts import Xtts

    from myxtts.inference.xtts_v2.decode import stream_codes

    voice = synth.voice([clip])
    chunks = list(synth.stream(TEXT, voice, "en", codes_per_chunk=5))
    tokens = synth.tokens(TEXT, "en")
    got = [h for _, h in stream_codes(synth.model.gpt, voice.latents, tokens,
                                      synth.decoding.sampling, greedy=True, max_codes=CODES)]
    expected, prev, overlap = [], None, None
    for end in [*range(5, len(got), 5), len(got)]:
        with torch.no_grad():
            full = synth.model.waveform(torch.stack(got[:end], dim=1), voice.speaker)[0]
        final = end == len(got)
        chunk, prev, overlap = Xtts.handle_chunks(None, full, prev, overlap, 1024, is_final=final)
        expected.append(chunk.numpy())
    assert len(chunks) == len(expected) == -(-CODES // 5)
    for ours_chunk, ref_chunk in zip(chunks, expected):
        assert ours_chunk.shape == ref_chunk.shape
        assert np.abs(ours_chunk - ref_chunk).max() < 1e-5


def test_stored_speakers_and_one_line_errors(synth, folder):
    stored = torch.load(folder / "speakers_xtts.pth", weights_only=True)
    voice = synth.speaker("Ana Florence")
    assert torch.equal(voice.latents, stored["Ana Florence"]["gpt_cond_latent"])
    with pytest.raises(SynthesisError, match="not a voice of .*Ana Florence"):
        synth.speaker("Nobody")
    with pytest.raises(SynthesisError, match="supported: en, es"):
        synth.say(TEXT, voice, "fa")
    with pytest.raises(SynthesisError, match="needs the text's language"):
        synth.language(None)


def test_long_text_is_split_within_the_language_limit(synth):
    text = " ".join(["This is a sentence of a long text, spoken in pieces."] * 12)
    pieces = synth.pieces(text, "en")
    assert len(pieces) > 1 and all(len(p) <= synth.tokenizer.char_limit("en") for p in pieces)
    assert " ".join(pieces).split() == text.split()


@pytest.mark.slow
def test_bundle_and_reexported_folder_speak_the_same(ref, synth, folder, clip, tmp_path):
    from myxtts.artifacts.xtts_v2 import read_xtts_v2, write_xtts_v2, write_xtts_v2_bundle
    from myxtts.inference.xtts_v2.synthesizer import XttsV2Synthesizer

    # without the DVAE (200 MB here, not used to speak): the file is written and hashed faster
    files = dataclasses.replace(read_xtts_v2(folder), dvae=None)
    write_xtts_v2_bundle(tmp_path / "xtts.safetensors", files)
    bundled = XttsV2Synthesizer.from_path(tmp_path / "xtts.safetensors", device="cpu")
    bundled.with_decoding(greedy=True, max_codes=CODES)
    voice = synth.voice([clip])
    wav, _ = synth.say(TEXT, voice, "en")
    assert np.array_equal(bundled.say(TEXT, bundled.voice([clip]), "en")[0], wav)
    write_xtts_v2(tmp_path / "exported", files)
    again = load_reference(tmp_path / "exported")
    fix_reference_generation(again)
    latents, embedding = _reference_voice(again, clip)
    assert np.abs(_reference_say(again, latents, embedding) - wav).max() < 1e-4


@pytest.mark.slow
def test_the_command_line_speaks_greedily_and_refuses_what_it_cannot(folder, clip, tmp_path, synth):
    out = tmp_path / "out.wav"
    cmd = [sys.executable, "-m", "myxtts.cli.main", "synthesize", "-c", str(folder), "-t", TEXT,
           "-r", str(clip), "--language", "en", "--greedy", "--max-codes", str(CODES),
           "--device", "cpu", "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    wav, sr = sf.read(out, dtype="float32")
    assert sr == 24000
    expected, _ = synth.say(TEXT, synth.voice([clip]), "en")
    assert wav.shape == expected.shape and np.abs(wav - expected).max() < 2 / 32768
    for extra, message in ((["--language", "fa"], "supported: en"),
                           (["--speaker", "Nobody"], "give --reference or --speaker, not both")):
        r = subprocess.run(cmd[:-2] + extra + ["-o", str(tmp_path / "x.wav")],
                           capture_output=True, text=True)
        assert r.returncode != 0 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1
    no_language = [a for a in cmd if a not in ("--language", "en")]
    r = subprocess.run(no_language, capture_output=True, text=True)
    assert r.returncode != 0 and "needs the text's language: pass --language" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_bfloat16_gpt_speaks_with_the_float32_decoder_and_voice(folder, clip):
    """--dtype bfloat16: the GPT's weights and cache in bfloat16, the voice and the HiFi-GAN
    in float32; the audio is real audio of the same kind (codes may differ from float32's)."""
    from myxtts.inference.xtts_v2.synthesizer import XttsV2Synthesizer

    half = XttsV2Synthesizer.from_path(folder, device="cpu", dtype="bfloat16")
    half.with_decoding(greedy=True, max_codes=CODES)
    assert {p.dtype for p in half.model.gpt.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in half.model.hifigan_decoder.parameters()} == {torch.float32}
    voice = half.voice([clip])
    assert voice.latents.dtype == voice.speaker.dtype == torch.float32
    wav, _ = half.say(TEXT, voice, "en")
    assert wav.dtype == np.float32 and np.isfinite(wav).all() and np.abs(wav).max() > 1e-3
    chunks = list(half.stream(TEXT, voice, "en"))
    assert sum(c.size for c in chunks) > 0 and all(np.isfinite(c).all() for c in chunks)
    with pytest.raises(SynthesisError, match="--dtype float16: give one of float32, bfloat16"):
        XttsV2Synthesizer.from_path(folder, device="cpu", dtype="float16")
