"""Decoding XTTS-v2's audio codes: the GPT run one code at a time over a static KV cache,
equal to the reference's ``gpt.generate`` (HF ``generate``, one beam) and, for streaming,
its ``get_generator``.

- :func:`generate_codes`: all codes of each row, ``[B, n]``. A row that stopped keeps its
  stop token and is padded with stop tokens until every row stopped, as HF pads finished
  rows; decoding ends when every row stopped or after ``max_codes``. The stop token is
  *included* (as the reference returns it) and the reference feeds these codes, stop
  included, to the latent forward (``XttsGpt.latents_for_codes``): one latent per code.
- :func:`stream_codes`: an iterator of ``(code [B], latent [B, D])``, one pair per code,
  stop included: the latent is the ``final_norm`` state that produced the code, what the
  reference's ``inference_stream`` gathers and decodes in chunks.
- :func:`decode_pieces`: several texts of different lengths decoded together, one batch
  (each row's codes and latents up to its own stop). A step reads every GPT weight once
  for all rows, so on a CPU, where a step's cost is that read, B pieces cost about what
  one costs. The rows are left-padded in the KV cache (``XttsGpt.prefill``); greedy codes
  equal each piece decoded alone, latents to float rounding (a GEMM over B rows rounds
  differently from one over 1). Sampled rows draw from one generator in one draw per
  step, so a batch's sampled codes differ from those of the same pieces decoded one after
  another (each is an equally likely sample).

On a GPU the one-code step replays as a CUDA graph captured after the prefill
(``inference.xtts_v2.graphed``), falling back to the eager step if the capture fails.
Per code the host does one thing: read whether every row has stopped, a device sync that
keeps the host from queueing the next step while this one runs (on a GPU: an idle gap of
about one kernel launch per code). :func:`generate_codes` can read it every
``stop_check_every`` codes instead, at the price of up to ``stop_check_every - 1`` wasted
steps after the last row stopped (each a full forward of one position; the extra codes are
cut off). Streaming checks every code: its consumer reads every code anyway.

Differences from the reference: :func:`stream_codes` with ``greedy=True`` takes the argmax;
the reference's streaming path always samples (with ``do_sample=False`` it draws from the
penalised softmax at temperature 1, no top-k/top-p).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from myxtts.inference.xtts_v2.graphed import graphed_step
from myxtts.inference.xtts_v2.sampling import CodeChooser
from myxtts.model.xtts_v2.config import XttsV2Sampling
from myxtts.model.xtts_v2.gpt import XttsGpt

_DEFAULT_SAMPLING = XttsV2Sampling()
GRAPH_MIN_CODES = 8  # on a GPU, fewer codes than this decode eagerly: the capture costs a step


def pad_rows(rows: list[Tensor]) -> tuple[Tensor, Tensor]:
    """1-D token tensors -> ``tokens [B, T]`` right-padded with zeros and ``lengths [B]``."""
    lengths = torch.tensor([r.shape[0] for r in rows], device=rows[0].device)
    tokens = torch.zeros(len(rows), int(lengths.max()), dtype=rows[0].dtype, device=rows[0].device)
    for i, r in enumerate(rows):
        tokens[i, :r.shape[0]] = r
    return tokens, lengths


def _limits(gpt: XttsGpt, text_tokens: Tensor, max_codes: int | None) -> int:
    """The code cap, after one-line checks of the request against the model's tables."""
    if text_tokens.ndim != 2:
        raise ValueError(f"text_tokens must be [batch, tokens], got shape {tuple(text_tokens.shape)}")
    text_room = gpt.text_pos_embedding.emb.num_embeddings - 2  # [START] and [STOP]
    if text_tokens.shape[1] > text_room:
        raise ValueError(f"{text_tokens.shape[1]} text tokens exceed the model's {text_room}; "
                         "split the text into shorter sentences")
    limit = gpt.max_gen_mel_tokens
    n = limit if max_codes is None else max_codes
    if not 1 <= n <= limit:
        raise ValueError(f"max_codes must be in [1, {limit}] (the model's longest output), got {n}")
    return n


def _decode(gpt: XttsGpt, cond_latents: Tensor, text_tokens: Tensor, sampling: XttsV2Sampling,
            greedy: bool, max_codes: int, generator: torch.Generator | None,
            text_lengths: Tensor | None = None) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
    """``(code [B], state [B, D], finished [B])`` per code, up to ``max_codes``; ``finished``
    is one tensor updated in place. A finished row goes on being run (its stop token fed
    back; its outputs ignored): dropping it from the batch would cost a copy of the cache
    and, on a GPU, a new graph, for a step whose cost hardly depends on the rows."""
    b, t = text_tokens.shape
    stop = gpt.stop_audio_token
    cache = gpt.gpt.new_cache(b, gpt.prefix_length(t) + max_codes - 1)
    logits, state = gpt.prefill(cond_latents, text_tokens, cache, text_lengths)
    graphed = graphed_step(gpt, cache) if max_codes >= GRAPH_MIN_CODES else None
    chooser = CodeChooser(sampling, b, logits.shape[-1], gpt.start_audio_token, logits.device,
                          greedy, generator)
    finished = torch.zeros(b, dtype=torch.bool, device=logits.device)
    for i in range(max_codes):
        code = chooser(logits).masked_fill(finished, stop)
        chooser.remember(code)
        finished |= code == stop
        yield code, state, finished
        if i + 1 < max_codes:  # run only when the consumer asks for the next code
            logits, state = graphed(code) if graphed is not None else gpt.step(code, cache)


