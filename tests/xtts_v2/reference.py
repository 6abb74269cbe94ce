"""The oracle: Coqui's XTTS-v2 (coqui-tts, a test-only dependency) on seeded random weights,
written as the folder a user downloads (config.json, model.pth, vocab.json,
speakers_xtts.pth, dvae.pth, mel_stats.pth), and read back by coqui-tts itself.

The released weights cannot be downloaded here, so every equality test compares myxtts
with coqui-tts on the same random weights. ``REDUCED`` is the size the fast tests use (2
GPT layers); ``RELEASED`` the released architecture (30 layers x 1024).
"""

from __future__ import annotations

import json
from pathlib import Path

LANGUAGES = ["en", "es", "fr", "de", "it", "pt", "pl", "tr", "ru", "nl", "cs", "ar", "zh-cn",
             "hu", "ko", "ja", "hi"]

REDUCED = {"gpt_layers": 2, "gpt_n_model_channels": 256, "gpt_n_heads": 4}
RELEASED = {"gpt_layers": 30, "gpt_n_model_channels": 1024, "gpt_n_heads": 16}

# Text the test vocabulary is trained on: every language's letters after the reference's
# cleaning (Chinese as pinyin, Japanese as romaji, Korean romanised), digits spelled out.
_CORPUS = """
the quick brown fox jumps over the lazy dog. hello world, how are you today? mister doctor
el rápido zorro marrón salta sobre el perro perezoso. ¿qué tal? señor doña
le renard brun rapide saute par-dessus le chien paresseux. ça va? monsieur madame élève
der schnelle braune fuchs springt über den faulen hund. straße grüße
la volpe marrone veloce salta sopra il cane pigro. perché così
a rápida raposa marrom pula sobre o cão preguiçoso. não coração
szybki brązowy lis przeskakuje nad leniwym psem. żółć gęślą jaźń
hızlı kahverengi tilki tembel köpeğin üzerinden atlar. ığdır şişli çöp
быстрая коричневая лиса прыгает через ленивую собаку. съешь же ещё этих мягких булок
de snelle bruine vos springt over de luie hond. één ijs
rychlá hnědá liška skáče přes líného psa. příliš žluťoučký kůň úpěl ďábelské ódy
الثعلب البني السريع يقفز فوق الكلب الكسول. مرحبا بكم
ni3 hao3 shi4 jie4 wo3 men5 zhong1 guo2 ren2 yi1 er4 san1
a gyors barna róka átugorja a lusta kutyát. árvíztűrő tükörfúrógép
annyeonghaseyo saranghae hangugeo
konnichiwa sekai watashi wa gakusei desu arigatou gozaimasu
तेज़ भूरी लोमड़ी आलसी कुत्ते के ऊपर कूदती है। नमस्ते दुनिया
one two three four five six seven eight nine ten hundred thousand first second third
"""


def coqui():
    """coqui-tts's XTTS modules, or the test is skipped (the oracle is a test dependency).
    pytest is imported here, not above, so that a benchmark's peer environment can write
    and read reference folders with this module."""
    import pytest

    xtts = pytest.importorskip("TTS.tts.models.xtts", reason="coqui-tts is the oracle",
                               exc_type=ImportError)
    configs = pytest.importorskip("TTS.tts.configs.xtts_config", exc_type=ImportError)
    return xtts, configs


