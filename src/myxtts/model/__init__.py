"""XTTS-style acoustic model: conditioning encoder, text encoder, AR mel decoder, losses,
neural vocoder.

Map::

    layers.py         attention (SDPA), RMSNorm, feed-forward, sinusoids, masks
    conditioning.py   reference mel -> cond_latents voice latents (Perceiver resampler)
    text_encoder.py   tokens + language -> text encodings
    decoder.py        AR decoder (r frames/step, KV cache), guided-attention moments, postnet
    xtts.py           XTTS (forward / generate / alignment), build_model, count_parameters
    losses.py         compute_losses, per_utterance_losses
    vocoder/          neural vocoder: generator, GAN discriminators and losses
    dummy.py          random batches in the collate contract (tests, benchmarks, dry runs)
"""

from myxtts.model.losses import compute_losses, per_utterance_losses
from myxtts.model.xtts import XTTS, build_model, count_parameters

__all__ = ["XTTS", "build_model", "compute_losses", "count_parameters", "per_utterance_losses"]
