"""Decoding XTTS-v2's codes equals coqui-tts's ``gpt.generate`` / ``get_generator`` on the
same seeded weights: greedy codes identical, sampled codes identical under the same seed,
stop tokens and the padding of finished rows as HF pads them, streaming latents equal."""

from __future__ import annotations

import contextlib

import pytest
import torch

from myxtts.inference.xtts_v2.decode import generate_codes, stream_codes
from myxtts.model.xtts_v2.config import XttsV2Sampling
from tests.xtts_v2.gpt_oracle import fix_reference_generation, our_gpt
from tests.xtts_v2.reference import reference_model

TEXTS = ["hello world, how are you today?", "the quick brown fox", "one two three four five"]
PENALTY = XttsV2Sampling(repetition_penalty=5.0)
# the reference's generation passes the cache under transformers' old name
pytestmark = pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")


@pytest.fixture(scope="module")
def ref():
    torch.set_num_threads(1)
    model = reference_model(seed=0)
    fix_reference_generation(model)
    return model


@pytest.fixture(scope="module")
def ours(ref):
    return our_gpt(ref)


def _tokens(ref, text: str) -> torch.Tensor:
    return torch.IntTensor(ref.tokenizer.encode(text, lang="en")).unsqueeze(0)


def _voice(batch: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, 32, 256, generator=torch.Generator().manual_seed(seed))


@contextlib.contextmanager
def _stop_bias(ref, ours, bias: float):
    """Random weights rarely choose the stop token: raise its logit on both sides."""
    with torch.no_grad():
        ref.gpt.mel_head.bias[ref.gpt.stop_audio_token] += bias
        ours.mel_head.bias[ours.stop_audio_token] += bias
    try:
        yield
    finally:
        with torch.no_grad():
            ref.gpt.mel_head.bias[ref.gpt.stop_audio_token] -= bias
            ours.mel_head.bias[ours.stop_audio_token] -= bias


@pytest.mark.parametrize("text", TEXTS)
def test_greedy_codes_identical(ref, ours, text):
    tokens, voice = _tokens(ref, text), _voice(seed=len(text))
    expected = ref.gpt.generate(voice, tokens, do_sample=False, num_beams=1,
                                repetition_penalty=5.0, max_new_tokens=40)
    got = generate_codes(ours, voice, tokens, PENALTY, greedy=True, max_codes=40)
    assert got.shape == (1, 40)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("text,seed", [(TEXTS[0], 3), (TEXTS[1], 11)])
def test_sampled_codes_identical_under_one_seed(ref, ours, text, seed):
    """Same probabilities, same ``torch.multinomial`` draws: the reference draws from the
    global generator, ours from the one it is given."""
    tokens, voice = _tokens(ref, text), _voice(seed=seed)
    sampling = XttsV2Sampling()  # the released defaults: 0.75, top-k 50, top-p 0.85, penalty 5
    torch.manual_seed(seed)
    expected = ref.gpt.generate(voice, tokens, do_sample=True, num_beams=1, temperature=0.75,
                                top_k=50, top_p=0.85, repetition_penalty=5.0, max_new_tokens=30)
    got = generate_codes(ours, voice, tokens, sampling, max_codes=30,
                         generator=torch.Generator().manual_seed(seed))
    assert torch.equal(got, expected)


def _stop_ends(ours, voice, tokens, max_codes: int, bias: float) -> list[int | None]:
    """Where each row of ours stops (greedy) with ``bias`` added to the stop logit."""
    stop = ours.stop_audio_token
    with torch.no_grad():
        ours.mel_head.bias[stop] += bias
    try:
        codes = generate_codes(ours, voice, tokens, PENALTY, greedy=True, max_codes=max_codes)
    finally:
        with torch.no_grad():
            ours.mel_head.bias[stop] -= bias
    return [int((row == stop).int().argmax()) if (row == stop).any() else None for row in codes]


def _stopping_bias(ours, voice, tokens, max_codes: int, distinct: bool) -> float:
    """A stop-logit bias at which every row of ours stops after a few codes and within
    ``max_codes`` (``distinct``: at different codes), found between a bias that never stops
    and one that stops at once, so the test holds for any seeded weights; the reference is
    then checked at that bias."""
    lo, hi = 0.0, 1.0
    while hi < 1e4 and _stop_ends(ours, voice, tokens, max_codes, hi) != [0] * tokens.shape[0]:
        lo, hi = hi, hi * 2  # until every row stops at its first code
    for k in range(1, 33):
        bias = lo + (hi - lo) * k / 32
        ends = _stop_ends(ours, voice, tokens, max_codes, bias)
        if None not in ends and min(ends) >= 2 and (not distinct or len(set(ends)) == len(ends)):
            return bias
    pytest.skip("no stop-logit bias makes these weights stop as the test needs")


