"""The reference GPT next to ours: the same seeded weights loaded into :class:`XttsGpt`, and
the reference's generation made to run under transformers 5.

coqui-tts 0.28's ``GPT2InferenceModel.forward`` takes the KV cache as ``past_key_values``;
transformers 5 (5.24 here) hands it over as ``cache``, which lands in ``**kwargs`` and is
dropped, so the second step finds no cache and fails. :func:`fix_reference_generation`
passes the cache on under the old name: nothing else of the reference changes.
"""

from __future__ import annotations

from myxtts.model.xtts_v2.config import XttsV2Args, XttsV2Config
from myxtts.model.xtts_v2.gpt import XttsGpt
from tests.xtts_v2.reference import fix_reference_generation, reference_model

__all__ = ["fix_reference_generation", "generating_pair", "gpt_config", "our_gpt",
           "released_gpt_state"]


def gpt_config(model) -> XttsV2Config:
    """Our config for the reference ``Xtts`` ``model`` (its args and its vocabulary's ids)."""
    a = model.args
    args = XttsV2Args(gpt_layers=a.gpt_layers, gpt_n_model_channels=a.gpt_n_model_channels,
                      gpt_n_heads=a.gpt_n_heads, gpt_max_audio_tokens=a.gpt_max_audio_tokens,
                      gpt_max_text_tokens=a.gpt_max_text_tokens,
                      gpt_num_audio_tokens=a.gpt_num_audio_tokens,
                      gpt_start_audio_token=a.gpt_start_audio_token,
                      gpt_stop_audio_token=a.gpt_stop_audio_token,
                      gpt_code_stride_len=a.gpt_code_stride_len,
                      decoder_input_dim=a.decoder_input_dim)
    return XttsV2Config(args=args, number_text_tokens=model.gpt.number_text_tokens,
                        start_text_token=model.gpt.start_text_token,
                        stop_text_token=model.gpt.stop_text_token)


def released_gpt_state(model) -> dict:
    """The reference GPT's state dict as ``model.pth`` holds it (under ``gpt.``): without
    the inference wrapper's aliases of the same weights."""
    return {k: v for k, v in model.gpt.state_dict().items()
            if not k.startswith(("gpt_inference.", "gpt.wte."))}


def our_gpt(model, dropout: float = 0.1) -> XttsGpt:
    """:class:`XttsGpt` with the reference ``model``'s GPT weights (``strict=True``), eval."""
    ours = XttsGpt(gpt_config(model), dropout=dropout)
    ours.load_state_dict(released_gpt_state(model), strict=True)
    return ours.eval()


def generating_pair(seed: int = 0):
    """The reference ``Xtts`` of ``seed`` (reduced size), its generation fixed, and ours with
    its GPT weights."""
    model = reference_model(seed=seed)
    fix_reference_generation(model)
    return model, our_gpt(model)
