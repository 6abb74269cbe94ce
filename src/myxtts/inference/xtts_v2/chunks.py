"""Audio chunks of an XTTS-v2 utterance while its codes are generated, joined as the
reference streams them: every ``codes_per_chunk`` codes the waveform so far is decoded
again, its new part goes out, and the last ``overlap`` samples of each chunk are held back
and cross-faded (linearly) into the start of the next, because the end of a waveform
decoded from a prefix changes once more latents follow.

What differs from the reference is the cost: it decodes the whole utterance again for
every chunk (quadratic in the length); here the GPT latents are interpolated to the
HiFi-GAN's frame rate once per chunk (cheap, and the same frames as the whole utterance's)
and only the frames the new samples need are decoded, with ``CONTEXT_FRAMES`` frames of
context before them, more than the generator's receptive field, so each chunk holds the
same samples as the full decode (to float rounding), at a cost linear in the length.
"""

from __future__ import annotations

import torch

CONTEXT_FRAMES = 32  # HiFi-GAN input frames decoded before the first sample needed (its
# receptive field is ~13 frames; more costs a little time per chunk, fewer changes samples)


class CrossfadeJoiner:
    """The reference's chunk arithmetic over global sample positions. Feed it, per chunk,
    the waveform from ``start()`` to the end of what is decoded so far; it returns the
    samples to emit now."""

    def __init__(self, overlap: int) -> None:
        self.overlap = overlap
        self.decoded = 0  # samples of the waveform decoded at the previous chunk
        self.held: torch.Tensor | None = None  # its last ``overlap`` samples, not yet emitted

    def start(self) -> int:
        """The first sample the next chunk needs: where the held-back overlap begins."""
        return max(0, self.decoded - self.overlap) if self.decoded else 0

    def push(self, tail: torch.Tensor, total: int, final: bool) -> torch.Tensor:
        """``tail``: samples ``[start(), total)`` of the waveform as decoded now (``total``
        samples long); returns the chunk to emit."""
        end = None if final else tail.shape[0] - self.overlap
        chunk = tail[:end].clone()
        if self.held is not None:
            if self.overlap > chunk.shape[0]:
                # too short to cross-fade: the reference emits the rest as it is, fade-free
                chunk = tail.clone()
                self.held = None
                self.decoded = total
                return chunk
            fade_in = torch.linspace(0.0, 1.0, self.overlap, device=chunk.device)
            fade_out = torch.linspace(1.0, 0.0, self.overlap, device=chunk.device)
            chunk[:self.overlap] = self.held * fade_out + chunk[:self.overlap] * fade_in
        self.held = None if final else tail[-self.overlap:].clone()
        self.decoded = total
        return chunk
