"""XTTS-v2's architecture and decoding settings, as the released ``config.json`` states them.

Field names are the released file's own (``model_args.gpt_layers``, ``temperature``, ...),
so that a reader of either can find a value in the other; defaults are the released
model's. The text-token ids are not here: they come from ``vocab.json`` (``[START]``,
``[STOP]`` and the vocabulary's size), as the reference derives them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LANGUAGES = ("en", "es", "fr", "de", "it", "pt", "pl", "tr", "ru", "nl", "cs", "ar", "zh-cn",
             "hu", "ko", "ja", "hi")


@dataclass(frozen=True)
class XttsV2Args:
    """The network's shape (``config.json``'s ``model_args``)."""

    gpt_layers: int = 30
    gpt_n_model_channels: int = 1024
    gpt_n_heads: int = 16
    gpt_max_audio_tokens: int = 605
    gpt_max_text_tokens: int = 402
    gpt_max_prompt_tokens: int = 70
    gpt_num_audio_tokens: int = 1026
    gpt_start_audio_token: int = 1024
    gpt_stop_audio_token: int = 1025
    gpt_code_stride_len: int = 1024
    gpt_use_perceiver_resampler: bool = True
    input_sample_rate: int = 22050
    output_sample_rate: int = 24000
    output_hop_length: int = 256
    decoder_input_dim: int = 1024
    d_vector_dim: int = 512
    cond_d_vector_in_each_upsampling_layer: bool = True


@dataclass(frozen=True)
class XttsV2Sampling:
    """How codes are drawn (``config.json``'s top level); each can be overridden per call.
    ``config.json``'s ``length_penalty`` is not among them: it acts only in beam search,
    which XTTS-v2 never runs (one beam), so it is left in the file and never read."""

    temperature: float = 0.75
    repetition_penalty: float = 5.0
    top_k: int = 50
    top_p: float = 0.85


@dataclass(frozen=True)
class XttsV2Voice:
    """How reference clips become a voice (``config.json``'s top level): seconds of audio
    read per clip, seconds the GPT conditions on, in chunks of ``gpt_cond_chunk_len``."""

    gpt_cond_len: int = 30
    gpt_cond_chunk_len: int = 4
    max_ref_len: int = 30
    sound_norm_refs: bool = False


@dataclass(frozen=True)
class XttsV2Config:
    args: XttsV2Args = field(default_factory=XttsV2Args)
    sampling: XttsV2Sampling = field(default_factory=XttsV2Sampling)
    voice: XttsV2Voice = field(default_factory=XttsV2Voice)
    languages: tuple[str, ...] = LANGUAGES
    # text tokens: from vocab.json ([START], [STOP], max id + 1)
    number_text_tokens: int = 6681
    start_text_token: int = 261
    stop_text_token: int = 0