def make_vocab(path: Path, size: int = 600) -> Path:
    """A BPE vocabulary in XTTS's vocab.json format: [STOP] 0, [UNK] 1, [SPACE] 2, one token
    per language ([en], [zh-cn], ...), [START], then merges learnt from ``_CORPUS``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = ["[STOP]", "[UNK]", "[SPACE]", *(f"[{lang}]" for lang in LANGUAGES), "[START]"]
    trainer = trainers.BpeTrainer(vocab_size=size, special_tokens=specials)
    lines = [line.replace(" ", "[SPACE]") for line in _CORPUS.strip().splitlines()]
    tok.train_from_iterator(lines, trainer)
    tok.save(str(path))
    return path


def reference_config(size: dict | None = None):
    """coqui-tts's XttsConfig as the released config.json has it (XTTS-v2: 1026 audio
    tokens, the Perceiver), at ``size`` (default ``REDUCED``)."""
    _, configs = coqui()
    cfg = configs.XttsConfig()
    args = cfg.model_args
    for key, value in (size or REDUCED).items():
        setattr(args, key, value)
    args.gpt_num_audio_tokens = 1026
    args.gpt_start_audio_token = 1024
    args.gpt_stop_audio_token = 1025
    args.gpt_use_perceiver_resampler = True
    args.gpt_use_masking_gt_prompt_approach = True
    args.gpt_max_audio_tokens = 605
    args.gpt_max_text_tokens = 402
    args.gpt_max_prompt_tokens = 70
    args.decoder_input_dim = args.gpt_n_model_channels
    cfg.languages = list(LANGUAGES)
    cfg.temperature, cfg.length_penalty, cfg.repetition_penalty = 0.75, 1.0, 5.0
    cfg.top_k, cfg.top_p = 50, 0.85
    cfg.gpt_cond_len, cfg.gpt_cond_chunk_len, cfg.max_ref_len = 30, 4, 30
    return cfg


def _randomise(model, seed: int) -> None:
    """Every parameter and buffer drawn from a seeded generator, so that no layer is left
    at an identity-like default (unit norms, zero biases) that would hide a wrong order of
    operations; norms keep a scale near 1 and their running statistics plausible (a batch
    norm scaled to ~0 would make the speaker encoder's output the same for any audio);
    scales keep activations finite through 30 layers."""
    import torch

    norms = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.LayerNorm, torch.nn.GroupNorm,
             torch.nn.modules.instancenorm._InstanceNorm)
    g = torch.Generator().manual_seed(seed)
    normed = set()
    with torch.no_grad():
        for prefix, module in model.named_modules():
            if not isinstance(module, norms):
                continue
            for name, p in module.named_parameters(recurse=False):
                normed.add(f"{prefix}.{name}")
                base = 1.0 if name == "weight" else 0.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
            if getattr(module, "running_mean", None) is not None:
                module.running_mean.copy_(0.1 * torch.randn(module.running_mean.shape, generator=g))
                module.running_var.copy_(0.5 + torch.rand(module.running_var.shape, generator=g))
        for name, p in model.named_parameters():
            if name in normed:
                continue
            if name.endswith(".weight_g") or "original0" in name:
                p.copy_(p * (0.8 + 0.4 * torch.rand(p.shape, generator=g)))
            elif p.ndim == 1 and ("norm" in name or "ln_" in name) and name.endswith(("weight", "gamma")):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif p.ndim == 1:
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
            else:
                fan_in = max(1, p[0].numel())
                p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)
        stats = 2.0 + torch.rand(80, generator=g)
        model.mel_stats.copy_(stats)


def reference_model(size: dict | None = None, seed: int = 0, vocab: Path | None = None):
    """coqui-tts's ``Xtts`` with seeded random weights (training mode off), its tokenizer
    over ``vocab`` (a vocabulary is made in a temp file when None)."""
    import tempfile

    import torch

    xtts, _ = coqui()
    cfg = reference_config(size)
    if vocab is None:
        vocab = make_vocab(Path(tempfile.mkdtemp()) / "vocab.json")
    from TTS.tts.layers.xtts.tokenizer import VoiceBpeTokenizer

    torch.manual_seed(seed)
    model = xtts.Xtts(cfg)
    model.tokenizer = VoiceBpeTokenizer(vocab_file=str(vocab))
    model.init_models()
    _randomise(model, seed)
    model.eval()
    return model


def reference_dvae(seed: int = 0):
    """coqui-tts's DVAE at the size its GPT trainer builds, seeded random weights."""
    import torch
    from TTS.tts.layers.xtts.dvae import DiscreteVAE

    torch.manual_seed(seed)
    dvae = DiscreteVAE(channels=80, normalization=None, positional_dims=1, num_tokens=1024,
                       codebook_dim=512, hidden_dim=512, num_resnet_blocks=3, kernel_size=3,
                       num_layers=2, use_transposed_convs=False)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in dvae.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=g))
    return dvae.eval()


def write_folder(folder: Path, size: dict | None = None, seed: int = 0,
                 speakers: tuple[str, ...] = ("Ana Florence", "Claribel Dervla")) -> Path:
    """The XTTS-v2 folder as downloaded, with seeded random weights: config.json (the
    reference's own JSON), model.pth ({"model": state dict}), vocab.json,
    speakers_xtts.pth ({name: {"gpt_cond_latent", "speaker_embedding"}}), dvae.pth (a state
    dict) and mel_stats.pth (80 values)."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    vocab = make_vocab(folder / "vocab.json")
    model = reference_model(size, seed, vocab)
    cfg = model.config
    cfg.model_args.tokenizer_file = ""
    (folder / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    # eval() built the inference wrapper, whose aliases of the same weights
    # (gpt.gpt_inference.*, gpt.gpt.wte) the released file does not hold
    state = {k: v for k, v in model.state_dict().items()
             if ".gpt_inference." not in k and not k.startswith("gpt.gpt.wte.")}
    torch.save({"model": state}, folder / "model.pth")
    g = torch.Generator().manual_seed(seed + 7)
    dim = cfg.model_args.gpt_n_model_channels
    voices = {name: {"gpt_cond_latent": torch.randn(1, 32, dim, generator=g),
                     "speaker_embedding": torch.nn.functional.normalize(
                         torch.randn(1, 512, 1, generator=g), dim=1)}
              for name in speakers}
    torch.save(voices, folder / "speakers_xtts.pth")
    torch.save(reference_dvae(seed).state_dict(), folder / "dvae.pth")
    torch.save(model.mel_stats.clone(), folder / "mel_stats.pth")
    return folder


def load_reference(folder: Path):
    """coqui-tts's own reading of an XTTS folder (the oracle's ``load_checkpoint``)."""
    xtts, configs = coqui()
    cfg = configs.XttsConfig()
    cfg.load_json(str(folder / "config.json"))
    model = xtts.Xtts(cfg)
    model.load_checkpoint(cfg, checkpoint_dir=str(folder), eval=True)
    return model


def fix_reference_generation(model) -> None:
    """Let coqui-tts 0.28's ``Xtts`` generate under transformers 5: its inference wrapper's
    ``forward`` takes the KV cache as ``past_key_values``, which transformers 5's
    ``generate`` hands over as ``cache`` (dropped into ``**kwargs``, so the second step
    finds no cache and fails). The cache is passed on under the old name; under
    transformers 4, which still uses that name, nothing changes."""
    import functools

    inference = model.gpt.gpt_inference
    if getattr(inference, "_cache_passed_on", False):
        return
    forward = inference.forward

    @functools.wraps(forward)  # generate() reads the signature (attention_mask, ...)
    def forward_with_cache(*args, cache=None, **kwargs):
        if cache is not None:
            kwargs.setdefault("past_key_values", cache)
        return forward(*args, **kwargs)

    inference.forward = forward_with_cache
    inference._cache_passed_on = True
