"""How one audio code is chosen from the GPT's logits, as transformers' ``generate`` does it
for XTTS-v2 (one beam).

In order: the repetition penalty (every code already in the sequence: a positive logit is
divided by the penalty, a negative one multiplied), then, when sampling, temperature,
top-k and top-p (nucleus), then a draw from the softmax; greedy decoding takes the argmax
right after the penalty. Everything runs in float32 on the logits' device; the set of
codes seen is a boolean mask updated in place, so a choice needs no host round trip.

Two facts of the reference carried over: the sequence the penalty looks at starts with the
reference's placeholder ids for the prefix (all ``1``) and the start-of-audio token, so
those two codes are penalised from the first step; and ``length_penalty`` is not used,
because it only scores beams and the reference decodes with ``num_beams=1``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from myxtts.model.xtts_v2.config import XttsV2Sampling

# The id the reference fills its prefix placeholders with; they join the penalised set.
_PLACEHOLDER_ID = 1


def check_sampling(sampling: XttsV2Sampling) -> None:
    """One-line errors for values transformers would refuse."""
    if not sampling.repetition_penalty > 0:
        raise ValueError(f"repetition_penalty must be > 0 (1.0 = off), got {sampling.repetition_penalty}")
    if not sampling.temperature > 0:
        raise ValueError(f"temperature must be > 0 (use greedy decoding for argmax), got {sampling.temperature}")
    if sampling.top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = off), got {sampling.top_k}")
    if not 0 <= sampling.top_p <= 1:
        raise ValueError(f"top_p must be in [0, 1] (1 = off), got {sampling.top_p}")


def penalize_repeats(scores: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """``scores [B, V]`` with the penalty applied where ``seen [B, V]``."""
    if penalty == 1.0:
        return scores
    penalized = torch.where(scores < 0, scores * penalty, scores / penalty)
    return torch.where(seen, penalized, scores)


def warp(scores: Tensor, temperature: float, top_k: int, top_p: float) -> Tensor:
    """Temperature, then top-k (ties with the k-th kept), then top-p: keep the smallest set
    of most likely codes whose probability reaches ``top_p`` (at least one); the rest go to
    ``-inf``."""
    if temperature != 1.0:
        scores = scores / temperature
    if top_k > 0:
        kth = torch.topk(scores, min(top_k, scores.shape[-1])).values[..., -1:]
        scores = scores.masked_fill(scores < kth, -float("inf"))
    if top_p < 1.0:
        ascending, order = torch.sort(scores, descending=False)
        drop = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
        drop[..., -1:] = False
        scores = scores.masked_fill(drop.scatter(1, order, drop), -float("inf"))
    return scores


class CodeChooser:
    """Chooses each row's next code; :meth:`remember` adds the codes kept to the penalised
    set (the decode loop calls it after a finished row's code became the stop token).

    ``greedy``: argmax after the penalty (temperature, top-k and top-p do not act).
    Otherwise one ``torch.multinomial`` draw per row from ``generator`` (the global
    generator when None, as the reference draws).
    """

    def __init__(self, sampling: XttsV2Sampling, batch: int, vocab: int, start_token: int,
                 device: torch.device, greedy: bool = False,
                 generator: torch.Generator | None = None) -> None:
        check_sampling(sampling)
        self.sampling = sampling
        self.greedy = greedy
        self.generator = generator
        self.seen = torch.zeros(batch, vocab, dtype=torch.bool, device=device)
        self.seen[:, [_PLACEHOLDER_ID, start_token]] = True

    def __call__(self, logits: Tensor) -> Tensor:
        """``logits [B, V]`` -> the chosen codes ``[B]`` (long, on the logits' device)."""
        s = self.sampling
        scores = penalize_repeats(logits.float(), self.seen, s.repetition_penalty)
        if self.greedy:
            codes = scores.argmax(dim=-1)
        else:
            probs = warp(scores, s.temperature, s.top_k, s.top_p).softmax(dim=-1)
            codes = torch.multinomial(probs, 1, generator=self.generator).squeeze(1)
        return codes

    def remember(self, codes: Tensor) -> None:
        """Add ``codes [B]`` to the penalised set."""
        self.seen.scatter_(1, codes[:, None], True)
