"""XTTS-style acoustic model: conditioning encoder, text encoder, AR mel decoder, losses,
neural vocoder.

``layers`` (SDPA attention, norms, feed-forward, sinusoids, masks), ``conditioning``
(reference mel -> voice latents, a Perceiver resampler), ``text_encoder``, ``decoder``
(r frames per step, KV cache, guided-attention moments, postnet), ``xtts`` (the model,
``build_model``), ``losses``, ``vocoder/`` (generator, discriminators, GAN losses) and
``dummy`` (random batches in the collate contract for tests, benchmarks, dry runs).
"""

from myxtts.model.losses import compute_losses, per_utterance_losses
from myxtts.model.xtts import XTTS, build_model, count_parameters

__all__ = ["XTTS", "build_model", "compute_losses", "count_parameters", "per_utterance_losses"]
