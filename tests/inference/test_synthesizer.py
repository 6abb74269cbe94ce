"""Synthesizer: a checkpoint is all it needs; batched text -> clips cut to their lengths."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from myxtts.artifacts.errors import ArtifactError
from myxtts.artifacts.runs import resolve_checkpoint
from myxtts.inference import longform
from myxtts.inference.errors import SynthesisError
from myxtts.inference.synthesizer import Synthesizer
from tests.inference.conftest import MIXED, MIXED_SENTENCES

SENTENCES = ["lamo tesi kunapo.", "miresu."]  # the demo language the micro store speaks


@pytest.fixture(scope="module")
def reference(micro_store):
    return sorted((micro_store.parent / "data" / "wavs").glob("*.wav"))[0]


def test_a_run_folder_or_a_file_loads_and_synthesizes(run, reference):
    synth = Synthesizer.from_checkpoint(run, device="cpu")
    assert resolve_checkpoint(run) == run / "checkpoints" / "best.pt"
    hop, limit = synth.cfg.audio.hop_length, synth.cfg.model.max_decoder_frames
    mels, lengths = synth.synthesize_mel(SENTENCES, [reference])
    wavs = synth.vocode(mels, lengths)
    assert len(wavs) == 2 and mels.shape[0] == 2 and mels.shape[2] == synth.cfg.audio.n_mels
    for wav, n in zip(wavs, lengths.tolist()):
        assert wav.dtype == np.float32 and 0 < n <= limit and len(wav) == n * hop
        assert np.isfinite(wav).all()
    spoken = synth.synthesize(SENTENCES, [reference])  # long-form: one clip per text
    assert len(spoken) == 2 and all(len(w) >= hop and np.isfinite(w).all() for w in spoken)
    for i, n in enumerate(lengths.tolist()):  # zero past each length: a clean batch
        assert not mels[i, n:].any()
    again = Synthesizer.from_checkpoint(run / "checkpoints" / "ckpt_00000004.pt", device="cpu")
    assert again.tokenizer == synth.tokenizer


def test_the_seed_fixes_the_prenet_noise(run, reference):
    synth = Synthesizer.from_checkpoint(run, device="cpu")
    a = synth.synthesize_mel(SENTENCES[:1], [reference], seed=3)[0]
    b = synth.synthesize_mel(SENTENCES[:1], [reference], seed=3)[0]
    c = synth.synthesize_mel(SENTENCES[:1], [reference], seed=4)[0]
    assert torch.equal(a, b) and not (a.shape == c.shape and torch.equal(a, c))


def test_a_reference_is_cropped_to_what_the_encoder_trained_on(run, reference):
    synth = Synthesizer.from_checkpoint(run, device="cpu")
    ref, n = synth.reference(reference)
    assert ref.shape == (1, int(n), synth.cfg.audio.n_mels) and int(n) <= synth.cfg.data.ref_frames


def test_a_reference_far_shorter_than_the_training_crops_warns(run, tmp_path, caplog):
    import soundfile as sf

    synth = Synthesizer.from_checkpoint(run, device="cpu")
    sr, r = synth.cfg.audio.sample_rate, synth.cfg.data.ref_frames
    t = np.arange(int(0.8 * sr)) / sr  # 0.8 s: above the 0.5 s minimum, under half the crop
    sf.write(tmp_path / "short.wav", (0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32), sr)
    assert r / synth.cfg.audio.frames_per_second / 2 > 0.8
    with caplog.at_level("WARNING"):
        ref, n = synth.reference(tmp_path / "short.wav")
    assert int(n) < r // 2 and "short.wav has 0.80 s of speech" in caplog.text
    assert f"data.ref_frames={r}" in caplog.text


def test_user_errors_are_one_line(run, reference, tmp_path):
    synth = Synthesizer.from_checkpoint(run, device="cpu")
    with pytest.raises(SynthesisError, match="language 'xx' is not known to this model"):
        synth.synthesize(SENTENCES, [reference], language="xx")
    with pytest.raises(SynthesisError, match="has nothing this model can speak"):
        synth.synthesize(["   "], [reference])
    with pytest.raises(SynthesisError, match=r"CYRILLIC letters, .* \(it knows en\)"):
        synth.synthesize(["привет"], [reference])  # letters of no language the model knows
    with pytest.raises(ArtifactError, match="no checkpoint at"):
        resolve_checkpoint(tmp_path / "nothing")


@pytest.mark.parametrize("text, unknown", [
    ("...", ""), ("?! -- !?", "'!' (U+0021 EXCLAMATION MARK)"),
])
def test_a_text_with_nothing_to_speak_is_an_error_not_seconds_of_noise(run, reference, text,
                                                                       unknown):
    synth = Synthesizer.from_checkpoint(run, device="cpu")
    with pytest.raises(SynthesisError, match="has nothing this model can speak") as err:
        synth.synthesize([text], [reference])
    assert unknown in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
def test_unknown_characters_are_reported_once_as_a_list(run, reference, caplog):
    synth = Synthesizer.from_checkpoint(run, device="cpu")
    synth.max_frames = 12  # the micro model does not learn to stop: keep the decode short
    text = "lamo ж tesi. kunapo ж ж 🙂."  # sentence pieces are not checked again one by one
    with caplog.at_level("WARNING"):
        synth.synthesize([text, "miresu ж."], [reference])
        synth.synthesize([text], [reference])
    reports = [r.getMessage() for r in caplog.records if "did not train on" in r.getMessage()]
    assert len(reports) == 1  # one list for the call, nothing again for the next
    assert "'ж' (U+0436 CYRILLIC SMALL LETTER ZHE)" in reports[0] and "SLIGHTLY SMILING" in reports[0]
    assert not any("is not in the vocabulary" in r.getMessage() for r in caplog.records)



def test_a_texts_language_comes_from_its_letters():
    from types import SimpleNamespace

    from myxtts.config import load_config

    me = SimpleNamespace(tokenizer=SimpleNamespace(languages=["en", "fa"]),
                         cfg=load_config(overrides=["text.languages=[en,fa]"]))
    pick = lambda text, language=None: Synthesizer.language_for(me, text, language)  # noqa: E731
    assert pick("سلام دنیا، چطوری؟") == "fa" and pick("Hello there.") == "en"
    assert pick("1234 !") == "en"  # no letters: the default
    assert pick("Hello", "fa") == "fa"  # --language forces one
    assert pick("Hello ж there") == "en"  # a stray letter: reported as unknown, not a language
    with pytest.raises(SynthesisError, match=r"CYRILLIC letters, which no language of this model "
                                         r"uses \(it knows en, fa\); pass --language"):
        pick("Привет")


@pytest.mark.slow
def test_each_sentence_is_spoken_in_its_own_language(bilingual, reference, monkeypatch):
    synth = bilingual
    pieces = longform.plan_pieces([MIXED], [synth.language_for(MIXED)], synth.sentence_language,
                                  synth.tokenizer.languages)
    assert [(p.text, p.language) for p in pieces] == MIXED_SENTENCES
    decoded, rows = [], []
    real_mel, real_generate = synth.synthesize_mel, synth.model.generate

    def synthesize_mel(texts, ref, language=None, *a, **k):
        decoded.extend(zip(texts, language))
        return real_mel(texts, ref, language, *a, **k)

    def generate(tokens, lengths, language_ids, *a, **k):
        rows.extend(synth.tokenizer.languages[i] for i in language_ids.tolist())
        return real_generate(tokens, lengths, language_ids, *a, **k)

    monkeypatch.setattr(synth, "synthesize_mel", synthesize_mel)
    monkeypatch.setattr(synth.model, "generate", generate)
    [whole] = synth.synthesize([MIXED], [reference])
    # every piece (sentences split further where they reach the limit) keeps its sentence's
    # language, and the model is given that language row by row
    persian = {w for s, lang in MIXED_SENTENCES if lang == "fa" for w in s.split()}
    assert decoded and all((lang == "fa") == (set(t.split()) <= persian) for t, lang in decoded)
    assert rows == [lang for _, lang in decoded]
    assert {lang for _, lang in decoded} == {"en", "fa"}
    assert np.array_equal(np.concatenate(list(synth.stream(MIXED, [reference]))), whole)
    decoded.clear()
    synth.synthesize([MIXED], [reference], language="fa")  # --language forces one for all
    assert {lang for _, lang in decoded} == {"fa"}


def test_a_sentence_takes_the_texts_language_where_its_letters_say_none(bilingual):
    synth = bilingual
    assert synth.sentence_language("1234.", "fa") == "fa"  # numbers: read in the text's language
    assert synth.sentence_language("Привет.", "fa") == "fa"  # letters no language of it writes
    assert synth.sentence_language("Hello there.", "fa") == "en"
    assert synth.sentence_language("سلام دوست من.", "en") == "fa"
