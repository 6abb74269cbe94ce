"""An XTTS-v2 folder with seeded random weights, written by myxtts alone (no coqui-tts), for
the benchmarks that need one on a machine without the oracle (a GPU machine, offline).

The folder is what a user downloads (config.json, model.pth, vocab.json, dvae.pth,
mel_stats.pth; ``myxtts.artifacts.xtts_v2.write_xtts_v2`` writes it), at the released
architecture (30 layers x 1024) or the tests' reduced one (2 x 256). Its vocabulary is a
BPE (``tokenizers``) learnt from the texts it is given, so that every clip of the dataset
tokenizes without an unknown token; the weights are the modules' own initialisation under
one seed (what a throughput figure needs: every shape and every operation of the real
model), the mel statistics drawn near the released ones' scale.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

SIZES = {"reduced": (2, 256, 4), "released": (30, 1024, 16)}  # layers, width, heads


def bpe_vocab(texts: Iterable[str], languages: Iterable[str], size: int = 400) -> str:
    """vocab.json's text: [STOP] 0, [UNK] 1, [SPACE] 2, one token per language ([en], ...),
    [START], then merges learnt from ``texts`` (lower-cased, spaces as [SPACE], as XTTS's
    tokenizer reads them)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = ["[STOP]", "[UNK]", "[SPACE]", *(f"[{lang}]" for lang in languages), "[START]"]
    trainer = trainers.BpeTrainer(vocab_size=size, special_tokens=specials, show_progress=False)
    tok.train_from_iterator((t.lower().replace(" ", "[SPACE]") for t in texts), trainer)
    return tok.to_str()


def write_random_xtts(out: Path, texts: list[str], size: str = "released", seed: int = 0) -> Path:
    """Write the folder (module docstring) to ``out`` (new or empty); returns ``out``."""
    import torch

    from myxtts.artifacts.xtts_v2.config_file import text_tokens
    from myxtts.artifacts.xtts_v2.folder import VOCAB, XttsV2Files, write_xtts_v2
    from myxtts.model.xtts_v2.config import LANGUAGES, XttsV2Args, XttsV2Config
    from myxtts.model.xtts_v2.dvae import XttsDvae
    from myxtts.model.xtts_v2.model import XttsV2Model

    layers, dim, heads = SIZES[size]
    vocab = bpe_vocab(texts, LANGUAGES)
    number, start, stop = text_tokens(Path(VOCAB), vocab)
    config = XttsV2Config(args=XttsV2Args(gpt_layers=layers, gpt_n_model_channels=dim,
                                          gpt_n_heads=heads, decoder_input_dim=dim),
                          number_text_tokens=number, start_text_token=start,
                          stop_text_token=stop)
    torch.manual_seed(seed)
    model = XttsV2Model(config)
    dvae = XttsDvae()
    g = torch.Generator().manual_seed(seed + 1)
    mel_stats = 2.0 + torch.rand(80, generator=g)  # the released statistics' scale
    write_xtts_v2(out, XttsV2Files(config=config, weights=model.state_dict(), vocab=vocab,
                                   dvae=dvae.state_dict(), mel_stats=mel_stats))
    return out
