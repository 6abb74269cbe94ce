"""Adding a language (Persian) to XTTS-v2: the vocabulary grown with ids of old tokens
unchanged (myxtts.text.xtts_v2.grow), Persian text cleaned by the project's front end and
encoded without [UNK], the model's text rows grown with old rows bit for bit
(myxtts.model.xtts_v2.grow), and the grown folder read back by myxtts and by coqui-tts."""

from __future__ import annotations

import json

import pytest
import torch

from myxtts.artifacts.xtts_v2 import XttsV2Files, read_xtts_v2, write_xtts_v2
from myxtts.model.xtts_v2.gpt import XttsGpt
from myxtts.model.xtts_v2.grow import NOISE, TEXT_ROWS, grow_gpt, grow_text_rows, grown_config
from myxtts.text import TokenizerError
from myxtts.text.xtts_v2 import OWN_CHAR_LIMITS, XttsTokenizer, normalize
from myxtts.text.xtts_v2.grow import ALPHABETS, MARKS, grow_vocab
from tests.xtts_v2.reference import load_reference, make_vocab

ZWNJ = "\u200c"
# Persian and ASCII digits, a ZWNJ, Arabic letter variants (ي ك ة), Persian punctuation,
# a percentage and a symbol
PERSIAN = "کتاب‌های من ۱۲ تا بود و 3.5 درصد؛ كيف «خوب» است؟ ۲۵٪ & ژاله گفت، چه زیبا!"
OTHERS = {"en": ["Dr. Smith paid $20.15 for 3 apples & 2 pears on the 1st of May.",
                 "Hello world, how are you today?"],
          "de": ["Frau Dr. Müller zahlte 20,15€ für 3 Äpfel am 1. Mai."],
          "ar": ["دفع الدكتور 20 دولارا مقابل 3 تفاحات & 2 كمثرى."],
          "ru": ["Г-н Иванов заплатил 20.15€ за 3 яблока & 2 груши."],
          "hi": ["तेज़ भूरी लोमड़ी आलसी कुत्ते के ऊपर कूदती है।"]}


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    return make_vocab(tmp_path_factory.mktemp("grow") / "vocab.json")


@pytest.fixture(scope="module")
def grown(vocab):
    return grow_vocab(vocab.read_text(encoding="utf-8"), ["fa"])


@pytest.fixture(scope="module")
def old_tok(vocab):
    return XttsTokenizer(vocab)


@pytest.fixture(scope="module")
def new_tok(vocab, grown):
    return XttsTokenizer(vocab, text=grown.text)


# ------------------------------------------------------------------ the vocabulary

def test_old_tokens_keep_their_ids_and_merges(vocab, grown, old_tok, new_tok):
    old, new = old_tok._bpe.get_vocab(), new_tok._bpe.get_vocab()
    assert {token: new[token] for token in old} == old
    before, after = json.loads(vocab.read_text(encoding="utf-8")), json.loads(grown.text)
    assert after["model"]["merges"] == before["model"]["merges"]
    assert after["added_tokens"][:len(before["added_tokens"])] == before["added_tokens"]
    added = set(new) - set(old)
    assert sorted(new[t] for t in added) == list(range(grown.before, grown.number_text_tokens))
    assert grown.before == old_tok.n_tokens and new_tok.n_tokens == grown.number_text_tokens
    assert grown.languages == {"fa": grown.before} and new["[fa]"] == grown.before
    fa_entry = [e for e in after["added_tokens"] if e["content"] == "[fa]"]
    assert fa_entry == [{**before["added_tokens"][3], "id": grown.before, "content": "[fa]"}]
    # the letters are the byte-pair model's own vocabulary, not added tokens
    assert all(after["model"]["vocab"][ch] == i for ch, i in grown.letters.items())
    assert {"پ", "چ", "ژ", "گ", "ک", "ی", ZWNJ} <= set(grown.letters)
    assert (new_tok.start_token, new_tok.stop_token) == (old_tok.start_token, old_tok.stop_token)


def test_every_persian_letter_encodes_as_itself(grown, new_tok):
    unk = new_tok._bpe.token_to_id("[UNK]")
    for ch in ALPHABETS["fa"] + MARKS:
        ids = new_tok._bpe.encode(ch).ids
        assert unk not in ids and len(ids) == 1, repr(ch)


def test_persian_sentence_encodes_without_unk_after_its_language_token(new_tok, grown):
    cleaned = new_tok.normalize(PERSIAN, "fa")
    ids = new_tok.encode(PERSIAN, "fa")
    assert ids[0] == grown.languages["fa"]
    assert new_tok._bpe.token_to_id("[UNK]") not in ids
    assert grown.letters[ZWNJ] in ids and ZWNJ in cleaned
    assert new_tok.decode(ids) == "[fa]" + cleaned