def test_stop_token_included_and_finished_rows_padded_as_the_reference(ref, ours):
    """Two voices whose rows stop at different codes: the row that stops first is padded
    with stop tokens until the other stops, which ends decoding; the stop token is the last
    code. Checking for the stop every 4 codes changes nothing."""
    tokens = _tokens(ref, "hello world").repeat(2, 1)
    voice = _voice(2, seed=0)
    stop = ours.stop_audio_token
    with _stop_bias(ref, ours, _stopping_bias(ours, voice, tokens, 40, distinct=True)):
        expected = ref.gpt.generate(voice, tokens, do_sample=False, num_beams=1,
                                    repetition_penalty=5.0, max_new_tokens=40)
        got = generate_codes(ours, voice, tokens, PENALTY, greedy=True, max_codes=40)
        every4 = generate_codes(ours, voice, tokens, PENALTY, greedy=True, max_codes=40,
                                stop_check_every=4)
    assert torch.equal(got, expected)
    assert torch.equal(every4, expected)
    first, last = sorted(int((row == stop).int().argmax()) for row in got)
    early = int((got[0] == stop).int().argmax()) != last  # which row stopped first
    row_early, row_late = (got[0], got[1]) if early else (got[1], got[0])
    assert got.shape[1] == last + 1 and first < last
    assert (row_early[first:] == stop).all() and (row_early[:first] != stop).all()
    assert row_late[-1] == stop and (row_late[:-1] != stop).all()


def test_streaming_latents_equal_the_reference_generator(ref, ours):
    """The reference's generator always samples: at top-k 1 its draws are the argmax, the
    codes ours chooses greedily. Latents (``final_norm`` states) equal per code, stop
    included, and equal the teacher-forced latents of the same codes."""
    tokens, voice = _tokens(ref, "hello world"), _voice(seed=0)
    with _stop_bias(ref, ours, _stopping_bias(ours, voice, tokens, 30, distinct=False)):
        fake = ref.gpt.compute_embeddings(voice, tokens)
        expected = list(ref.gpt.get_generator(
            fake_inputs=fake, top_k=1, top_p=0.85, temperature=0.75, do_sample=True, num_beams=1,
            num_return_sequences=1, length_penalty=1.0, repetition_penalty=5.0,
            output_attentions=False, output_hidden_states=True, return_dict_in_generate=True,
            max_new_tokens=30))
        got = list(stream_codes(ours, voice, tokens, PENALTY, greedy=True, max_codes=30))
    assert [int(c) for c, _ in got] == [int(c) for c, _ in expected]
    assert int(got[-1][0]) == ours.stop_audio_token and 2 < len(got) < 30
    assert all(int(c) != ours.stop_audio_token for c, _ in got[:-1])
    latents = torch.stack([h for _, h in got], dim=1)
    torch.testing.assert_close(latents, torch.stack([h for _, h in expected], dim=1),
                               rtol=0, atol=1e-5)
    codes = torch.stack([c for c, _ in got], dim=1)
    with torch.no_grad():
        forced = ours.latents_for_codes(voice, tokens, codes)
    torch.testing.assert_close(forced, latents, rtol=0, atol=1e-5)


def test_static_step_equals_the_eager_step(ours, ref):
    """The capturable step (device position, whole buffer under a mask) gives the eager
    step's numbers."""
    tokens, voice = _tokens(ref, TEXTS[2]), _voice(seed=2)
    codes = torch.tensor([[5], [77], [900], [3]])
    out = {}
    with torch.no_grad():
        for static in (False, True):
            cache = ours.gpt.new_cache(1, ours.prefix_length(tokens.shape[1]) + 8)
            ours.prefill(voice, tokens, cache)
            out[static] = [ours.step(c, cache, static=static) for c in codes]
    for (eager_logits, eager_h), (static_logits, static_h) in zip(out[False], out[True]):
        torch.testing.assert_close(static_logits, eager_logits, rtol=0, atol=1e-5)
        torch.testing.assert_close(static_h, eager_h, rtol=0, atol=1e-5)


def test_requests_beyond_the_model_are_one_line_errors(ours, ref):
    tokens, voice = _tokens(ref, TEXTS[0]), _voice()
    with pytest.raises(ValueError, match="max_codes must be in"):
        generate_codes(ours, voice, tokens, max_codes=ours.max_gen_mel_tokens + 1)
    with pytest.raises(ValueError, match="text tokens exceed"):
        generate_codes(ours, voice, torch.ones(1, 403, dtype=torch.long), max_codes=2)
    with pytest.raises(ValueError, match="temperature"):
        generate_codes(ours, voice, tokens, XttsV2Sampling(temperature=0.0), max_codes=2)
