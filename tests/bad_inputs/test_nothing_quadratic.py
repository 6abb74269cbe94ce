"""Nothing quadratic in a long text: planning a paragraph of megabytes looks at each sentence
end through the words beside it, never through the rest of the paragraph, and cutting a
long sentence finds the space nearest its middle without walking every character; and a
long text says it is being planned before its first sentence is spoken. Counted in
characters touched, not timed."""

from __future__ import annotations

import pytest

from myxtts.inference.synthesizer import Synthesizer
from myxtts.text import sentences
from tests.bad_inputs.test_synthesis_and_hangs import ref, run  # noqa: F401 - fixtures

BASE = "Dr. Smith went to the U.S. on Jan. 5. He paid $3.50 for coffee! Was it good? Yes... it was. "


class Counted(str):
    """A str that counts the characters every slice and every walk over it touch."""

    touched = 0

    def __getitem__(self, key):
        out = str.__getitem__(self, key)
        Counted.touched += len(out)
        return Counted(out)

    def __iter__(self):
        Counted.touched += len(self)
        return str.__iter__(self)


@pytest.mark.parametrize("n_chars", [20_000, 200_000])
def test_sentence_ends_are_judged_by_the_words_beside_them(monkeypatch, n_chars):
    judge = sentences._is_end
    monkeypatch.setattr(sentences, "_is_end", lambda text, m: judge(Counted(text), m))
    Counted.touched = 0
    text = (BASE * (n_chars // len(BASE) + 1))[:n_chars]
    out = sentences.split_sentences(text, "en")
    assert " ".join(out) == " ".join(text.split()) and len(out) > n_chars // 100
    assert Counted.touched < 4 * n_chars, Counted.touched  # the rest of the text each time: ~n²


def test_a_long_sentence_is_halved_without_walking_every_character():
    text = " ".join(["word", "another,", "x"] * 20_000)  # 102,000 characters, cut to 40
    Counted.touched = 0
    pieces = sentences._halve(Counted(text), 40)
    assert " ".join(pieces) == text and max(map(len, pieces)) <= 40
    # each level's halves are sliced once (n per level, ~12 levels); walking every
    # character to find the middle space cost as much again per level
    assert Counted.touched < 14 * len(text), Counted.touched


def test_a_planned_text_is_said_before_its_first_window(run, ref):  # noqa: F811 - fixtures
    synth = Synthesizer.from_checkpoint(run, device="cpu")
    calls = []
    text = "lamo tesi kunapo. miresu fato. kali."
    next(iter(synth.speak([text], [ref], "en", progress=lambda d, t: calls.append((d, t)))))
    assert calls[0] == (0, 3)
