"""XTTS-v2's waveform decoder: a HiFi-GAN generator that turns the GPT's last hidden states
(not a mel) into 24 kHz audio, conditioned on a 512-d speaker embedding, and the container
(``hifigan_decoder`` in the released ``model.pth``) that holds it with the speaker encoder.

The generator is HiFi-GAN V1's shape with XTTS-v2's settings: 512 initial channels,
upsampling x8 x8 x2 x2 (256 samples per input frame), multi-receptive-field blocks of
kernels 3/7/11 and dilations 1/3/5, the speaker embedding added through a 1x1 conv after
the input conv and after every upsampling layer, no bias on the output conv.

On the CPU the generator runs on ``[B, C, 1, T]`` tensors in the channels-last layout (each
1-D conv as the 2-D conv it is computed as anyway): oneDNN's convolutions over few channels
and long time axes run up to 3x faster in that layout (measured on 2 cores at the released
size: the 32- and 64-channel stages). The whole decoder gains 1.24-1.30x on a length it has
seen before and 1.06-1.17x on a new one (oneDNN builds its kernels per shape, and each
utterance's length is new), with the same results to float rounding (~1e-7). Elsewhere
(CUDA) the tensors keep the usual layout, which is what a 1-D conv runs on there.

Weight norm is folded: each conv holds the one ``weight`` it computes with, so inference
never recomputes ``g * v / ||v||`` per call (the reference keeps the parametrisation live
in eval). The released file's pairs become plain weights when it is read, and are split
again when it is written (``artifacts.xtts_v2.weight_norm``). Fine-tuning on
folded weights trains the same function with a different parametrisation (no magnitude
/ direction split), which is a change of optimiser geometry, not of the model.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from myxtts.model.xtts_v2.config import XttsV2Args, XttsV2Config
from myxtts.model.xtts_v2.speaker import XttsSpeakerResNet

INITIAL_CHANNELS = 512
UPSAMPLE_RATES = (8, 8, 2, 2)
UPSAMPLE_KERNELS = (16, 16, 4, 4)
RESBLOCK_KERNELS = (3, 7, 11)
RESBLOCK_DILATIONS = (1, 3, 5)
SLOPE = 0.1  # leaky ReLU inside the network
FINAL_SLOPE = 0.01  # before the output conv the reference uses torch's default slope



def conv(layer: nn.Conv1d | nn.ConvTranspose1d, x: Tensor) -> Tensor:
    """``layer`` applied to ``x [B, C, 1, T]`` as the 2-D conv of kernel ``(1, k)`` it is
    (its weight viewed, not copied); the output keeps ``x``'s memory layout."""
    w = layer.weight.unsqueeze(2)
    stride, padding, dilation = (1, layer.stride[0]), (0, layer.padding[0]), (1, layer.dilation[0])
    if isinstance(layer, nn.ConvTranspose1d):
        return F.conv_transpose2d(x, w, layer.bias, stride, padding, (0, layer.output_padding[0]),
                                  layer.groups, dilation)
    return F.conv2d(x, w, layer.bias, stride, padding, dilation, layer.groups)


class XttsResBlock(nn.Module):
    """HiFi-GAN's type-1 residual block: three steps of (leaky ReLU, dilated conv, leaky
    ReLU, conv) each added back to the input. ``[B, C, 1, T] -> [B, C, 1, T]`` (see
    :func:`conv`)."""

    def __init__(self, channels: int, kernel: int, dilations: tuple[int, ...] = RESBLOCK_DILATIONS):
        super().__init__()
        self.convs1 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel, dilation=d, padding=d * (kernel - 1) // 2)
            for d in dilations)
        self.convs2 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel, padding=(kernel - 1) // 2) for _ in dilations)

    def forward(self, x: Tensor) -> Tensor:
        # in place wherever the tensor is a fresh conv output that backward does not
        # read (a conv saves its input, not its output): each saves an allocation and a
        # memory pass over tensors of up to 32 x 256 values per input frame
        for dilated, plain in zip(self.convs1, self.convs2, strict=True):
            y = conv(plain, F.leaky_relu(conv(dilated, F.leaky_relu(x, SLOPE)), SLOPE, inplace=True))
            x = y.add_(x)
        return x


