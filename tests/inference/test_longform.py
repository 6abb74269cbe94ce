"""Long-form, streaming and cloning options of synthesis: nothing cut, streams equal the
whole, several references average."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import soundfile as sf
import torch

from myxtts.audio.io import to_pcm16
from myxtts.cli.main import main
from myxtts.config import load_config
from myxtts.inference import longform
from myxtts.inference.errors import SynthesisError
from myxtts.inference.synthesizer import Synthesizer
from myxtts.model.vocoder.generator import VocosGenerator

pytestmark = pytest.mark.usefixtures("one_thread")
PARAGRAPH = ("lamo tesi kunapo. miresu fato. kali mo tesi, pana lumi sotu kanefa! "
             "memo tarisu pekafo nilo. sumati kelo rapina.")


@pytest.fixture(scope="module")
def refs(micro_store):
    wavs = sorted((micro_store.parent / "data" / "wavs").glob("*.wav"))
    return [wavs[0], wavs[-1]]


def fake_decoder(frames_per_char: int, max_frames: int):
    """Decodes a text to frames_per_char frames per character (capped), log-mel = char code."""
    def decode(pieces):
        texts = [p.text for p in pieces]
        lengths = torch.tensor([min(max_frames, frames_per_char * len(t)) for t in texts])
        mels = torch.zeros(len(texts), int(lengths.max()), 2)
        for b, t in enumerate(texts):
            mels[b, : lengths[b], 0] = float(len(t))
        return mels, lengths
    return decode


def test_pieces_that_reach_the_limit_are_split_never_cut(caplog):
    pieces = longform.plan_pieces([PARAGRAPH], "en")
    assert [p.text for p in pieces][:2] == ["lamo tesi kunapo.", "miresu fato."]
    assert len(pieces) == 5 and pieces[-1].pause_s == 0.0
    max_frames = 60  # 2 frames per character: 29 characters fit
    with caplog.at_level(logging.WARNING):
        out = longform.decode_pieces(pieces, fake_decoder(2, max_frames), max_frames, 86.0)
    texts = [p.text for p, _ in out]
    assert " ".join(texts) == PARAGRAPH  # everything said, in order
    assert all(m.shape[0] < max_frames for _, m in out)  # nothing reached the limit
    assert all(m.shape[0] == 2 * len(p.text) for p, m in out)  # each piece spoken whole
    assert not caplog.records
    # a single word that cannot fit is the one case left: it is said up to the limit, and reported
    with caplog.at_level(logging.WARNING):
        out = longform.decode_pieces(longform.plan_pieces(["supercalifragilistic."], "en"),
                                     fake_decoder(4, 40), 40, 86.0)
    assert len(out) == 1 and "too long for the decoder" in caplog.text


def test_a_long_text_is_one_clip_with_every_sentence(run, refs):
    synth = Synthesizer.from_checkpoint(run, device="cpu")
    hop, sr = synth.cfg.audio.hop_length, synth.cfg.audio.sample_rate
    [wav] = synth.synthesize([PARAGRAPH], refs[:1])
    pieces = longform.decode_pieces(
        longform.plan_pieces([PARAGRAPH], "en"),
        lambda batch: synth.synthesize_mel([p.text for p in batch], synth.voice(refs[:1])),
        synth.max_frames, 86.0)
    n_pieces = len(pieces)
    assert n_pieces >= 5  # an untrained decoder never stops: sentences get split, not cut
    pauses = sum(int(round(p.pause_s * sr)) for p, _ in pieces)
    assert len(wav) == sum(m.shape[0] for _, m in pieces) * hop + pauses


def test_streaming_equals_the_whole_utterance(run, refs):
    synth = Synthesizer.from_checkpoint(run, device="cpu")
    torch.manual_seed(0)
    small = load_config(overrides=["vocoder.dim=16", "vocoder.layers=1"]).vocoder
    vocoder = VocosGenerator(synth.cfg.audio, small)
    neural = Synthesizer(synth.model, synth.cfg, synth.tokenizer, synth.device, vocoder)
    text = "lamo tesi kunapo."
    [whole] = neural.synthesize([text], refs[:1], seed=7)
    chunks = list(neural.stream(text, refs[:1], seed=7, first_frames=4, chunk_frames=8))
    assert len(chunks) >= 4  # handed out in several pieces
    assert np.array_equal(np.concatenate(chunks), whole)
    [gl_whole] = synth.synthesize([text], refs[:1], seed=7)  # Griffin-Lim streams the same
    gl = np.concatenate(list(synth.stream(text, refs[:1], seed=7, first_frames=4, chunk_frames=8)))
    assert np.array_equal(gl, gl_whole)


def test_several_references_average_into_one_voice(run, refs):
    synth = Synthesizer.from_checkpoint(run, device="cpu")
    a, b = synth.voice(refs[:1]), synth.voice(refs[1:])
    both = synth.voice(refs)
    assert torch.allclose(both, (a + b) / 2, atol=1e-6) and not torch.allclose(a, b)


def test_bad_synthesis_input_is_one_line(run, refs, tmp_path, capsys):
    synth = Synthesizer.from_checkpoint(run, device="cpu")
    short = tmp_path / "short.wav"
    sf.write(short, 0.3 * np.sin(np.arange(4410) / 5.0), 22050)  # 0.2 s
    with pytest.raises(SynthesisError, match=r"0\.20 s .* at least 0\.5 s"):
        synth.voice([short])
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\xe9".encode("latin-1"))
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    base = ["synthesize", "-c", str(run), "-r", str(refs[0]), "--device", "cpu"]
    for args, message in (
            (["--text-file", str(latin1), "-o", str(tmp_path / "a.wav")], "is not UTF-8"),
            (["--text-file", str(empty), "-o", str(tmp_path / "a.wav")], "is empty"),
            (["-t", "lamo.", "-o", str(tmp_path / "a.wav"), "--vocoder", str(run)],
             "is a TTS checkpoint, not a vocoder")):
        assert main(base + args) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1


def test_stream_cli_writes_the_wav_and_reports_latency(run, refs, tmp_path, capsys):
    out = tmp_path / "s.wav"
    text = tmp_path / "t.txt"
    text.write_text("lamo tesi.\n\nmiresu fato.", encoding="utf-8")
    assert main(["synthesize", "-c", str(run), "-r", str(refs[0]), "--text-file", str(text),
                 "-o", str(out), "--stream", "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert "first audio after" in err and "real-time factor" in err
    wav, sr = sf.read(out)
    assert sr == 22050 and len(wav) > 2 * 48 * 256  # two sentences of 48 frames + a pause


# ------------------------------------------------------------ a model that never stops

PERSIAN = ("امروز هوا خوب است و ما به پارک می‌رویم. کتاب‌های زیادی در کتابخانه هست، اما وقت "
           "کم است. آیا فردا باران می‌آید؟ دوستان ما از شهر دیگری آمده‌اند و چند روز می‌مانند. ")


def never_stops(max_frames: int, calls: list[tuple[int, int]]):
    """A decoder that runs every piece to the limit; ``calls`` gets (pieces, frames) per call."""
    def decode(pieces):
        calls.append((len(pieces), max_frames))
        return torch.zeros(len(pieces), max_frames, 2), torch.full((len(pieces),), max_frames)
    return decode


def test_a_model_that_never_stops_costs_one_decode_per_piece_not_per_word(caplog):
    text = PERSIAN * 18  # 3,000 characters, 72 sentences, 576 words
    assert 2900 <= len(text) <= 3100
    pieces = longform.plan_pieces([text], "fa")
    calls: list[tuple[int, int]] = []
    max_frames, fps = 1500, 86.13  # the default limit: 17 s
    with caplog.at_level(logging.WARNING):
        out = longform.decode_pieces(pieces, never_stops(max_frames, calls), max_frames, fps)
    decoded = sum(n for n, _ in calls)
    # every sentence once, plus the first sentence's splits that found out; not down to the
    # words (each run to the limit: 576 words x 17 s, hours of decoding)
    assert decoded <= len(pieces) + 4 and len(out) <= len(pieces) + 2
    assert sum(n * f for n, f in calls) <= (len(pieces) + 4) * max_frames
    assert max(n for n, _ in calls) <= longform.MAX_BATCH
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1, said  # named once, not once per piece
    assert "did not stop within 1500 frames (17.4 s)" in said[0] and "undertrained?" in said[0]
    assert " ".join(p.text for p, _ in out) == " ".join(text.split())  # every word still said


def test_a_long_sentence_is_still_split_by_a_model_that_stops(caplog):
    # 4 frames a character: 40 characters fit the limit; a 75-character sentence needs
    # splitting and its pieces stop, so the model is fine and nothing is said about it
    sentence = "lamo tesi kunapo miresu fato kali pana lumi sotu kanefa memo tarisu pekafo."
    with caplog.at_level(logging.WARNING):
        out = longform.decode_pieces(longform.plan_pieces([sentence], "en"),
                                     fake_decoder(4, 160), 160, 86.13)
    assert len(out) >= 2 and all(m.shape[0] < 160 for _, m in out) and not caplog.records
    assert " ".join(p.text for p, _ in out) == sentence


@pytest.mark.slow
def test_a_run_that_never_stops_does_bounded_work(run, refs, caplog, monkeypatch):
    synth = Synthesizer.from_checkpoint(run, device="cpu")
    synth.max_frames = 160  # 1.9 s: a word of up to six letters cannot need it
    text = " ".join([PARAGRAPH] * 4)  # 20 sentences, 60 words
    n_sentences, n_words = len(longform.plan_pieces([text], "en")), len(text.split())
    decoded, vocoded = [], []
    real_mel, real_vocode = synth.synthesize_mel, synth.vocode

    def synthesize_mel(texts, *a, **k):
        mels, lengths = real_mel(texts, *a, **k)
        decoded.append((len(texts), int(lengths.max())))
        return mels, lengths

    def vocode(mels, lengths):
        vocoded.append(mels.shape[0])
        return real_vocode(mels, lengths)

    monkeypatch.setattr(synth, "synthesize_mel", synthesize_mel)
    monkeypatch.setattr(synth, "vocode", vocode)
    with caplog.at_level(logging.WARNING):
        parts = list(synth.speak([text], refs[:1]))
    pieces = sum(n for n, _ in decoded)
    assert all(f == 160 for _, f in decoded)  # it really never stops
    assert pieces <= n_sentences + 6 < n_words  # one decode per sentence, not per word
    assert len(parts) <= n_sentences + 3
    assert max(vocoded) <= longform.MAX_BATCH  # the vocoder holds a batch, not the window
    said = [r.getMessage() for r in caplog.records if r.name == "myxtts.inference.longform"]
    assert len(said) == 1 and "did not stop within 160 frames" in said[0], said


# ------------------------------------------------------------ one 16-bit conversion

def test_raw_stream_wav_and_streamed_wav_hold_the_same_samples(run, refs, tmp_path,
                                                               capsysbinary):
    text = "lamo tesi kunapo. miresu fato."
    base = ["synthesize", "-c", str(run), "-r", str(refs[0]), "-t", text, "--device", "cpu"]
    assert main([*base, "-o", str(tmp_path / "whole.wav")]) == 0
    assert main([*base, "--stream", "-o", str(tmp_path / "stream.wav")]) == 0
    capsysbinary.readouterr()
    assert main([*base, "--stream", "-o", "-"]) == 0
    raw = np.frombuffer(capsysbinary.readouterr().out, "<i2")
    whole, sr = sf.read(tmp_path / "whole.wav", dtype="int16")
    streamed, _ = sf.read(tmp_path / "stream.wav", dtype="int16")
    assert sr == 22050 and raw.size > 0
    assert np.array_equal(raw, whole) and np.array_equal(streamed, whole)
    synth = Synthesizer.from_checkpoint(run, device="cpu")
    [audio] = synth.synthesize([text], refs[:1])
    assert np.array_equal(to_pcm16(audio), whole)  # save_wav's conversion too
    out = synth.synthesize_to_files([text], refs[:1], [tmp_path / "files.wav"])[0]
    assert np.array_equal(sf.read(out, dtype="int16")[0], whole)
