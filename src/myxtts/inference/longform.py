"""Long text -> pieces the decoder can say, and their audio joined with pauses.

Why: the autoregressive decoder stops at ``model.max_decoder_frames`` (a guard against a
stop token that never fires), so a paragraph spoken in one go would be cut there without a
word of warning. Here text is split into sentences (``text.sentences``, language-aware),
sentences are decoded together in batches (the KV cache makes a batch of B sentences
cost about as much wall time as the longest one), and a sentence that still
reaches the limit without stopping is split again at clause punctuation or the middle
word and re-decoded -- never cut silently. A single word that cannot be said within the
limit is the only case left, and it is reported. A long text is decoded window by window
(``windows``: the first sentence alone, then ``MAX_BATCH`` sentences in text order), so
memory holds one window's mels, the audio can be written as it is made, and streamed
and whole synthesis decode the very same batches with the very same random state.

Every piece carries its own language (a Persian sentence in an English paragraph is
spoken as Persian): ``plan_pieces`` splits a text with the sentence rules of every
language it may hold and asks ``choose`` for each sentence's.

A model that never stops (barely trained) would make every sentence reach the limit, be
split down to its words and each word run to the limit again: work and memory growing
with the text for nothing. ``StopGuard`` tells that apart from a sentence that is merely
long: a piece too short to last the limit even spoken at ``SLOWEST_S_PER_CHARACTER``
that still reaches it means the model did not stop. That is said once, and from then on
a piece that reaches the limit is cut there, not split: one decode per piece, at most
``max_frames`` each, whatever the model does.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from myxtts.text.sentences import split_long, split_sentences

log = logging.getLogger(__name__)

SENTENCE_PAUSE_S = 0.30  # between sentences
CLAUSE_PAUSE_S = 0.12  # between the pieces of a sentence that had to be split
MAX_BATCH = 16  # sentences decoded together
FIRST_WINDOW = 1  # the first sentence alone: its audio is ready after one sentence's decode
# Slower than anyone speaks (about 10-15 characters a second is usual): a piece of N
# characters that has not stopped after N times this long is not waiting for its words.
SLOWEST_S_PER_CHARACTER = 0.3


@dataclass
class Piece:
    """One decoder input: ``text`` of utterance ``source`` in ``language``, followed by
    ``pause_s`` of silence."""

    text: str
    source: int
    pause_s: float
    language: str


def sentences_of(text: str, languages: Sequence[str]) -> list[str]:
    """The sentences of ``text`` under the rules of every language in ``languages``: each
    rule set only cuts (``split_sentences``), so applying them in turn keeps every
    character, and a sentence end of any of them ends a sentence (a Persian ``؟`` inside
    an English paragraph)."""
    parts = [text]
    for language in dict.fromkeys(languages):
        parts = [s for part in parts for s in (split_sentences(part, language) or [part])]
    return parts


def plan_pieces(texts: Sequence[str], language: str | Sequence[str],
                choose: Callable[[str, str], str] | None = None,
                split_with: Sequence[str] = ()) -> list[Piece]:
    """Every text split into sentences, in order; the last piece of a text has no pause.
    ``language``: of every text, or one per text. ``choose(sentence, text_language)``: the
    language of each sentence (default: its text's); ``split_with``: more languages whose
    sentence ends cut the texts (the languages ``choose`` may pick)."""
    pieces: list[Piece] = []
    for k, text in enumerate(texts):
        lang = language if isinstance(language, str) else language[k]
        sentences = sentences_of(text, [lang, *split_with]) or [text]
        pieces += [Piece(s, k, SENTENCE_PAUSE_S, choose(s, lang) if choose else lang)
                   for s in sentences]
        pieces[-1].pause_s = 0.0
    return pieces


# (pieces) -> (log-mels [B, F, n_mels], lengths [B]): one batched decode
Decode = Callable[[list[Piece]], tuple[torch.Tensor, torch.Tensor]]


class StopGuard:
    """What one synthesis has learned about the model's stopping (see the module doc):
    ``stuck`` once a piece too short to last ``max_frames`` reached them; it is then said
    once, and pieces that reach the limit are cut there instead of split."""

    def __init__(self, max_frames: int, fps: float) -> None:
        self.max_frames, self.fps = int(max_frames), float(fps)
        self.stuck = False

    def check(self, piece: Piece) -> bool:
        """Whether ``piece``, which reached the limit, shows that the model does not stop
        (said the first time); True from then on."""
        if self.stuck:
            return True
        limit_s = self.max_frames / self.fps
        if len(piece.text) * SLOWEST_S_PER_CHARACTER >= limit_s:
            return False  # long enough to need the limit: split it, as for any long sentence
        self.stuck = True
        log.warning("the model did not stop within %d frames (%.1f s) on %r (%d characters, "
                    "under %.1f s of speech even said slowly): undertrained? From here on a "
                    "piece that reaches the limit is cut there instead of split; train the "
                    "model longer (its stop loss)", self.max_frames, limit_s, piece.text[:60],
                    len(piece.text), len(piece.text) * SLOWEST_S_PER_CHARACTER)
        return True


def windows(pieces: list[Piece], first: int = FIRST_WINDOW, size: int = MAX_BATCH
            ) -> Iterator[list[tuple[int, Piece]]]:
    """Consecutive runs of ``(index, piece)``: ``first`` pieces (a short wait for the first
    audio), then ``size`` at a time -- the schedule every caller shares."""
    start, n = 0, first
    while start < len(pieces):
        yield [(i, pieces[i]) for i in range(start, min(start + n, len(pieces)))]
        start, n = start + n, size


def decode_window(window: list[tuple[int, Piece]], decode: Decode, guard: StopGuard
                  ) -> list[tuple[Piece, torch.Tensor]]:
    """Decode one window of pieces in batches; a piece that reaches ``guard.max_frames``
    without stopping is split and decoded again (cut there once ``guard`` says the model
    does not stop). Returns ``(piece, log-mel [F, n_mels])`` in text order."""
    # A slot is a piece's place in the text: (i,) for sentence i, (i, j) for part j of it, ...
    # so output order is the sorted slots, whatever order the batches finish in.
    done: dict[tuple[int, ...], tuple[Piece, torch.Tensor]] = {}
    queue = [((i,), p) for i, p in window]
    max_frames = guard.max_frames
    while queue:
        # similar lengths together: a batch costs as many steps as its longest sentence
        queue.sort(key=lambda item: len(item[1].text))
        batch, queue = queue[:MAX_BATCH], queue[MAX_BATCH:]
        mels, lengths = decode([p for _, p in batch])
        retry: list[tuple[tuple[int, ...], Piece]] = []
        for b, (slot, piece) in enumerate(batch):
            n = int(lengths[b])
            if n >= max_frames and not guard.check(piece):
                parts = split_long(piece.text, max(1, len(piece.text) // 2), piece.language)
                if len(parts) > 1:
                    subs = [Piece(t, piece.source, CLAUSE_PAUSE_S, piece.language) for t in parts]
                    subs[-1].pause_s = piece.pause_s
                    retry += [(slot + (j,), s) for j, s in enumerate(subs)]
                    continue
                log.warning("%r is too long for the decoder: it reached model.max_decoder_frames "
                            "= %d (%.1f s) without stopping and was cut there; give shorter "
                            "words or raise model.max_decoder_frames", piece.text, max_frames,
                            max_frames / guard.fps)
            done[slot] = (piece, mels[b, :n].clone())  # not a view holding the whole batch
        queue += retry
    return [done[slot] for slot in sorted(done)]


def decode_pieces(pieces: list[Piece], decode: Decode, max_frames: int, fps: float
                  ) -> list[tuple[Piece, torch.Tensor]]:
    """Every window of ``pieces`` decoded (:func:`decode_window`), in text order."""
    guard = StopGuard(max_frames, fps)
    return [item for w in windows(pieces) for item in decode_window(w, decode, guard)]


def join(waves: Sequence[np.ndarray], pauses_s: Sequence[float], sample_rate: int) -> np.ndarray:
    """Concatenate clips with ``pauses_s[i]`` seconds of silence after clip i."""
    parts: list[np.ndarray] = []
    for wav, pause in zip(waves, pauses_s):
        parts.append(wav.astype(np.float32, copy=False))
        if pause > 0:
            parts.append(np.zeros(int(round(pause * sample_rate)), np.float32))
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)