@torch.inference_mode()
def generate_codes(gpt: XttsGpt, cond_latents: Tensor, text_tokens: Tensor,
                   sampling: XttsV2Sampling = _DEFAULT_SAMPLING, *, greedy: bool = False,
                   max_codes: int | None = None, generator: torch.Generator | None = None,
                   stop_check_every: int = 1, text_lengths: Tensor | None = None) -> Tensor:
    """Audio codes ``[B, n]`` for ``text_tokens [B, T]`` in the voice ``cond_latents
    [B or 1, 32, D]``; ``text_lengths [B]`` where rows are right-padded to ``T`` (None: every
    row is ``T`` tokens).

    ``sampling``: repetition penalty, temperature, top-k, top-p. ``greedy``:
    argmax after the repetition penalty, deterministic. ``max_codes``: at most this many
    codes (default and upper bound: ``gpt.max_gen_mel_tokens``). ``generator``: the random
    draws' source (default: torch's global one). ``stop_check_every``: see the module
    docstring.
    """
    if stop_check_every < 1:
        raise ValueError(f"stop_check_every must be >= 1, got {stop_check_every}")
    n_max = _limits(gpt, text_tokens, max_codes)
    stop = gpt.stop_audio_token
    out = torch.full((text_tokens.shape[0], n_max), stop, dtype=torch.long, device=cond_latents.device)
    n = 0
    for i, (code, _, finished) in enumerate(
            _decode(gpt, cond_latents, text_tokens, sampling, greedy, n_max, generator,
                    text_lengths)):
        out[:, i] = code
        n = i + 1
        if n % stop_check_every == 0 and bool(finished.all()):
            break
    stopped = out[:, :n] == stop
    if stop_check_every > 1 and bool(stopped.any(dim=1).all()):
        n = int(stopped.int().argmax(dim=1).max()) + 1  # the step at which the last row stopped
    return out[:, :n]


@torch.inference_mode()  # each step of the generator runs under it
def stream_codes(gpt: XttsGpt, cond_latents: Tensor, text_tokens: Tensor,
                 sampling: XttsV2Sampling = _DEFAULT_SAMPLING, *, greedy: bool = False,
                 max_codes: int | None = None, generator: torch.Generator | None = None,
                 text_lengths: Tensor | None = None) -> Iterator[tuple[Tensor, Tensor]]:
    """``(code [B], latent [B, D])`` per code, as :func:`generate_codes` chooses them (same
    arguments); the pair with the stop token is the last. Concatenated over time, the
    latents are the HiFi-GAN decoder's input for the codes so far."""
    n_max = _limits(gpt, text_tokens, max_codes)
    for code, state, finished in _decode(gpt, cond_latents, text_tokens, sampling, greedy,
                                         n_max, generator, text_lengths):
        yield code, state
        if bool(finished.all()):
            return


@torch.inference_mode()
def decode_pieces(gpt: XttsGpt, cond_latents: Tensor, pieces: list[Tensor],
                  sampling: XttsV2Sampling = _DEFAULT_SAMPLING, *, greedy: bool = False,
                  max_codes: int | None = None, generator: torch.Generator | None = None,
                  ) -> list[tuple[Tensor, Tensor]]:
    """Each piece's ``(codes [n], latents [n, D])``, the pieces (1-D token tensors, any
    lengths) decoded together in the voice ``cond_latents [1, 32, D]`` (see the module
    docstring): a row's codes end at its own stop token (included) or after ``max_codes``;
    its latents are the states that chose them, what :func:`stream_codes` yields."""
    tokens, lengths = pad_rows(pieces)
    n_max = _limits(gpt, tokens, max_codes)
    codes, states = [], []
    for code, state, finished in _decode(gpt, cond_latents, tokens, sampling, greedy, n_max,
                                         generator, lengths):
        codes.append(code.clone())
        states.append(state)
        if bool(finished.all()):
            break
    codes_t, states_t = torch.stack(codes, dim=1), torch.stack(states, dim=1)  # [B, n], [B, n, D]
    stopped = codes_t == gpt.stop_audio_token
    ends = torch.where(stopped.any(dim=1), stopped.int().argmax(dim=1) + 1, codes_t.shape[1])
    return [(codes_t[i, :int(n)], states_t[i, :int(n)]) for i, n in enumerate(ends)]