class XttsHifiGan(nn.Module):
    """``x [B, in_channels, T]`` (and the speaker embedding ``g [B, cond_channels, 1]``) ->
    waveform ``[B, 1, T * 256]`` in [-1, 1].

    Cost: the last two stages (128 and 64 -> 32 channels at 128x and 256x the frame rate)
    take most of the time, in the 9 convs of kernels up to 11 per stage."""

    def __init__(self, in_channels: int, cond_channels: int = 512, cond_each_up: bool = True):
        super().__init__()
        self.conv_pre = nn.Conv1d(in_channels, INITIAL_CHANNELS, 7, padding=3)
        widths = [INITIAL_CHANNELS // 2 ** i for i in range(len(UPSAMPLE_RATES) + 1)]
        self.ups = nn.ModuleList(
            nn.ConvTranspose1d(widths[i], widths[i + 1], k, u, padding=(k - u) // 2)
            for i, (u, k) in enumerate(zip(UPSAMPLE_RATES, UPSAMPLE_KERNELS, strict=True)))
        self.resblocks = nn.ModuleList(
            XttsResBlock(width, k) for width in widths[1:] for k in RESBLOCK_KERNELS)
        self.conv_post = nn.Conv1d(widths[-1], 1, 7, padding=3, bias=False)
        self.cond_layer = nn.Conv1d(cond_channels, INITIAL_CHANNELS, 1)
        self.conds = (nn.ModuleList(nn.Conv1d(cond_channels, w, 1) for w in widths[1:])
                      if cond_each_up else None)

    @property
    def samples_per_frame(self) -> int:
        return math.prod(UPSAMPLE_RATES)

    def forward(self, x: Tensor, g: Tensor) -> Tensor:
        layout = torch.channels_last if x.device.type == "cpu" else torch.contiguous_format
        x = x.unsqueeze(2).contiguous(memory_format=layout)  # [B, C, 1, T], see the module doc
        o = conv(self.conv_pre, x).add_(self.cond_layer(g).unsqueeze(-1))
        n_kernels = len(RESBLOCK_KERNELS)
        for i, up in enumerate(self.ups):
            o = conv(up, F.leaky_relu(o, SLOPE, inplace=True))
            if self.conds is not None:
                o.add_(self.conds[i](g).unsqueeze(-1))
            blocks = self.resblocks[i * n_kernels:(i + 1) * n_kernels]
            total = blocks[0](o)
            for block in blocks[1:]:
                total.add_(block(o))
            o = total.div_(n_kernels)
        out = conv(self.conv_post, F.leaky_relu(o, FINAL_SLOPE, inplace=True))  # [B, 1, 1, S]
        return torch.tanh(out.squeeze(2)).contiguous()


class XttsLatentDecoder(nn.Module):
    """The released ``hifigan_decoder``: GPT latents ``[B, T, D]`` and the speaker
    embedding ``[B, 512, 1]`` -> 24 kHz waveform ``[B, 1, S]``.

    The GPT emits one latent per code (``gpt_code_stride_len`` = 1024 samples at
    22.05 kHz); they are stretched linearly to one frame per ``output_hop_length`` (x4),
    then by 24000 / 22050 so that the generator's fixed 256 samples per frame come out at
    24 kHz: ``S = 256 * floor(floor(4 T) * 24000 / 22050)``. ``speaker_encoder`` makes the
    embedding from 16 kHz audio (:meth:`speaker_embedding`)."""

    def __init__(self, args: XttsV2Args | None = None):
        super().__init__()
        args = args or XttsV2Args()
        self.code_stride = args.gpt_code_stride_len
        self.hop_length = args.output_hop_length
        self.input_sample_rate = args.input_sample_rate
        self.output_sample_rate = args.output_sample_rate
        self.waveform_decoder = XttsHifiGan(args.decoder_input_dim, args.d_vector_dim,
                                            args.cond_d_vector_in_each_upsampling_layer)
        self.speaker_encoder = XttsSpeakerResNet(proj_dim=args.d_vector_dim)

    @classmethod
    def from_config(cls, config: XttsV2Config) -> XttsLatentDecoder:
        return cls(config.args)

    @property
    def samples_per_frame(self) -> int:
        """Output samples per generator input frame (the product of its upsampling rates)."""
        return self.waveform_decoder.samples_per_frame

    def frames(self, latents: Tensor) -> Tensor:
        """GPT latents ``[B, T, D]`` -> the generator's input frames ``[B, D, F]``: each
        sample of the output depends only on the frames near it, so a stream can decode a
        window of these (``inference.xtts_v2.chunks``)."""
        # scale_factor (not a size) as the reference: linear interpolation's sampling
        # positions come from the factor, so a size would move them by a rounding
        z = F.interpolate(latents.transpose(1, 2), scale_factor=[self.code_stride / self.hop_length],
                          mode="linear")
        if self.output_sample_rate != self.input_sample_rate:
            z = F.interpolate(z, scale_factor=[self.output_sample_rate / self.input_sample_rate],
                              mode="linear")
        return z

    def forward(self, latents: Tensor, speaker: Tensor) -> Tensor:
        return self.waveform_decoder(self.frames(latents), speaker)

    def speaker_embedding(self, audio_16k: Tensor) -> Tensor:
        """``[B, S]`` 16 kHz audio -> unit-norm speaker embedding ``[B, 512, 1]``."""
        return self.speaker_encoder(audio_16k, l2_norm=True).unsqueeze(-1)
