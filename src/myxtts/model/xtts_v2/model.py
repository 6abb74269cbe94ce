"""XTTS-v2 whole: the GPT (``gpt``), the HiFi-GAN decoder with its speaker encoder
(``hifigan_decoder``) and the mel statistics the conditioning mels are divided by
(``mel_stats``), with the released ``model.pth``'s state-dict names (see
``artifacts.xtts_v2`` for the two ways the released file spells a few of them).

What a voice is made of, from reference audio at 22050 Hz: the GPT's conditioning latents
(the mean over chunks of the clip's cloning mel, ``features.cond_mel_chunks``) and the
speaker embedding (the clip at 16 kHz through the ResNet speaker encoder, resampled as
the model was trained: ``audio.sinc_resample``). What is spoken is the GPT's codes,
turned back into its latents (``XttsGpt.latents_for_codes``) and decoded to 24 kHz.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from myxtts.audio.sinc_resample import sinc_resample
from myxtts.model.xtts_v2.config import XttsV2Config, XttsV2Voice
from myxtts.model.xtts_v2.features import cond_mel_chunks
from myxtts.model.xtts_v2.gpt import XttsGpt
from myxtts.model.xtts_v2.hifigan import XttsLatentDecoder

N_MELS = 80
SPEAKER_RATE = 16000  # the speaker encoder's input rate


class XttsV2Model(nn.Module):
    def __init__(self, config: XttsV2Config) -> None:
        super().__init__()
        # the GPT may run in bfloat16 (set_gpt_dtype); the decoder and voices stay float32
        self.config = config
        self.gpt = XttsGpt(config)
        self.hifigan_decoder = XttsLatentDecoder.from_config(config)
        self.register_buffer("mel_stats", torch.ones(N_MELS))

    def set_gpt_dtype(self, dtype: torch.dtype) -> None:
        """Run the GPT in ``dtype``: bfloat16 halves the weights read per code, what bounds
        decoding at batch 1 (on a CPU with bf16 GEMV kernels ~1.5x faster per code, and the
        natural choice on a GPU), at the price of codes that may differ from float32's."""
        self.gpt.to(dtype)

    @property
    def sample_rate(self) -> int:
        return self.config.args.output_sample_rate

    @property
    def input_rate(self) -> int:
        return self.config.args.input_sample_rate

    def conditioning_latents(self, audio: Tensor, voice: XttsV2Voice | None = None) -> Tensor:
        """``[1, S]`` reference audio at 22050 Hz -> the GPT's conditioning ``[1, 32, D]``:
        the mean of its chunks' latents (``gpt_cond_len`` seconds in ``gpt_cond_chunk_len``
        chunks). AudioError when no chunk is long enough."""
        return voice_latents(self.gpt, audio, self.mel_stats, voice or self.config.voice)

    def speaker_embedding(self, audio: Tensor) -> Tensor:
        """``[1, S]`` reference audio at 22050 Hz -> unit-norm speaker embedding ``[1, 512, 1]``."""
        return self.hifigan_decoder.speaker_embedding(sinc_resample(audio, self.input_rate,
                                                                    SPEAKER_RATE))

    def waveform(self, latents: Tensor, speaker: Tensor) -> Tensor:
        """``[B, n, D]`` latents -> ``[B, S]`` 24 kHz audio in the voice of ``speaker`` (the
        decoder runs in float32 whatever the GPT's precision)."""
        return self.hifigan_decoder(latents.float(), speaker.float())[:, 0]


def voice_latents(gpt: XttsGpt, audio: Tensor, mel_stats: Tensor, voice: XttsV2Voice) -> Tensor:
    """The conditioning ``[1, 32, D]`` of ``gpt`` for ``[1, S]`` reference audio at 22050 Hz
    (:meth:`XttsV2Model.conditioning_latents`; also what a fine-tuning run's evaluation
    conditions its GPT on)."""
    chunks = cond_mel_chunks(audio, mel_stats, voice.gpt_cond_len, voice.gpt_cond_chunk_len)
    dtype = gpt.final_norm.weight.dtype  # the GPT's own (bfloat16 where chosen)
    return torch.stack([gpt.conditioning_latents(m.to(dtype)).float()
                        for m in chunks]).mean(dim=0)


def stretch(latents: Tensor, speed: float) -> Tensor:
    """Latents ``[B, n, D]`` resampled linearly by ``1 / speed`` (a time stretch of the speech
    the decoder makes; the reference's ``length_scale``, floored at speed 0.05)."""
    scale = 1.0 / max(speed, 0.05)
    if scale == 1.0:
        return latents
    return F.interpolate(latents.transpose(1, 2), scale_factor=scale, mode="linear").transpose(1, 2)
