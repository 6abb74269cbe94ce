"""XTTS-v2's GPT as it fine-tunes: a batch of the XTTS store in, the loss terms out, with no
host read and no shape that depends on the values (so the step compiles once per bucket
shape and is captured as a CUDA graph).

The losses are the reference trainer's: the text and audio-code cross-entropies of the
teacher-forced GPT (``XttsGpt.forward``'s layout: start/stop tokens, codes past a clip's
``ceil(samples / 1024) + 3`` replaced by the stop code, padding hidden from attention and
ignored in the loss) weighted 0.01 and 1.0 by default, the voice from the cloning mel of a
segment of the same clip. What differs from ``XttsGpt.forward`` is only where the batch's
maxima are read: the reference cuts the batch to its longest text and code rows (two host
reads); here rows keep the bucket's padded widths and the one value that depends on the
longest text row, the column where the text's stop token is written, is placed by a
comparison on the device. The positions beyond a row are hidden and ignored either way, so
the losses are the reference's (tests/xtts_v2/test_trainee.py: within 1e-5).

The reference also ignores, in the code loss of the batch's *last* row only, the targets
from ``cond_idxs // 256`` (the segment the voice was cut from, in samples divided by 256):
kept, so that losses equal the reference's; validation passes no ``cond_idxs`` (as the
reference's evaluation does) and nothing is ignored there.

What the batch holds (``myxtts.train.xtts.batches``): ``text [B, L]`` XTTS text ids (0 after
``text_lengths``), ``codes [B, T]`` DVAE codes, ``wav_lengths [B]`` the clip's samples at
22.05 kHz, ``cond_audio [B, S]`` the voice segment zero-padded to S samples (or ``cond_mel
[B, 80, 1 + S // 256]``, its cloning mel, :meth:`XttsGptTrainee.cond_mel`), optionally
``cond_lengths [B]`` its samples before the padding and ``cond_idxs [B, 2]`` its first and
end sample in the clip.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from myxtts.model.xtts_v2.conditioning import PackedRows
from myxtts.model.xtts_v2.features import cloning_mel_spec, normalised_log, silent_tail_weights
from myxtts.model.xtts_v2.gpt import XttsGpt

# the reference divides the segment's sample indices by this before masking code targets
SEGMENT_DIVISOR = 256
TEXT_WEIGHT = 0.01  # the reference trainer's gpt_loss_text_ce_weight
CODE_WEIGHT = 1.0  # its gpt_loss_mel_ce_weight
LOSS_TERMS = ("loss", "text_ce", "code_ce")


class XttsGptTrainee(nn.Module):
    """``gpt`` with the cloning-mel front end and the weighted losses (module docstring).

    Its ``state_dict`` is the GPT's under ``gpt.``, the names of the released ``model.pth``
    (the front end's filterbank and the mel statistics are not saved: the XTTS folder
    holds them)."""

    def __init__(self, gpt: XttsGpt, mel_stats: Tensor, text_weight: float = TEXT_WEIGHT,
                 code_weight: float = CODE_WEIGHT) -> None:
        super().__init__()
        self.gpt = gpt
        self.cond_spec = cloning_mel_spec()
        self.register_buffer("mel_stats", mel_stats.detach().float().clone(), persistent=False)
        self.text_weight, self.code_weight = float(text_weight), float(code_weight)

    def cond_mel(self, cond_audio: Tensor) -> Tensor:
        """``[B, S]`` segment -> ``[B, 80, 1 + S // 256]`` cloning mel, in float32 (the
        reference computes it outside autocast)."""
        with torch.autocast(cond_audio.device.type, enabled=False):
            return normalised_log(self.cond_spec(cond_audio.float()), self.mel_stats)

    def voice(self, batch: dict[str, Tensor]) -> Tensor:
        """The conditioning latents of the batch's voice segments (their cloning mels
        ``cond_mel`` where the loader made them, else made here from ``cond_audio``).

        Eager on the CPU, with the segments' lengths (``cond_lengths``), each row is cut to
        its own frames, its silent zero padding kept as one weighted frame
        (``features.silent_tail_weights``), and the rows run packed end to end
        (``conditioning.PackedRows``): the same latents with neither the tail's frames nor
        the batch's padding to the longest segment (the attention's cost grows with the
        square of the frames). Elsewhere every frame runs in one batch, so that shapes never
        depend on the values (the lengths would be a host read and a new shape per batch on
        a GPU)."""
        mel = batch.get("cond_mel")
        if mel is None:
            mel = self.cond_mel(batch["cond_audio"])
        lengths = batch.get("cond_lengths")
        if lengths is None or mel.device.type != "cpu" or torch.compiler.is_compiling():
            return self.gpt.conditioning_latents(mel)
        frames, weights = mel.shape[-1], []
        for row in range(mel.shape[0]):
            tail = silent_tail_weights(lengths[row:row + 1], frames)
            weights.append(mel.new_ones(frames, dtype=torch.float32) if tail is None
                           else tail[1][0])
        rows = [mel[row, :, :len(w)] for row, w in enumerate(weights)]
        return self.gpt.conditioning_latents(torch.cat(rows, dim=1).t(), PackedRows.of(weights))

    def forward(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        g = self.gpt
        text, text_lengths = batch["text"], batch["text_lengths"]
        codes, wav_lengths = batch["codes"], batch["wav_lengths"]
        cond = self.voice(batch)
        width_t, width_c = text.shape[1], codes.shape[1]
        # the text's stop token sits at the longest row's end (the reference cuts there)
        text_cols = torch.arange(width_t + 1, device=text.device)
        text = F.pad(text, (0, 1)).masked_fill(text_cols == text_lengths.max(), g.stop_text_token)
        code_lengths = torch.div(wav_lengths + g.code_stride - 1, g.code_stride,
                                 rounding_mode="floor") + 3
        code_cols = torch.arange(width_c + 1, device=codes.device)
        beyond = code_cols[None] >= (code_lengths - 3)[:, None]
        codes = F.pad(codes, (0, 1)).masked_fill(beyond, g.stop_audio_token)
        text_in = F.pad(text, (1, 0), value=g.start_text_token)
        text_tgt = F.pad(text, (0, 1), value=g.stop_text_token)
        mel_in = F.pad(codes, (1, 0), value=g.start_audio_token)
        mel_tgt = F.pad(codes, (0, 1), value=g.stop_audio_token)
        text_pad = torch.arange(text_in.shape[1], device=text.device)[None] > text_lengths[:, None]
        mel_pos = torch.arange(mel_in.shape[1], device=codes.device)
        mel_pad = mel_pos[None] > code_lengths[:, None]
        text_h, mel_h = g._run(cond, text_in, mel_in, torch.cat([~text_pad, ~mel_pad], dim=1))
        text_tgt = text_tgt.masked_fill(text_pad, -1)
        mel_tgt = mel_tgt.masked_fill(mel_pad, -1)
        idxs = batch.get("cond_idxs")
        if idxs is not None:  # the last row's segment (module docstring)
            start, end = idxs[-1, 0] // SEGMENT_DIVISOR, idxs[-1, 1] // SEGMENT_DIVISOR
            last_row = torch.zeros_like(mel_pad)
            last_row[-1] = (mel_pos >= start) & (mel_pos < end)
            mel_tgt = mel_tgt.masked_fill(last_row, -1)
        text_ce = F.cross_entropy(g.text_head(text_h).float().transpose(1, 2), text_tgt,
                                  ignore_index=-1)
        code_ce = F.cross_entropy(g.mel_head(mel_h).float().transpose(1, 2), mel_tgt,
                                  ignore_index=-1)
        loss = self.text_weight * text_ce + self.code_weight * code_ce
        return {"loss": loss, "text_ce": text_ce, "code_ce": code_ce}
