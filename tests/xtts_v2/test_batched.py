"""Pieces of a text decoded together, one batch: each row's greedy codes identical to the
piece decoded alone (ours) and to the reference's ``generate``, its latents and audio equal
to the one-after-another path; a row that stops early leaves the others as they were; the
code cap holds per row; ``max_batch`` 1 (``--batch-pieces 1``) is the sequential path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from myxtts.inference.xtts_v2 import decode
from myxtts.inference.xtts_v2.decode import decode_pieces, generate_codes, stream_codes
from myxtts.model.xtts_v2.config import XttsV2Sampling
from tests.xtts_v2.gpt_oracle import generating_pair

# three pieces of different token lengths (the reduced model reads them all)
PIECES = ["the quick brown fox jumps over the lazy dog near the river.",
          "hello world",
          "one two three four five, how are you today?"]
PENALTY = XttsV2Sampling(repetition_penalty=5.0)
CODES = 24
pytestmark = pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")


@pytest.fixture(scope="module")
def pair():
    torch.set_num_threads(1)
    return generating_pair(seed=0)


def _voice() -> torch.Tensor:
    return torch.randn(1, 32, 256, generator=torch.Generator().manual_seed(7))


@pytest.fixture(scope="module")
def rows(pair):
    return [torch.tensor(pair[0].tokenizer.encode(t, lang="en")) for t in PIECES]


def _alone(ours, voice, row, max_codes=CODES):
    """The piece decoded by itself: its codes and latents as the streaming path yields them."""
    steps = list(stream_codes(ours, voice, row[None], PENALTY, greedy=True, max_codes=max_codes))
    return torch.stack([c[0] for c, _ in steps]), torch.stack([h[0] for _, h in steps])


def _stop_bias(ours, bias: float) -> None:
    with torch.no_grad():
        ours.mel_head.bias[ours.stop_audio_token] += bias


def test_batched_greedy_codes_equal_each_piece_alone_and_the_reference(pair, rows):
    ref, ours = pair
    voice = _voice()
    assert len({r.shape[0] for r in rows}) == len(rows)  # three different lengths
    batched = decode_pieces(ours, voice, rows, PENALTY, greedy=True, max_codes=CODES)
    for row, (codes, latents) in zip(rows, batched):
        codes_alone, latents_alone = _alone(ours, voice, row)
        assert torch.equal(codes, codes_alone)
        torch.testing.assert_close(latents, latents_alone, rtol=0, atol=1e-4)
        expected = ref.gpt.generate(voice, row[None].int(), do_sample=False, num_beams=1,
                                    repetition_penalty=5.0, max_new_tokens=CODES)
        assert torch.equal(codes[None], expected)


def _stop_codes(ours, voice, rows, bias: float) -> list[int | None]:
    """Where each piece alone stops (greedy) with ``bias`` added to the stop logit."""
    _stop_bias(ours, bias)
    try:
        ends = []
        for row in rows:
            codes = generate_codes(ours, voice, row[None], PENALTY, greedy=True, max_codes=CODES)[0]
            stops = codes == ours.stop_audio_token
            ends.append(int(stops.int().argmax()) if stops.any() else None)
        return ends
    finally:
        _stop_bias(ours, -bias)


def test_a_row_that_stops_early_leaves_the_others_as_they_were(pair, rows):
    """A stop-logit bias at which one piece stops within the cap and another does not
    (searched, so the test holds for any seeded weights): each row equals its piece alone,
    the stopped one ends with the stop token, the other is cut at the cap."""
    ours = pair[1]
    voice = _voice()
    bias = next((b for b in np.linspace(0.5, 30, 60)
                 if None in (ends := _stop_codes(ours, voice, rows, b))
                 and any(e is not None and e >= 1 for e in ends)), None)
    if bias is None:
        pytest.skip("no stop-logit bias makes these weights stop as the test needs")
    _stop_bias(ours, bias)
    try:
        batched = decode_pieces(ours, voice, rows, PENALTY, greedy=True, max_codes=CODES)
        alone = [_alone(ours, voice, row) for row in rows]
    finally:
        _stop_bias(ours, -bias)
    for end, (codes, latents), (codes_alone, latents_alone) in zip(ends, batched, alone):
        assert torch.equal(codes, codes_alone)
        torch.testing.assert_close(latents, latents_alone, rtol=0, atol=1e-4)
        if end is None:
            assert codes.shape[0] == CODES and not (codes == ours.stop_audio_token).any()
        else:
            assert codes.shape[0] == end + 1 and int(codes[-1]) == ours.stop_audio_token


def test_the_code_cap_holds_per_row(pair, rows):
    ours = pair[1]
    voice = _voice()
    for cap in (1, 5):
        batched = decode_pieces(ours, voice, rows, PENALTY, greedy=True, max_codes=cap)
        for row, (codes, latents) in zip(rows, batched):
            assert codes.shape[0] <= cap and latents.shape == (codes.shape[0], ours.dim)
            assert torch.equal(codes, _alone(ours, voice, row, cap)[0])


def test_sampled_batches_are_seeded_draws_of_valid_codes(pair, rows):
    """One generator for the whole batch: the same seed, the same codes (another draw than
    the pieces one after another, which the docstrings say)."""
    ours = pair[1]
    voice = _voice()
    runs = [decode_pieces(ours, voice, rows, XttsV2Sampling(), max_codes=12,
                          generator=torch.Generator().manual_seed(5)) for _ in range(2)]
    for (a, _), (b, _) in zip(*runs):
        assert torch.equal(a, b) and 1 <= a.shape[0] <= 12
        assert int(a.min()) >= 0 and int(a.max()) <= ours.stop_audio_token


# ----------------------------------------------------------------- the synthesizer, the flag

TEXT = ("The quick brown fox jumps over the lazy dog near the river bank, and then it runs "
        "far away into the deep green forest where the old trees stand tall and quiet, and "
        "nobody follows it there at all today, not even the farmer with his old brown dog. "
        "Hello world, how are you today? "
        "She sells sea shells by the sea shore, and the shells she sells are surely seashells, "
        "or so they say in the little town by the water where she lives all year long with "
        "her two cats and a very old parrot that never stops talking.")  # pieces of 245, 31, 228


@pytest.fixture(scope="module")
def synth(reduced_folder):
    from myxtts.inference.xtts_v2.synthesizer import XttsV2Synthesizer

    torch.set_num_threads(1)
    s = XttsV2Synthesizer.from_path(reduced_folder, device="cpu")
    s.with_decoding(greedy=True, max_codes=16)
    return s


@pytest.mark.slow
def test_speak_batches_the_pieces_and_batch_one_is_the_sequential_path(synth, monkeypatch):
    voice = synth.speaker("Ana Florence")
    pieces = synth.pieces(TEXT, "en")
    assert len(pieces) == 3 and len({len(synth.tokens(p, "en")[0]) for p in pieces}) == 3
    calls: list[int] = []
    real = decode.decode_pieces
    monkeypatch.setattr("myxtts.inference.xtts_v2.synthesizer.decode_pieces",
                        lambda gpt, v, rows, *a, **k: calls.append(len(rows)) or real(gpt, v, rows, *a, **k))
    batched = [a for _, a in synth.speak([TEXT], voice, "en")]
    assert calls == [3]
    synth.with_decoding(max_batch=2)
    in_twos = [a for _, a in synth.speak([TEXT], voice, "en")]
    assert calls == [3, 2]  # two pieces together, then the last alone (say)
    assert synth.decoding.max_batch == 2
    synth.with_decoding(max_batch=1)
    try:
        sequential = [a for _, a in synth.speak([TEXT], voice, "en")]
    finally:
        synth.with_decoding(max_batch=8)
    assert calls == [3, 2]  # 1: never batched
    assert [a.shape for a in batched] == [a.shape for a in sequential] == [a.shape for a in in_twos]
    for a, b, c in zip(batched, sequential, in_twos):
        assert np.abs(a - b).max() < 1e-4 and np.abs(c - b).max() < 1e-4
    joined = synth.synthesize([TEXT], voice, "en")[0]
    assert np.abs(joined - np.concatenate(sequential)).max() < 1e-4


def test_the_batch_pieces_flag_reaches_the_decoding(reduced_folder, tmp_path):
    from myxtts.cli.main import build_parser
    from myxtts.cli.synthesize import _open

    base = ["synthesize", "-c", str(reduced_folder), "-t", TEXT, "--speaker", "Ana Florence",
            "--language", "en", "--device", "cpu", "-o", str(tmp_path / "x.wav")]
    parser = build_parser()
    assert parser.parse_args(base).batch_pieces is None  # the synthesizer's default: 8
    assert _open(parser.parse_args([*base, "--batch-pieces", "3"])).decoding.max_batch == 3
    with pytest.raises(SystemExit):
        parser.parse_args([*base, "--batch-pieces", "0"])
