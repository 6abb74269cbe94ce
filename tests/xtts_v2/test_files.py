"""The downloaded XTTS-v2 folder read without running pickled code, every form of
``model.pth`` normalised to one state dict, each user-made failure one line naming the file,
and the folder written back out in the layout coqui-tts reads (its oracle: coqui-tts 0.28 on
seeded random weights, tests/xtts_v2/reference.py)."""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from myxtts.artifacts.errors import ArtifactError
from myxtts.artifacts.xtts_v2 import XttsV2Files, read_xtts_v2, torch_files, write_xtts_v2
from myxtts.artifacts.xtts_v2.config_file import parse_config, text_tokens
from myxtts.artifacts.xtts_v2.model_file import check_model, normalise
from myxtts.artifacts.xtts_v2.torch_files import PickledCoquiConfig, load_pth
from myxtts.artifacts.xtts_v2.weight_norm import fold, unfold
from myxtts.system import FolderError
from tests.xtts_v2.reference import (
    RELEASED,
    coqui,
    load_reference,
    make_vocab,
    reference_config,
    reference_dvae,
    write_folder,
)

NORM_PAIR = (".parametrizations.weight.original0", ".parametrizations.weight.original1")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    coqui()
    torch.set_num_threads(1)
    return write_folder(tmp_path_factory.mktemp("xtts") / "XTTS-v2")


@pytest.fixture(scope="module")
def reference(folder):
    """coqui-tts's own reading of the folder (after init_gpt_for_inference, as eval does)."""
    return load_reference(folder)


@pytest.fixture(scope="module")
def release(folder) -> XttsV2Files:
    return read_xtts_v2(folder)


@pytest.fixture(scope="module")
def released_sd(folder) -> dict[str, torch.Tensor]:
    return torch.load(folder / "model.pth", weights_only=True)["model"]


def _variant(base: Path, dest: Path, model: object = None) -> Path:
    """A copy of ``base``'s config.json and vocab.json, with ``model`` as its model.pth."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "vocab.json"):
        shutil.copy(base / name, dest / name)
    if model is not None:
        torch.save(model, dest / "model.pth")
    return dest


def _same_dict(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert list(a) == list(b) or set(a) == set(b)
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key


def _error(call, *parts: str) -> str:
    """``call`` fails with one ArtifactError line holding every one of ``parts``."""
    with pytest.raises((ArtifactError, FolderError)) as e:
        call()
    message = str(e.value)
    assert "\n" not in message, message
    for part in parts:
        assert part in message, message
    return message


# ------------------------------------------------------------------ weight norm

def test_fold_is_torch_weight_norm_and_unfold_its_inverse():
    from torch.nn.utils.parametrizations import weight_norm

    conv = weight_norm(torch.nn.ConvTranspose1d(6, 4, 5))
    with torch.no_grad():
        conv.parametrizations.weight.original0.mul_(1.7)
    sd = conv.state_dict()
    assert torch.equal(fold(sd["parametrizations.weight.original0"],
                            sd["parametrizations.weight.original1"]), conv.weight)
    w = torch.randn(64, 32, 11, generator=torch.Generator().manual_seed(1))
    g, v = unfold(w)
    assert g.shape == (64, 1, 1) and torch.equal(fold(g, v), w)


# ------------------------------------------------------------------ reading

@pytest.mark.slow
def test_release_reads_to_the_contract(release, released_sd, reference, folder):
    """Every key accepted; the dict is the reference's keys with weight-norm pairs folded and
    the speaker encoder's feature buffers dropped; folded weights are coqui's effective
    weights, every other entry the file's own."""
    folded = {k[:-len(NORM_PAIR[0])] for k in released_sd if k.endswith(NORM_PAIR[0])}
    expected = {k for k in released_sd if not k.endswith(NORM_PAIR) and ".torch_spec." not in k}
    expected |= {p + ".weight" for p in folded}
    assert set(release.weights) == expected
    for prefix in folded:
        effective = reference.get_submodule(prefix).weight.detach()
        assert (release.weights[prefix + ".weight"] - effective).abs().max() <= 1e-6
    for key in expected - {p + ".weight" for p in folded}:
        assert torch.equal(release.weights[key], released_sd[key]), key
    cfg = reference.config
    assert release.config.args.gpt_layers == cfg.model_args.gpt_layers
    assert (release.config.number_text_tokens, release.config.start_text_token,
            release.config.stop_text_token) == (cfg.model_args.gpt_number_text_tokens,
                                                cfg.model_args.gpt_start_text_token,
                                                cfg.model_args.gpt_stop_text_token)
    assert release.config.sampling.repetition_penalty == cfg.repetition_penalty
    assert list(release.config.languages) == cfg.languages
    assert set(release.speakers) == {"Ana Florence", "Claribel Dervla"}
    assert torch.equal(release.mel_stats, torch.load(folder / "mel_stats.pth", weights_only=True))
    _same_dict(release.dvae, torch.load(folder / "dvae.pth", weights_only=True))


