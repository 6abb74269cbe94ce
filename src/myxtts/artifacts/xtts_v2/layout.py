"""The released XTTS-v2 state dicts' names and shapes, computed from the config: what
``model.pth`` (after folding weight norm and dropping the speaker encoder's feature
buffers) and ``dvae.pth`` must hold, so that each file is checked name by name and shape by
shape before any network is built, and a mismatch names the key and the shape it needs.

Facts of coqui-tts 0.28's ``Xtts`` (its GPT with the Perceiver conditioning, HiFi-GAN
decoder with the ResNet speaker encoder) and of the DVAE its GPT trainer builds. The sizes
that are not in ``config.json`` are fixed in the reference and here: 6 attention blocks in
the conditioning encoder, a Perceiver of 2 layers, 32 latents, 8 heads of 64, feed-forward
x4 (GEGLU); HiFi-GAN from 512 channels, upsampling kernels 16, 16, 4, 4, residual kernels
3, 7, 11; a ResNet of 3, 4, 6, 3 blocks of 32, 64, 128, 256 filters over 64 mel bands.
"""

from __future__ import annotations

import re

import torch

from myxtts.audio.power_mel import htk_filterbank
from myxtts.model.xtts_v2.config import XttsV2Config

Shape = tuple[int, ...]

# The speaker encoder's feature extractor (pre-emphasis, then a 16 kHz mel power spectrum):
# buffers in the released file, made by our PowerMel instead.
TORCH_SPEC = "hifigan_decoder.speaker_encoder.torch_spec."
PREEMPHASIS_KEY = TORCH_SPEC + "0.filter"
WINDOW_KEY = TORCH_SPEC + "1.spectrogram.window"
FILTERBANK_KEY = TORCH_SPEC + "1.mel_scale.fb"

# The HiFi-GAN convolutions the released file stores weight-normed.
_WEIGHT_NORMED = re.compile(
    r"hifigan_decoder\.waveform_decoder\.(ups\.\d+|resblocks\.\d+\.convs[12]\.\d+)\.weight")

_HIFI_CHANNELS = 512
_UP_KERNELS = (16, 16, 4, 4)
_RES_KERNELS = (3, 7, 11)
_RESNET_BLOCKS = (3, 4, 6, 3)
_RESNET_FILTERS = (32, 64, 128, 256)
_SPEAKER_DIM = 512  # the speaker encoder's output (coqui's HifiDecoder fixes proj_dim)
_LATENTS, _PERCEIVER_INNER = 32, 8 * 64
_DVAE_CODEBOOK, _DVAE_HIDDEN, _DVAE_MELS = 512, 1024, 80
# DVAE buffers of its training loss only (a running histogram of codes): optional
DVAE_OPTIONAL = "discrete_loss."


def is_weight_normed(name: str) -> bool:
    """``name`` (a folded weight) is stored as a weight-normed pair in the released file."""
    return _WEIGHT_NORMED.fullmatch(name) is not None


def speaker_features() -> dict[str, torch.Tensor]:
    """The speaker encoder's feature buffers as the released file holds them: the
    pre-emphasis filter ``[[[-0.97, 1]]]``, a 400-sample Hamming window and the 64-band HTK
    filterbank (no area normalisation) of a 512-point FFT at 16 kHz."""
    return {PREEMPHASIS_KEY: torch.tensor([[[-0.97, 1.0]]]),
            WINDOW_KEY: torch.hamming_window(400),
            FILTERBANK_KEY: htk_filterbank(16000, 512, 64, slaney_norm=False)}


def xtts_layout(config: XttsV2Config) -> dict[str, Shape]:
    """Every entry of XTTS-v2's state dict (our naming: folded weights, no ``torch_spec``)
    and its shape, for ``config`` (text tokens from its vocabulary)."""
    out = {**_gpt(config), **_hifigan(config), **_speaker_encoder()}
    out["mel_stats"] = (80,)
    return out


