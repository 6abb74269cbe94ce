"""Band-limited resampling with a Hann-windowed sinc, as torchaudio's ``resample`` computes it
by default: the resampler of models trained with it (XTTS-v2 turns its reference clips to
22050 Hz and 16 kHz so), so that they hear what they were trained on.

The project's own loading resamples with soxr (``audio.io``), which is better and faster for
data; this one exists for equality with such a model's own front end. It is a strided 1-D
convolution: one kernel row per output phase, ``new // gcd`` rows of ``2 * width + old //
gcd`` taps, built once per rate pair (cached) and applied on the audio's device.
"""

from __future__ import annotations

import functools
import math

import torch

LOWPASS_WIDTH = 6  # zero crossings of the sinc each side: sharper with more, and slower
ROLLOFF = 0.99  # the cut-off, as a share of the lower rate's Nyquist frequency


@functools.lru_cache(maxsize=8)
def _kernel(old: int, new: int) -> tuple[torch.Tensor, int]:
    # float32 throughout and in this order, as the trained-with resampler builds it: the
    # same taps to the bit (float64 would be closer to the ideal filter, and differ by ~1e-4)
    cutoff = min(old, new) * ROLLOFF
    width = math.ceil(LOWPASS_WIDTH * old / cutoff)
    taps = torch.arange(-width, width + old, dtype=torch.float32)[None, None] / old
    t = torch.arange(0, -new, -1, dtype=torch.float32)[:, None, None] / new + taps
    t = (t * cutoff).clamp_(-LOWPASS_WIDTH, LOWPASS_WIDTH)
    window = torch.cos(t * math.pi / LOWPASS_WIDTH / 2) ** 2
    t = t * math.pi
    sinc = torch.where(t == 0, torch.tensor(1.0), t.sin() / t)
    return sinc * (window * (cutoff / old)), width


def sinc_resample(audio: torch.Tensor, old_rate: int, new_rate: int) -> torch.Tensor:
    """``[..., n]`` float audio at ``old_rate`` -> ``[..., ceil(n * new / old)]`` at ``new_rate``."""
    if old_rate == new_rate:
        return audio
    g = math.gcd(int(old_rate), int(new_rate))
    old, new = int(old_rate) // g, int(new_rate) // g
    kernel, width = _kernel(old, new)
    shape = audio.shape
    flat = torch.nn.functional.pad(audio.reshape(-1, shape[-1]), (width, width + old))
    out = torch.nn.functional.conv1d(flat[:, None], kernel.to(audio.device, audio.dtype), stride=old)
    out = out.transpose(1, 2).reshape(flat.shape[0], -1)[:, :math.ceil(new * shape[-1] / old)]
    return out.reshape(*shape[:-1], out.shape[-1])