@pytest.mark.slow
def test_every_form_of_model_pth_reads_the_same(release, released_sd, reference, folder,
                                                tmp_path):
    from TTS.tts.layers.tortoise.arch_utils import TorchMelSpectrogram

    trainer = {"xtts." + k: v for k, v in released_sd.items()}
    trainer.update({"dvae." + k: v for k, v in reference_dvae().state_dict().items()})
    for name in ("torch_mel_spectrogram_style_encoder", "torch_mel_spectrogram_dvae"):
        mel = TorchMelSpectrogram(mel_norm_file=None)
        trainer.update({f"{name}.{k}": v for k, v in mel.state_dict().items()})
    hooked = {k.replace(NORM_PAIR[0], ".weight_g").replace(NORM_PAIR[1], ".weight_v"): v
              for k, v in released_sd.items()}
    aliased = reference.state_dict()  # after init_gpt_for_inference: gpt_inference.*, wte
    assert any(".gpt_inference." in k for k in aliased) and "gpt.gpt.wte.weight" in aliased
    forms = {"trainer": {"model": trainer, "optimizer": {"state": {}}, "step": 3},
             "weight_g": {"model": hooked},
             "aliases": {"model": aliased},
             "legacy": {"config": reference.config, "model": released_sd}}
    for name, contents in forms.items():
        got = read_xtts_v2(_variant(folder, tmp_path / name, contents))
        _same_dict(got.weights, release.weights)


def test_pickled_config_of_the_first_releases_reads_without_coqui_code(
        monkeypatch, folder, released_sd, release, tmp_path):
    """The released files pickled XttsArgs / XttsAudioConfig under TTS.tts.models.xtts; they
    become stand-ins (no coqui class is built) and the config inside is ignored."""
    from TTS.tts.configs.xtts_config import XttsArgs, XttsAudioConfig

    cfg = json.loads((folder / "config.json").read_text())
    xtts, configs = coqui()
    legacy = configs.XttsConfig()
    legacy.from_dict(cfg)
    moved = XttsArgs.__module__
    try:
        XttsArgs.__module__ = XttsAudioConfig.__module__ = "TTS.tts.models.xtts"
        torch.save({"config": legacy, "model": released_sd}, tmp_path / "model.pth")
    finally:
        XttsArgs.__module__ = XttsAudioConfig.__module__ = moved
    assert b"TTS.tts.models.xtts" in (tmp_path / "model.pth").read_bytes()
    got = read_xtts_v2(_variant(folder, tmp_path))
    _same_dict(got.weights, release.weights)
    raw = load_pth(tmp_path / "model.pth", "model.pth")
    assert isinstance(raw["config"], PickledCoquiConfig)
    assert type(raw["config"]).__module__ == "TTS.tts.configs.xtts_config"
    args = raw["config"].fields["model_args"]
    assert isinstance(args, PickledCoquiConfig) and type(args).__module__ == "TTS.tts.models.xtts"
    assert args.fields["gpt_layers"] == cfg["model_args"]["gpt_layers"]
    # torch 2.4's weights_only unpickler builds no allowlisted objects: such a file is
    # refused in one line there, never read with weights_only=False
    monkeypatch.setattr(torch_files, "WEIGHTS_ONLY_BUILDS_OBJECTS", False)
    monkeypatch.setattr(torch_files, "_stand_ins_allowed", contextlib.nullcontext)
    with pytest.raises(ArtifactError, match="pickled object.*upgrade to torch 2.5"):
        load_pth(tmp_path / "model.pth", "model.pth")