def test_the_released_languages_encode_exactly_as_before(old_tok, new_tok):
    unk = old_tok._bpe.token_to_id("[UNK]")
    for lang, texts in OTHERS.items():
        for text in texts:
            assert new_tok.normalize(text, lang) == old_tok.normalize(text, lang)
            old, new = old_tok.encode(text, lang), new_tok.encode(text, lang)
            if lang != "ar":
                assert new == old, (lang, text)
            # the test vocabulary lacks Arabic's dal, now a (Persian) letter: only the
            # [UNK]s it gave become that letter, every other id stays
            assert len(new) == len(old), (lang, text)
            assert all(n == o for n, o in zip(new, old) if o != unk), (lang, text)
    assert new_tok.languages == old_tok.languages + ("fa",)
    assert new_tok.char_limits == old_tok.char_limits | {"fa": 200}
    assert new_tok.char_limit("fa") == OWN_CHAR_LIMITS["fa"] == 200


def test_long_persian_text_splits_within_its_limit(new_tok):
    text = " ".join([PERSIAN] * 12)
    pieces = new_tok.split(text, "fa")
    assert len(pieces) > 1 and all(len(p) <= 200 for p in pieces)
    assert " ".join(pieces) == " ".join(text.split())


def test_persian_cleaning_is_the_projects_front_end():
    text = normalize('كتاب‌ها ۱۲ "تا" و ۵٪ & 3 # يك؛', "fa")
    assert text == "کتاب‌ها دوازده تا و پنج درصد و سه شماره یک;"
    assert normalize("می\u200c\u200cخواهم\u200c ", "fa") == "می" + ZWNJ + "خواهم"
    for ch in ALPHABETS["fa"].replace(ZWNJ, ""):  # every letter survives the cleaning
        assert normalize(f"ب{ch}ب", "fa") == f"ب{ch}ب", repr(ch)


def test_growing_again_or_a_known_language_adds_nothing(vocab, grown):
    again = grow_vocab(grown.text, ["fa"])
    assert again.text == grown.text and not again.languages and not again.letters
    # a language the vocabulary has gains no token, only the marks this one lacks
    english = grow_vocab(vocab.read_text(encoding="utf-8"), ["en"],
                         samples={"en": ["The quick brown fox!"]})
    assert not english.languages and english.letters and set(english.letters) <= set(MARKS)


def test_sample_text_adds_the_letters_it_holds(vocab):
    # Urdu's tteh is no Persian letter and not folded by the cleaner: a sample brings it in
    grown = grow_vocab(vocab.read_text(encoding="utf-8"), ["fa"], samples={"fa": ["ٹماٹر"]})
    tok = XttsTokenizer(vocab, text=grown.text)
    assert "ٹ" in grown.letters and tok._bpe.token_to_id("[UNK]") not in tok.encode("ٹماٹر", "fa")


def test_a_language_missing_from_the_vocabulary_names_the_fix(old_tok, vocab):
    with pytest.raises(TokenizerError) as err:
        old_tok.encode(PERSIAN, "fa")
    message = str(err.value)
    assert "\n" not in message and "[fa]" in message and "add it" in message
    assert "grow_vocab" in message and str(vocab) in message
    with pytest.raises(TokenizerError, match="'xx'"):
        grow_vocab(vocab.read_text(encoding="utf-8"), ["xx"])
    with pytest.raises(TokenizerError, match="'xx'"):
        old_tok.encode("hello", "xx")


# ------------------------------------------------------------------ the model

@pytest.fixture(scope="module")
def release(reduced_folder) -> XttsV2Files:
    torch.set_num_threads(1)
    return read_xtts_v2(reduced_folder)


@pytest.fixture(scope="module")
def folder_grown(release):
    return grow_vocab(release.vocab, ["fa"])


@pytest.fixture(scope="module")
def grown_files(release, folder_grown) -> XttsV2Files:
    config = grown_config(release.config, folder_grown.number_text_tokens, ["fa"])
    weights = grow_text_rows(release.weights, config.number_text_tokens,
                             folder_grown.row_sources, seed=3)
    return XttsV2Files(config, weights, folder_grown.text, release.config_json,
                       release.speakers, release.dvae, release.mel_stats)


