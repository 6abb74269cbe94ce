"""Model FLOPs of one XTTS-v2 fine-tuning micro-batch, counted as the TTS model's are
(``train.efficiency``): ``FlopCounterMode`` over the forward and backward of the trainee,
built on the ``meta`` device (shapes only: no memory, no arithmetic, no random numbers, the
run's weights untouched), on the task's worst case of the batch's padded shape.

What is counted: the GPT's blocks over the conditioning, text and code positions, its heads
and losses, and the conditioning encoder and perceiver over the voice segment's mel frames
(``1 + samples // 256`` per row), forward and backward. What is not: the cloning-mel front
end (an STFT, which ``FlopCounterMode`` does not count, and a filterbank product without
gradient, well under a thousandth of the step); here it hands the encoder zeros of its shape.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from myxtts.data.batch import BatchShape
from myxtts.model.xtts_v2.config import XttsV2Config
from myxtts.model.xtts_v2.gpt import XttsGpt
from myxtts.model.xtts_v2.trainee import XttsGptTrainee
from myxtts.observe.flops import count_flops
from myxtts.train.xtts.task import XttsTask

N_MELS = 80  # the cloning mel's bands


class _ShapedFrontEnd(XttsGptTrainee):
    """The trainee with the cloning mel replaced by zeros of its shape (module docstring)."""

    def cond_mel(self, cond_audio: Tensor) -> Tensor:
        b, samples = cond_audio.shape
        return cond_audio.new_zeros(b, N_MELS, 1 + samples // 256)


def xtts_batch_key(batch: dict[str, Tensor]) -> tuple[int, int, int]:
    """The counter's key of a batch: ``(B, L_text, T_codes)`` of its padded shape."""
    return (int(batch["codes"].shape[0]), int(batch["text"].shape[1]),
            int(batch["codes"].shape[1]))


def xtts_step_counter(config: XttsV2Config, ref_samples: int) -> Callable[[tuple], float]:
    """``count((B, L_text, T_codes))``: forward + backward FLOPs of one fine-tuning micro-batch
    of that padded shape with voice segments of ``ref_samples`` samples."""
    with torch.device("meta"):
        model = _ShapedFrontEnd(XttsGpt(config), torch.zeros(N_MELS))
    model.train()
    task = XttsTask(config.number_text_tokens, config.args.gpt_num_audio_tokens,
                    config.args.gpt_code_stride_len)

    def count(key: tuple) -> float:
        b, text, codes = (int(k) for k in key[:3])
        shape = BatchShape(b, text, codes, int(ref_samples), N_MELS)
        batch = {k: v.to("meta") for k, v in task.worst_case(shape, "cpu").items()}

        def step() -> None:
            task.losses(model, batch, None)["loss"].backward()

        try:
            return count_flops(step)
        finally:
            model.zero_grad(set_to_none=True)

    return count