def _gpt(config: XttsV2Config) -> dict[str, Shape]:
    a = config.args
    d, text, audio = a.gpt_n_model_channels, config.number_text_tokens, a.gpt_num_audio_tokens
    out: dict[str, Shape] = {"gpt.conditioning_encoder.init.weight": (d, 80, 1),
                             "gpt.conditioning_encoder.init.bias": (d,)}
    for i in range(6):
        p = f"gpt.conditioning_encoder.attn.{i}."
        out.update({p + "norm.weight": (d,), p + "norm.bias": (d,),
                    p + "qkv.weight": (3 * d, d, 1), p + "qkv.bias": (3 * d,),
                    p + "proj_out.weight": (d, d, 1), p + "proj_out.bias": (d,)})
    out["gpt.text_embedding.weight"] = (text, d)
    out["gpt.mel_embedding.weight"] = (audio, d)
    for i in range(a.gpt_layers):
        p = f"gpt.gpt.h.{i}."
        out.update({p + "ln_1.weight": (d,), p + "ln_1.bias": (d,),
                    p + "attn.c_attn.weight": (d, 3 * d), p + "attn.c_attn.bias": (3 * d,),
                    p + "attn.c_proj.weight": (d, d), p + "attn.c_proj.bias": (d,),
                    p + "ln_2.weight": (d,), p + "ln_2.bias": (d,),
                    p + "mlp.c_fc.weight": (d, 4 * d), p + "mlp.c_fc.bias": (4 * d,),
                    p + "mlp.c_proj.weight": (4 * d, d), p + "mlp.c_proj.bias": (d,)})
    # positions: the audio codes with their start, stop and one conditioning input; the text
    # with its start and stop
    out.update({"gpt.gpt.ln_f.weight": (d,), "gpt.gpt.ln_f.bias": (d,),
                "gpt.mel_pos_embedding.emb.weight": (a.gpt_max_audio_tokens + 3, d),
                "gpt.text_pos_embedding.emb.weight": (a.gpt_max_text_tokens + 2, d),
                "gpt.final_norm.weight": (d,), "gpt.final_norm.bias": (d,),
                "gpt.text_head.weight": (text, d), "gpt.text_head.bias": (text,),
                "gpt.mel_head.weight": (audio, d), "gpt.mel_head.bias": (audio,),
                "gpt.conditioning_perceiver.latents": (_LATENTS, d)})
    inner = int(d * 4 * 2 / 3)  # the GEGLU feed-forward's hidden width
    for i in range(2):
        p = f"gpt.conditioning_perceiver.layers.{i}."
        out.update({p + "0.to_q.weight": (_PERCEIVER_INNER, d),
                    p + "0.to_kv.weight": (2 * _PERCEIVER_INNER, d),
                    p + "0.to_out.weight": (d, _PERCEIVER_INNER),
                    p + "1.0.weight": (2 * inner, d), p + "1.0.bias": (2 * inner,),
                    p + "1.2.weight": (d, inner), p + "1.2.bias": (d,)})
    out["gpt.conditioning_perceiver.norm.gamma"] = (d,)
    return out


def _hifigan(config: XttsV2Config) -> dict[str, Shape]:
    a = config.args
    p, ch = "hifigan_decoder.waveform_decoder.", _HIFI_CHANNELS
    out: dict[str, Shape] = {p + "conv_pre.weight": (ch, a.decoder_input_dim, 7),
                             p + "conv_pre.bias": (ch,)}
    for i, k in enumerate(_UP_KERNELS):
        out.update({f"{p}ups.{i}.weight": (ch >> i, ch >> (i + 1), k),
                    f"{p}ups.{i}.bias": (ch >> (i + 1),)})
    for i in range(len(_UP_KERNELS)):
        c = ch >> (i + 1)
        for j, k in enumerate(_RES_KERNELS):
            for convs in ("convs1", "convs2"):
                for m in range(3):
                    q = f"{p}resblocks.{i * len(_RES_KERNELS) + j}.{convs}.{m}."
                    out.update({q + "weight": (c, c, k), q + "bias": (c,)})
    out[p + "conv_post.weight"] = (1, ch >> len(_UP_KERNELS), 7)
    out.update({p + "cond_layer.weight": (ch, a.d_vector_dim, 1), p + "cond_layer.bias": (ch,)})
    if a.cond_d_vector_in_each_upsampling_layer:
        for i in range(len(_UP_KERNELS)):
            out.update({f"{p}conds.{i}.weight": (ch >> (i + 1), a.d_vector_dim, 1),
                        f"{p}conds.{i}.bias": (ch >> (i + 1),)})
    return out