def test_released_size_shapes_are_accepted(monkeypatch, tmp_path):
    """coqui's XTTS-v2 at the released size (GPT built on the meta device: shapes only)
    passes the shape checks of the config its JSON states."""
    xtts, _ = coqui()
    from TTS.tts.layers.xtts.tokenizer import VoiceBpeTokenizer

    cfg = reference_config(RELEASED)
    vocab = make_vocab(tmp_path / "vocab.json")
    model = xtts.Xtts(cfg)  # no tokenizer yet: the HiFi-GAN decoder alone, on the CPU
    decoder = model.hifigan_decoder
    model.tokenizer = VoiceBpeTokenizer(vocab_file=str(vocab))
    monkeypatch.setattr(xtts, "HifiDecoder", lambda **_: decoder)
    with torch.device("meta"):  # torchaudio's filterbank cannot be built on meta
        model.init_models()
    state = model.state_dict()
    assert state["gpt.gpt.h.29.mlp.c_fc.weight"].is_meta
    tokens = text_tokens(vocab, vocab.read_text())
    config = parse_config("config.json", json.loads(json.dumps(cfg.to_dict())), tokens)
    assert (config.args.gpt_layers, config.args.gpt_n_model_channels) == (30, 1024)
    weights = normalise("model.pth", state)
    check_model("model.pth", weights, config)
    assert weights["gpt.conditioning_perceiver.layers.1.1.0.weight"].shape == (5460, 1024)


# ------------------------------------------------------------------ failures, one line each

def test_missing_folder_and_files(folder, tmp_path):
    _error(lambda: read_xtts_v2(tmp_path / "nowhere"), "nowhere", "does not exist", "downloaded")
    _error(lambda: read_xtts_v2(folder / "model.pth"), "model.pth", "not a folder")
    partial = _variant(folder, tmp_path / "partial")
    _error(lambda: read_xtts_v2(partial), "partial", "has no model.pth", "XTTS-v2 folder")


