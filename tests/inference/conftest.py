"""The inference tests' trained run and an untrained bilingual model."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import micro_config


@pytest.fixture(scope="package")
def run(evaluated_run) -> Path:
    """The suite's trained micro run (``tests/conftest.py``: 4 steps, decoding to 48 frames
    unless a test lowers ``max_decoder_frames``)."""
    return evaluated_run


# A Persian + English paragraph: its sentences alternate between the two languages, and the
# third ends with the Persian question mark (an end for Persian rules only).
MIXED = "سلام دوست من. Hello there, friend. حال شما چطور است؟ I am fine."
MIXED_SENTENCES = [("سلام دوست من.", "fa"), ("Hello there, friend.", "en"),
                   ("حال شما چطور است؟", "fa"), ("I am fine.", "en")]


@pytest.fixture(scope="package")
def bilingual():
    """An untrained micro model that knows ``en`` and ``fa`` (every letter of ``MIXED``); its
    decoder never stops, so every piece decodes to ``max_decoder_frames`` (16)."""
    import torch

    from myxtts.inference.synthesizer import Synthesizer
    from myxtts.model.xtts import build_model
    from myxtts.text import Tokenizer, clean_text

    cfg = micro_config(Path("unused"), "text.languages=[en,fa]", "model.max_decoder_frames=16")
    texts = [clean_text(s, lang, cfg.text) for s, lang in MIXED_SENTENCES]
    tokenizer = Tokenizer.build(texts, cfg.text.languages)
    torch.manual_seed(0)
    model = build_model(cfg, tokenizer.vocab_size, len(tokenizer.languages), None, None)
    return Synthesizer(model, cfg, tokenizer, torch.device("cpu"))
