"""Files read back and configs, one family per rule, through the real CLI in-process:

- every field of a bundle is checked before use, checksum or not: a bundle edited and sealed
  again (its checksum recomputed) with a tensor of another shape, a transposed or integer
  tensor, a weight missing or added, the mel statistics missing, a vocabulary shorter than
  the embedding, config or vocabulary JSON nested absurdly deep or not JSON at all, or
  non-finite weights, is one line naming the bundle and the field; so is a checkpoint or a
  vocoder checkpoint with such a field, for synthesis, export and fine-tuning;
- a config cannot expand past a bound before it is expanded (YAML aliases nested nine deep,
  in a file or a --set), and a message quotes at most an excerpt of a bad value;
- messages do not mislead: a bundle where a training checkpoint is expected says what it is
  and what to pass; a 0-byte clip is empty, not "possibly a pipe"; the monitor says that
  the run folder it watches was deleted.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from myxtts.artifacts import bundle as bd
from myxtts.artifacts import checkpoint as ck
from myxtts.cli.main import main
from tests.bad_inputs.conftest import one_error, snapshot

pytestmark = pytest.mark.usefixtures("one_thread")
TOKENS = "text_encoder.token_emb.weight"
LINEAR = "decoder.stop_head.weight"  # [1, d]: transposed it is [d, 1]


def _reseal(good: Path, out: Path, edit: Callable[[dict, dict], None]) -> Path:
    """``good`` with its tensors and metadata changed by ``edit``, sealed with a checksum that
    matches (what anyone can do to a bundle)."""
    tensors = load_file(good)
    with safe_open(good, "pt") as f:
        meta = dict(f.metadata())
    edit(tensors, meta)
    meta.pop(bd.CHECKSUM_KEY, None)
    out.write_bytes(bd._seal(bd._serialize(tensors, meta)))
    return out


def _vocab(meta: dict, change: Callable[[dict], None]) -> None:
    vocab = json.loads(meta["vocab"])
    change(vocab)
    meta["vocab"] = json.dumps(vocab)


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


M = "model."
EDITS = {  # name: (edit of the tensors and metadata, words the error line must hold)
    "a tensor of another shape": (
        lambda t, m: t.update({M + TOKENS: t[M + TOKENS][:, :-1].contiguous()}),
        (f"'{M}{TOKENS}'", "shape")),
    "a transposed tensor": (
        lambda t, m: t.update({M + LINEAR: t[M + LINEAR].t().contiguous()}),
        (f"'{M}{LINEAR}'", "shape")),
    "an int32 tensor": (
        lambda t, m: t.update({M + LINEAR: t[M + LINEAR].to(torch.int32)}),
        (f"'{M}{LINEAR}'", "torch.int32")),
    "a weight missing": (lambda t, m: t.pop(M + LINEAR), ("missing", M + LINEAR)),
    "a weight too many": (lambda t, m: t.update({M + "decoder.extra": torch.zeros(3)}),
                          ("decoder.extra",)),
    "mel_mean missing": (lambda t, m: t.pop("mel_mean"), ("'mel_mean'", "missing")),
    "mel_std of another shape": (lambda t, m: t.update(mel_std=torch.ones(3)),
                                 ("'mel_std'", "shape")),
    "a vocabulary shorter than the embedding": (
        lambda t, m: _vocab(m, lambda v: v["tokens"].pop()), (f"'{M}{TOKENS}'", "vocabulary")),
    "config JSON nested 100,000 deep": (lambda t, m: m.update(config=_nested(100_000)),
                                        ("'config'", "nested 100000 levels deep")),
    "vocabulary JSON nested 50,000 deep": (lambda t, m: m.update(vocab=_nested(50_000)),
                                           ("'vocab'", "nested 50000")),
    "config that is not JSON": (lambda t, m: m.update(config="model: {preset: tiny}"),
                                ("'config'", "not JSON")),
    "config with an unknown key": (
        lambda t, m: m.update(config=json.dumps({**json.loads(m["config"]), "extra": {}})),
        ("'config'", "extra")),
    "a vocabulary that is a list": (lambda t, m: m.update(vocab="[1, 2]"), ("'vocab'",)),
    "NaN weights": (lambda t, m: t[M + LINEAR].fill_(float("nan")),
                    (f"'{M}{LINEAR}'", "non-finite")),
    "infinite mel statistics": (lambda t, m: t["mel_std"].fill_(float("inf")),
                                ("'mel_std'", "non-finite")),
    "a stray tensor": (lambda t, m: t.update(secret=torch.zeros(2)), ("'secret'",)),
    "vocoder weights without their config": (
        lambda t, m: t.update({"vocoder.w": torch.zeros(2)}), ("'vocoder_config'",)),
}


@pytest.mark.parametrize("case", sorted(EDITS))
@pytest.mark.slow
def test_every_field_of_a_resealed_bundle_is_checked(case, micro_bundle, reference, tmp_path,
                                                     capsys):
    edit, needles = EDITS[case]
    bad = _reseal(micro_bundle, tmp_path / "bad.safetensors", edit)
    before = snapshot(tmp_path)
    one_error(["synthesize", "-c", str(bad), "-t", "lamo", "-r", str(reference), "-o",
               str(tmp_path / "o.wav"), "--device", "cpu"], capsys, "bad.safetensors", *needles)
    assert snapshot(tmp_path) == before


def test_a_resealed_bundle_with_a_bad_vocoder_is_refused(micro_bundle, reference, tmp_path,
                                                        capsys):
    from myxtts.config import load_config
    from myxtts.model.vocoder.generator import VocosGenerator

    cfg = load_config(overrides=["vocoder.dim=8", "vocoder.layers=1"])
    weights = VocosGenerator(cfg.audio, cfg.vocoder).state_dict()
    name = next(k for k, v in weights.items() if v.ndim == 2)

    def add_vocoder(t: dict, m: dict) -> None:
        m[bd.VOCODER_CONFIG] = json.dumps(cfg.to_dict())
        t.update({bd.VOCODER_PREFIX + k: v.clone() for k, v in weights.items()})
        t[bd.VOCODER_PREFIX + name] = t[bd.VOCODER_PREFIX + name].t().contiguous()

    bad = _reseal(micro_bundle, tmp_path / "voc.safetensors", add_vocoder)
    one_error(["synthesize", "-c", str(bad), "-t", "lamo", "-r", str(reference), "-o",
               str(tmp_path / "o.wav"), "--device", "cpu"], capsys, "voc.safetensors",
              f"'vocoder.{name}'", "shape")
    assert not (tmp_path / "o.wav").exists()


def test_a_vocoder_checkpoint_with_a_bad_field_is_refused(micro_run, reference, tmp_path, capsys):
    from myxtts.artifacts import vocoder as vck
    from myxtts.config import config_from_dict
    from myxtts.model.vocoder.generator import VocosGenerator

    cfg = config_from_dict({**ck.load(micro_run / "checkpoints" / "best.pt")[ck.CONFIG],
                            "vocoder": {"dim": 8, "layers": 1}})  # the model's mel definition
    weights = VocosGenerator(cfg.audio, cfg.vocoder).state_dict()
    name = next(k for k, v in weights.items() if v.ndim == 2)
    weights[name] = weights[name][:, :-1].contiguous()
    voc = tmp_path / "voc.pt"
    ck.save(voc, {ck.FORMAT: ck.FORMAT_VERSION, vck.KIND: vck.VOCODER, ck.CONFIG: cfg.to_dict(),
                  vck.GENERATOR: weights})
    one_error(["synthesize", "-c", str(micro_run), "--vocoder", str(voc), "-t", "lamo", "-r",
               str(reference), "-o", str(tmp_path / "o.wav"), "--device", "cpu"], capsys,
              "voc.pt", f"'{name}'", "shape")
    assert not (tmp_path / "o.wav").exists()


def _nan_checkpoint(run: Path) -> Path:
    path = run / "checkpoints" / "best.pt"
    state = ck.load(path)
    state[ck.MODEL][LINEAR] = torch.full_like(state[ck.MODEL][LINEAR], float("nan"))
    ck.save(path, state)  # sealed with a matching checksum
    return path


def test_checkpoint_fields_are_checked_for_synthesis_export_and_fine_tuning(micro_run, micro_store,
                                                                           reference, tmp_path,
                                                                           capsys):
    run = tmp_path / "run"
    shutil.copytree(micro_run, run)
    bad = _nan_checkpoint(run)
    before = snapshot(tmp_path)
    field = f"'model.{LINEAR}'"
    for argv in (["synthesize", "-c", str(run), "-t", "lamo", "-r", str(reference), "-o",
                  str(tmp_path / "o.wav"), "--device", "cpu"],
                 ["export", str(run), "-o", str(tmp_path / "m.safetensors")],
                 ["train", str(micro_store), "--init-from", str(bad), "--output-dir",
                  str(tmp_path / "ft"), "--max-steps", "1", "--set", "train.device=cpu"]):
        one_error(argv, capsys, "best.pt", field, "non-finite")
    assert snapshot(tmp_path) == before and not (tmp_path / "ft").exists()


# ---------------------------------------------------------------- configs: bounded, excerpted

def _bomb(levels: int) -> str:
    """YAML aliases nested ``levels`` deep, 9 wide: 9**levels values in a few hundred bytes,
    inside the one key that takes a list of words."""
    anchors = ["&a0 [lol,lol,lol,lol,lol,lol,lol,lol,lol]"] + [
        f"&a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "[[" + ", ".join(anchors) + "]]"


@pytest.mark.parametrize("where", ["file", "--set"])
def test_a_config_cannot_expand_past_its_bound(where, tmp_path, capsys):
    bomb = _bomb(9)  # 387 M values; expanding them took minutes and gigabytes
    path = tmp_path / "bomb.yaml"
    path.write_text(f"train:\n  freeze: {bomb}\n")
    assert path.stat().st_size < 500
    argv = ["config", "show", *(["--config", str(path)] if where == "file" else
                                ["--set", f"train.freeze={bomb}"])]
    line = one_error(argv, capsys, "bomb.yaml" if where == "file" else "train.freeze",
                     "aliases")
    assert len(line) < 300


@pytest.mark.parametrize("make, needles", [
    (lambda p: p.write_text("train:\n  freeze: " + _nested(100_000) + "\n"),
     ("c.yaml", "line 2", "nested more than")),
    (lambda p: p.write_text("train:\n  freeze: &a [*a]\n"), ("c.yaml", "contains it")),
    (lambda p: p.write_text("model:\n  preset: " + "x" * 200_000 + "\n"), ("model.preset",)),
    (lambda p: p.write_text("train:\n  freeze: [" + ", ".join(["decoder"] * 5000) + ", "
                            + _bomb(5)[1:-1] + "]\n"), ("train.freeze[5000]",)),
    (lambda p: p.write_text("train:\n  ? " + "k" * 100_000 + "\n  : 1\n"),
     ("unknown config key",)),
    (lambda p: p.write_text("#" * (2 << 20)), ("c.yaml", "MiB")),
])
def test_a_bad_value_is_quoted_as_an_excerpt(make, needles, tmp_path, capsys):
    path = tmp_path / "c.yaml"
    make(path)
    line = one_error(["config", "show", "--config", str(path)], capsys, *needles)
    assert len(line) < 1000, len(line)  # the value is 100 KB to 2 MB


def test_no_error_line_is_longer_than_the_bound():
    from myxtts.cli.signals import MAX_MESSAGE_CHARS, one_line

    text = one_line("head names the file; " + "x" * 10**6 + "\nthe fix")
    assert len(text) < MAX_MESSAGE_CHARS + 60 and text.startswith("head names the file")
    assert text.endswith("the fix") and "\n" not in text


# ---------------------------------------------------------------- messages that do not mislead

def test_a_bundle_where_a_training_checkpoint_is_expected_says_what_it_is(micro_run, micro_bundle,
                                                                         micro_store, reference,
                                                                         tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(micro_run, run)
    shutil.copy(micro_bundle, run / "checkpoints" / "best.pt")  # a bundle renamed best.pt
    for argv, needles in [
        (["export", str(micro_bundle), "-o", str(tmp_path / "b.safetensors")], ()),
        (["export", str(run), "-o", str(tmp_path / "b.safetensors")], ("ckpt_00000002.pt",)),
        (["train", str(micro_store), "--init-from", str(micro_bundle), "--output-dir",
          str(tmp_path / "ft"), "--max-steps", "1"], ()),
        (["train", str(micro_store), "--init-from", str(run), "--output-dir",
          str(tmp_path / "ft"), "--max-steps", "1"], ("ckpt_00000002.pt",)),
    ]:
        line = one_error(argv, capsys, "is a model bundle", "synthesize -c", "exported from",
                         *needles)
        assert "weights_only" not in line and "delete" not in line
    assert main(["synthesize", "-c", str(run), "-t", "lamo", "-r", str(reference), "-o",
                 str(tmp_path / "o.wav"), "--device", "cpu"]) == 0  # a bundle speaks
    assert not (tmp_path / "b.safetensors").exists() and not (tmp_path / "ft").exists()


@pytest.mark.parametrize("name", ["empty.mp3", "empty.wav"])
def test_a_0_byte_clip_is_empty_not_a_pipe(name, micro_run, tmp_path, capsys):
    clip = tmp_path / name
    clip.write_bytes(b"")
    line = one_error(["synthesize", "-c", str(micro_run), "-t", "lamo", "-r", str(clip), "-o",
                      str(tmp_path / "o.wav"), "--device", "cpu"], capsys, name, "empty: 0 bytes")
    assert "pipe" not in line


def test_monitor_says_that_the_run_folder_was_deleted(micro_run, tmp_path):
    import io

    from myxtts.diagnose.monitor import run_monitor

    run = tmp_path / "run"
    shutil.copytree(micro_run, run)
    out = io.StringIO()
    run_monitor(run, count=2, nvml=object(), clock=lambda: 0.0, out=out, redraw=False,
                sleep=lambda s: shutil.rmtree(run))
    first, second = out.getvalue().split("\n\n")[:2]
    assert "step 2" in first
    assert "no longer exists" in second and "has `myxtts train` started?" not in second