def _batch_norm(prefix: str, n: int) -> dict[str, Shape]:
    return {prefix + "weight": (n,), prefix + "bias": (n,), prefix + "running_mean": (n,),
            prefix + "running_var": (n,), prefix + "num_batches_tracked": ()}


def _speaker_encoder() -> dict[str, Shape]:
    p = "hifigan_decoder.speaker_encoder."
    first = _RESNET_FILTERS[0]
    out: dict[str, Shape] = {p + "conv1.weight": (first, 1, 3, 3), p + "conv1.bias": (first,),
                             **_batch_norm(p + "bn1.", first)}
    planes_in = first
    for stage, (blocks, f) in enumerate(zip(_RESNET_BLOCKS, _RESNET_FILTERS), start=1):
        for b in range(blocks):
            q = f"{p}layer{stage}.{b}."
            out.update({q + "conv1.weight": (f, planes_in, 3, 3), **_batch_norm(q + "bn1.", f),
                        q + "conv2.weight": (f, f, 3, 3), **_batch_norm(q + "bn2.", f),
                        q + "se.fc.0.weight": (f // 8, f), q + "se.fc.0.bias": (f // 8,),
                        q + "se.fc.2.weight": (f, f // 8), q + "se.fc.2.bias": (f,)})
            if b == 0 and stage > 1:  # strided: the shortcut is projected
                out.update({q + "downsample.0.weight": (f, planes_in, 1, 1),
                            **_batch_norm(q + "downsample.1.", f)})
            planes_in = f
    pooled = _RESNET_FILTERS[-1] * (64 // 8)  # channels x mel bands left after 3 strides
    out.update({p + "attention.0.weight": (128, pooled, 1), p + "attention.0.bias": (128,),
                **_batch_norm(p + "attention.2.", 128),
                p + "attention.3.weight": (pooled, 128, 1), p + "attention.3.bias": (pooled,),
                p + "fc.weight": (_SPEAKER_DIM, 2 * pooled), p + "fc.bias": (_SPEAKER_DIM,)})
    return out


def dvae_layout(config: XttsV2Config) -> dict[str, Shape]:
    """Every entry of ``dvae.pth`` and its shape: the DVAE whose codes are the GPT's audio
    tokens (all but its start and stop), over 80 mel bands."""
    codes, h, half = config.args.gpt_num_audio_tokens - 2, _DVAE_HIDDEN, _DVAE_HIDDEN // 2
    out: dict[str, Shape] = {"discrete_loss.accumulator_index": (1,),
                             "discrete_loss.accumulator_filled": (1,),
                             "discrete_loss.accumulator": (100, codes),
                             "encoder.0.0.weight": (half, _DVAE_MELS, 3), "encoder.0.0.bias": (half,),
                             "encoder.1.0.weight": (h, half, 3), "encoder.1.0.bias": (h,)}

    def residual(prefix: str) -> None:
        for i, k in ((0, 3), (2, 3), (4, 1)):
            out.update({f"{prefix}.net.{i}.weight": (h, h, k), f"{prefix}.net.{i}.bias": (h,)})

    for i in (2, 3, 4):
        residual(f"encoder.{i}")
    out.update({"encoder.5.weight": (_DVAE_CODEBOOK, h, 1), "encoder.5.bias": (_DVAE_CODEBOOK,),
                "decoder.0.weight": (h, _DVAE_CODEBOOK, 1), "decoder.0.bias": (h,)})
    for i in (1, 2, 3):
        residual(f"decoder.{i}")
    out.update({"decoder.4.0.conv.weight": (h, h, 3), "decoder.4.0.conv.bias": (h,),
                "decoder.5.0.conv.weight": (half, h, 3), "decoder.5.0.conv.bias": (half,),
                "decoder.6.weight": (_DVAE_MELS, half, 1), "decoder.6.bias": (_DVAE_MELS,),
                "codebook.embed": (_DVAE_CODEBOOK, codes), "codebook.cluster_size": (codes,),
                "codebook.embed_avg": (_DVAE_CODEBOOK, codes)})
    return out


def integer_entry(name: str) -> bool:
    """Entries that hold integers (counts), not float weights."""
    return name.endswith("num_batches_tracked") or name in (
        "discrete_loss.accumulator_index", "discrete_loss.accumulator_filled")