def test_old_rows_are_bit_identical_and_nothing_else_moves(release, grown_files, folder_grown):
    n_old, n_new = release.config.number_text_tokens, folder_grown.number_text_tokens
    assert grown_files.config.number_text_tokens == n_new
    assert grown_files.config.languages == release.config.languages + ("fa",)
    assert (grown_files.config.start_text_token, grown_files.config.stop_text_token) == (
        release.config.start_text_token, release.config.stop_text_token)
    for key, value in release.weights.items():
        grown = grown_files.weights[key]
        if key in TEXT_ROWS:
            assert grown.shape[0] == n_new and grown.shape[1:] == value.shape[1:]
            assert grown.dtype == value.dtype and torch.equal(grown[:n_old], value), key
            assert torch.isfinite(grown[n_old:]).all(), key
        else:
            assert grown is value, key
    assert set(grown_files.weights) == set(release.weights)


def test_new_rows_start_at_their_kind_mean_with_small_noise(release, grown_files, folder_grown):
    n_old = release.config.number_text_tokens
    for key in TEXT_ROWS:
        old, new = release.weights[key], grown_files.weights[key][n_old:]
        for new_id, sources in folder_grown.row_sources.items():
            src = old[list(sources)]
            row = new[new_id - n_old]
            if key.endswith("bias"):  # the mean bias, no noise
                assert torch.allclose(row, src.mean(dim=0), atol=1e-7, rtol=0)
        # the letters: (row - mean) / std of their sources is noise of scale NOISE
        letters = list(folder_grown.letters.values())
        pieces = old[list(folder_grown.row_sources[letters[0]])]
        if key.endswith("bias"):
            continue
        z = (new[[i - n_old for i in letters]] - pieces.mean(dim=0)) / pieces.std(dim=0)
        assert abs(z.mean().item()) < 0.1 * NOISE and abs(z.std().item() / NOISE - 1) < 0.1, key
    lang = folder_grown.languages["fa"]
    assert folder_grown.row_sources[lang] == tuple(sorted(
        i for t, i in XttsTokenizer(release.source / "vocab.json")._bpe.get_vocab().items()
        if t in {"[en]", "[es]", "[fr]", "[de]", "[it]", "[pt]", "[pl]", "[tr]", "[ru]", "[nl]",
                 "[cs]", "[ar]", "[zh-cn]", "[hu]", "[ko]", "[ja]", "[hi]"}))
    again = grow_text_rows(release.weights, folder_grown.number_text_tokens,
                           folder_grown.row_sources, seed=3)
    for key in TEXT_ROWS:  # seeded: the same call gives the same rows
        assert torch.equal(again[key], grown_files.weights[key])


def test_a_gpt_of_the_grown_config_loads_the_grown_rows_strictly(release, grown_files,
                                                                  folder_grown):
    def gpt_part(state):
        return {k[len("gpt."):]: v for k, v in state.items() if k.startswith("gpt.")}

    gpt = XttsGpt(grown_files.config).eval()
    gpt.load_state_dict(gpt_part(grown_files.weights), strict=True)
    old_gpt = XttsGpt(release.config).eval()
    old_gpt.load_state_dict(gpt_part(release.weights), strict=True)
    grow_gpt(old_gpt, folder_grown.number_text_tokens, folder_grown.row_sources, seed=3)
    for name, tensor in gpt.state_dict().items():
        assert torch.equal(old_gpt.state_dict()[name], tensor), name
    assert old_gpt.text_embedding.weight.requires_grad


@pytest.mark.slow
def test_grown_folder_reads_back_and_in_coqui(grown_files, folder_grown, tmp_path):
    out = write_xtts_v2(tmp_path / "XTTS-v2-fa", grown_files)
    again = read_xtts_v2(out)
    assert again.config == grown_files.config and again.vocab == folder_grown.text
    for key, value in grown_files.weights.items():
        assert torch.equal(again.weights[key], value), key
    tok = XttsTokenizer(out / "vocab.json")
    assert "fa" in tok.languages and tok.encode(PERSIAN, "fa")[0] == folder_grown.languages["fa"]
    coqui_model = load_reference(out)  # coqui-tts reads the grown folder as its own
    n_new = folder_grown.number_text_tokens
    assert coqui_model.tokenizer.get_number_tokens() == n_new
    assert coqui_model.gpt.text_embedding.weight.shape[0] == n_new
    assert torch.equal(coqui_model.gpt.text_embedding.weight,
                       grown_files.weights["gpt.text_embedding.weight"])
    assert torch.equal(coqui_model.gpt.text_head.bias, grown_files.weights["gpt.text_head.bias"])
    assert "fa" in coqui_model.config.languages
