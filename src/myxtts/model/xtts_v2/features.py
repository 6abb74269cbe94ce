"""XTTS-v2's two mel features of 22.05 kHz audio, and the chunking of a voice's reference
audio for the GPT's conditioning.

Both are torchaudio power mels (80 HTK bands to 8 kHz, Slaney area normalisation, hop 256),
compressed as ``log(max(mel, 1e-5))`` and divided per band by ``mel_stats`` (the released
``mel_stats.pth``, also the model's ``mel_stats`` buffer). They differ in the STFT only:

* the cloning mel (the conditioning encoder's input): FFT 2048 over a 1024-sample window;
* the DVAE mel (what the DVAE turns into the GPT's target codes): FFT 1024 = window 1024.

The reference computes the DVAE mel twice, as ``dvae_wav_to_mel`` and as the GPT trainer's
``TorchMelSpectrogram`` (the one that makes the training codes); they are the same numbers
(same transform, same ``mel_stats``), the trainer's only dropping a channel axis
``[B, 1, S]``. The same is done here: :func:`dvae_mel` takes ``[..., S]``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from myxtts.audio.io import TRUNCATED_AUDIO, AudioError
from myxtts.audio.power_mel import PowerMel
from myxtts.model.xtts_v2.config import XttsV2Voice

SAMPLE_RATE = 22050
N_MELS = 80
F_MAX = 8000.0
HOP_LENGTH = 256
LOG_FLOOR = 1e-5
MIN_CHUNK_SECONDS = 0.33  # a shorter last chunk is dropped: too little speech for a latent


def cloning_mel_spec() -> PowerMel:
    """The cloning mel's power spectrogram: FFT 2048, window 1024, hop 256."""
    return PowerMel(SAMPLE_RATE, n_fft=2048, win_length=1024, hop_length=HOP_LENGTH,
                    n_mels=N_MELS, f_max=F_MAX, power=2.0, slaney_norm=True)


def dvae_mel_spec() -> PowerMel:
    """The DVAE mel's power spectrogram: FFT 1024, window 1024, hop 256."""
    return PowerMel(SAMPLE_RATE, n_fft=1024, win_length=1024, hop_length=HOP_LENGTH,
                    n_mels=N_MELS, f_max=F_MAX, power=2.0, slaney_norm=True)


def normalised_log(power: Tensor, mel_stats: Tensor) -> Tensor:
    """``[..., 80, F]`` mel power -> ``log(max(power, 1e-5)) / mel_stats`` per band."""
    return torch.log(torch.clamp(power, min=LOG_FLOOR)) / mel_stats.to(power)[:, None]


def cloning_mel(audio: Tensor, mel_stats: Tensor, spec: PowerMel | None = None) -> Tensor:
    """``[..., S]`` 22.05 kHz audio -> ``[..., 80, 1 + S // 256]`` conditioning mel. Pass
    ``spec`` (:func:`cloning_mel_spec`, on the audio's device) to reuse its filterbank."""
    spec = spec if spec is not None else cloning_mel_spec().to(audio.device)
    return normalised_log(spec(audio), mel_stats)


def dvae_mel(audio: Tensor, mel_stats: Tensor, spec: PowerMel | None = None) -> Tensor:
    """``[..., S]`` 22.05 kHz audio -> ``[..., 80, 1 + S // 256]`` DVAE input mel."""
    spec = spec if spec is not None else dvae_mel_spec().to(audio.device)
    return normalised_log(spec(audio), mel_stats)


def silent_tail_weights(lengths: Tensor, frames: int) -> tuple[int, Tensor] | None:
    """Frame weights that let a batch of zero-padded voice segments skip their silent tails.

    The segments' cloning mels have ``frames`` frames (``1 + samples // 256``); row ``b`` is
    ``lengths[b]`` samples of audio, then zeros. Its frames from ``r_b = ceil((lengths[b] +
    512) / 256) + 1`` on read only zeros (a frame's 1024-sample window spans 512 samples
    either side of its centre; the one extra frame is a margin), so they are the same vector
    exactly. Returns ``(keep, weights)``: the first ``keep`` frames of every row suffice, and
    ``weights [B, keep]`` (1 for a frame with audio; the rest of a row's silent frames shared
    among its kept silent ones) make ``conditioning``'s weighted encoder give what all frames
    give. None when nothing would be cut, or when some row's audio comes within 1024 samples
    of the segment's end (where the STFT's reflected padding reads it back)."""
    samples = (frames - 1) * HOP_LENGTH  # the shortest segment with this many frames
    first = (lengths.long() + 512 + HOP_LENGTH - 1) // HOP_LENGTH + 1
    if len(first) == 0 or bool((lengths > samples - 2 * 512).any()):
        return None
    keep = int(first.max()) + 1
    if keep >= frames:
        return None
    cols = torch.arange(keep, device=lengths.device)[None]
    share = (frames - first).double() / (keep - first).double()
    weights = torch.where(cols < first[:, None], 1.0, share[:, None])
    return keep, weights.float()


def cond_mel_chunks(audio: Tensor, mel_stats: Tensor,
                    length: int = XttsV2Voice.gpt_cond_len,
                    chunk_length: int = XttsV2Voice.gpt_cond_chunk_len,
                    spec: PowerMel | None = None) -> list[Tensor]:
    """The cloning mels of a voice's reference audio ``[..., S]`` at 22.05 kHz, one per
    ``chunk_length`` seconds of its first ``length`` seconds (all of it when ``length <= 0``);
    the GPT's conditioning latent is the mean of the chunks' latents. A last chunk shorter
    than 0.33 s is dropped. Defaults are the released ``config.json``'s
    (``gpt_cond_len`` 30, ``gpt_cond_chunk_len`` 4): a long clip gives at most 8 chunks."""
    if chunk_length <= 0:
        raise ValueError(f"gpt_cond_chunk_len must be a positive number of seconds, "
                         f"got {chunk_length}; set it in config.json or the call")
    if length > 0:
        audio = audio[..., :SAMPLE_RATE * length]
    step = SAMPLE_RATE * chunk_length
    spec = spec if spec is not None else cloning_mel_spec().to(audio.device)
    chunks = [cloning_mel(audio[..., start:start + step], mel_stats, spec)
              for start in range(0, audio.shape[-1], step)
              if audio[..., start:start + step].shape[-1] >= SAMPLE_RATE * MIN_CHUNK_SECONDS]
    if not chunks:
        raise AudioError(f"reference audio too short ({audio.shape[-1] / SAMPLE_RATE:.2f} s): "
                         f"a voice needs at least {MIN_CHUNK_SECONDS:.2f} s of speech",
                         TRUNCATED_AUDIO)
    return chunks