def test_damaged_or_foreign_model_pth(folder, tmp_path):
    blob = (folder / "model.pth").read_bytes()
    cases = {"empty": (b"", "empty (0 bytes"),
             "truncated": (blob[:len(blob) // 2], "truncated or damaged"),
             "random": (bytes(range(256)) * 64, "not a file torch.save wrote")}
    for name, (data, words) in cases.items():
        bad = _variant(folder, tmp_path / name)
        (bad / "model.pth").write_bytes(data)
        _error(lambda b=bad: read_xtts_v2(b), str(bad / "model.pth"), words)
    from myxtts.artifacts import checkpoint

    ours = _variant(folder, tmp_path / "ours")
    checkpoint.save(ours / "model.pth", {"model": {}})
    _error(lambda: read_xtts_v2(ours), "model.pth", "myxtts training checkpoint")
    plain = _variant(folder, tmp_path / "plain", {"weights": {}})
    _error(lambda: read_xtts_v2(plain), "model.pth", 'no "model" state dict')


def test_pickled_class_outside_the_allowlist_is_named(folder, released_sd, tmp_path):
    bad = _variant(folder, tmp_path, {"model": released_sd, "args": argparse.Namespace(a=1)})
    _error(lambda: read_xtts_v2(bad), "model.pth", "argparse.Namespace", "could run code")


def test_foreign_or_incomplete_config(folder, tmp_path):
    raw = json.loads((folder / "config.json").read_text())

    def with_config(name: str, text: str) -> Path:
        dest = _variant(folder, tmp_path / name)
        (dest / "config.json").write_text(text)
        shutil.copy(folder / "model.pth", dest / "model.pth")
        return dest

    other = with_config("glow", json.dumps({**raw, "model": "glow_tts"}))
    _error(lambda: read_xtts_v2(other), "config.json", "is not XTTS's config", "glow_tts")
    _error(lambda: read_xtts_v2(with_config("text", "not json")), "config.json", "is not JSON")
    args = {k: v for k, v in raw["model_args"].items() if k != "gpt_layers"}
    gone = with_config("gone", json.dumps({**raw, "model_args": args}))
    _error(lambda: read_xtts_v2(gone), "config.json", "has no model_args.gpt_layers")
    typed = with_config("typed", json.dumps({**raw, "model_args": {**raw["model_args"],
                                                                   "gpt_n_heads": "4"}}))
    _error(lambda: read_xtts_v2(typed), "config.json", "model_args.gpt_n_heads is '4'",
           "whole number")
    v1 = with_config("v1", json.dumps({**raw, "model_args": {
        **raw["model_args"], "gpt_use_perceiver_resampler": False}}))
    _error(lambda: read_xtts_v2(v1), "config.json", "is an XTTS v1 config", "XTTS-v2")
    layers = with_config("layers", json.dumps({**raw, "model_args": {**raw["model_args"],
                                                                     "gpt_layers": 3}}))
    _error(lambda: read_xtts_v2(layers), "model.pth", "holds 2 GPT layers",
           "model_args.gpt_layers says 3")
    vocab = with_config("vocab", json.dumps(raw))
    (vocab / "vocab.json").write_text("{}")
    _error(lambda: read_xtts_v2(vocab), "vocab.json", "not a tokenizers vocabulary")


@pytest.mark.slow
def test_wrong_weights_are_named(folder, released_sd, tmp_path):
    def model_with(name: str, **changes) -> Path:
        sd = dict(released_sd)
        for key, value in changes.items():
            key = key.replace("__", ".")
            if value is None:
                sd.pop(key)
            else:
                sd[key] = value
        return _variant(folder, tmp_path / name, {"model": sd})

    pos = "gpt.text_pos_embedding.emb.weight"
    bad = model_with("shape", **{pos.replace(".", "__"): torch.zeros(500, 256)})
    _error(lambda: read_xtts_v2(bad), "model.pth", pos, "[500, 256]", "needs [404, 256]",
           "gpt_max_text_tokens + 2")
    extra = model_with("extra", gpt__extra__weight=torch.zeros(3))
    _error(lambda: read_xtts_v2(extra), "model.pth", "gpt.extra.weight", "no entry")
    gone = model_with("gone", gpt__final_norm__bias=None)
    _error(lambda: read_xtts_v2(gone), "model.pth", "has no gpt.final_norm.bias")
    nan = torch.full((256,), float("nan"))
    _error(lambda: read_xtts_v2(model_with("nan", gpt__final_norm__bias=nan)), "non-finite")
    spec = "hifigan_decoder.speaker_encoder.torch_spec.0.filter"
    changed = model_with("spec", **{spec.replace(".", "__"): torch.tensor([[[-0.9, 1.0]]])})
    _error(lambda: read_xtts_v2(changed), "model.pth", spec, "differs")
    wte = model_with("wte", gpt__gpt__wte__weight=torch.zeros(1026, 256))
    _error(lambda: read_xtts_v2(wte), "model.pth", "gpt.gpt.wte.weight", "differs from "
           "gpt.mel_embedding.weight")
    perceiver = {k.replace(".", "__"): None for k in released_sd
                 if k.startswith("gpt.conditioning_perceiver.")}
    v1 = model_with("v1", **perceiver, gpt__prompt_embedding__weight=torch.zeros(1026, 256))
    _error(lambda: read_xtts_v2(v1), "model.pth", "is an XTTS v1 checkpoint",
           "myxtts speaks XTTS-v2")


def test_wrong_optional_files_are_named(folder, tmp_path):
    voices = torch.load(folder / "speakers_xtts.pth", weights_only=True)
    voices["Ana Florence"]["gpt_cond_latent"] = torch.zeros(1, 32, 128)
    bad = _variant(folder, tmp_path / "speakers")
    shutil.copy(folder / "model.pth", bad / "model.pth")
    torch.save(voices, bad / "speakers_xtts.pth")
    _error(lambda: read_xtts_v2(bad), "speakers_xtts.pth", "'Ana Florence'", "gpt_cond_latent",
           "[1, 32, 128]", "needs [1, 32, 256]")
    (bad / "speakers_xtts.pth").unlink()
    torch.save(torch.zeros(80), bad / "mel_stats.pth")
    _error(lambda: read_xtts_v2(bad), "mel_stats.pth", "<= 0")
    (bad / "mel_stats.pth").unlink()
    dvae = reference_dvae().state_dict()
    dvae["codebook.embed"] = torch.zeros(512, 8192)
    torch.save(dvae, bad / "dvae.pth")
    _error(lambda: read_xtts_v2(bad), "dvae.pth", "codebook.embed", "needs [512, 1024]")


# ------------------------------------------------------------------ writing

@pytest.mark.slow
def test_written_folder_reads_in_coqui_and_back(release, reference, folder, tmp_path):
    out = write_xtts_v2(tmp_path / "export", release)
    assert {p.name for p in out.iterdir()} == {
        "config.json", "model.pth", "vocab.json", "speakers_xtts.pth", "dvae.pth",
        "mel_stats.pth", ".myxtts-xtts"}
    written = torch.load(out / "model.pth", weights_only=True)
    assert list(written) == ["model"]
    assert not any(".gpt_inference." in k or k == "gpt.gpt.wte.weight" for k in written["model"])
    coqui_read = load_reference(out)
    ours, theirs = coqui_read.state_dict(), reference.state_dict()
    assert set(ours) == set(theirs)
    for key in theirs:
        if key.endswith(NORM_PAIR):
            prefix = key[:-len(NORM_PAIR[0])]
            assert torch.equal(coqui_read.get_submodule(prefix).weight,
                               reference.get_submodule(prefix).weight), key
        else:
            assert torch.equal(ours[key], theirs[key]), key
    again = read_xtts_v2(out)
    _same_dict(again.weights, release.weights)
    assert again.config == release.config and again.vocab == release.vocab
    _same_dict(again.dvae, release.dvae)
    assert torch.equal(again.mel_stats, release.mel_stats)
    for name, voice in release.speakers.items():
        _same_dict(again.speakers[name], voice)
    source = json.loads((folder / "config.json").read_text())
    assert json.loads((out / "config.json").read_text())["run_name"] == source["run_name"]


def test_writing_replaces_only_its_own_folder(release, tmp_path):
    out = write_xtts_v2(tmp_path / "export", release)
    lean = XttsV2Files(release.config, release.weights, release.vocab)
    write_xtts_v2(out, lean)  # an earlier export is replaced, its extra files removed
    assert {p.name for p in out.iterdir()} == {"config.json", "model.pth", "vocab.json",
                                               ".myxtts-xtts"}
    assert read_xtts_v2(out).config == release.config  # from a config.json of our keys alone
    (tmp_path / "victim.txt").write_text("kept")  # a record names files of the folder only
    with open(out / ".myxtts-xtts", "a") as fh:
        fh.write("../victim.txt\n")
    write_xtts_v2(out, lean)
    assert (tmp_path / "victim.txt").read_text() == "kept"
    (out / "notes.txt").write_text("mine")
    _error(lambda: write_xtts_v2(out, lean), "notes.txt", "did not write")
    _error(lambda: write_xtts_v2(release.source / "sub", release), "read from")


@pytest.mark.slow
def test_a_bundle_carries_an_evaluation_record_and_refuses_a_malformed_one(reduced_folder,
                                                                          tmp_path):
    import dataclasses

    from myxtts.artifacts.bundle import CHECKSUM_KEY, read_sealed, seal
    from myxtts.artifacts.xtts_v2 import read_xtts_v2_bundle, write_xtts_v2_bundle

    record = {"step": 3, "utterances": 1, "metrics": {"mcd_db": 7.5}}
    files = dataclasses.replace(read_xtts_v2(reduced_folder), dvae=None, evaluation=record)
    path = tmp_path / "xtts.safetensors"
    write_xtts_v2_bundle(path, files)
    assert read_xtts_v2_bundle(path).evaluation == record
    meta, tensors = read_sealed(path)
    meta = {k: v for k, v in meta.items() if k != CHECKSUM_KEY}
    (tmp_path / "bad.safetensors").write_bytes(seal(tensors, {**meta, "xtts.evaluation": "[1]"}))
    with pytest.raises(ArtifactError, match="'xtts.evaluation' is not an evaluation record"):
        read_xtts_v2_bundle(tmp_path / "bad.safetensors")
