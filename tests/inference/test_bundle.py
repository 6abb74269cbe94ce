"""`myxtts export`: one portable file that speaks as its run does, checked byte for byte,
read without pickle, a fraction of a training checkpoint's size."""

from __future__ import annotations

import pickle
import stat

import numpy as np
import pytest
import soundfile as sf
import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.artifacts.bundle import export, read_bundle
from myxtts.artifacts.errors import ArtifactError
from myxtts.artifacts.runs import resolve_checkpoint
from myxtts.cli.main import main
from myxtts.inference.synthesizer import Synthesizer

pytestmark = pytest.mark.usefixtures("one_thread")
TEXT = "lamo tesi kunapo."


@pytest.fixture(scope="module")
def reference(micro_store):
    return sorted((micro_store.parent / "data" / "wavs").glob("*.wav"))[0]


@pytest.fixture(scope="module")
def bundle(run, tmp_path_factory):
    return export(run, tmp_path_factory.mktemp("bundle") / "model.safetensors")


@pytest.fixture(scope="module")
def vocoder_run(audio_store, tmp_path_factory):
    from myxtts.config import load_config
    from myxtts.train.vocoder.recipe import train_vocoder

    out = tmp_path_factory.mktemp("vocoder") / "voc"
    train_vocoder(load_config(overrides=[
        "vocoder.dim=16", "vocoder.layers=1", "vocoder.disc_channels=4", "vocoder.periods=[2, 3]",
        "vocoder.segment_frames=8", "vocoder.batch_size=2", f"train.output_dir={out}",
        "train.device=cpu", "train.tensorboard=false", "train.warmup_steps=1",
        "train.max_steps=1", "train.synth_every=0"]), audio_store, progress=False)
    return out


def test_a_bundle_and_the_checkpoints_it_comes_from_are_files_to_share(run, bundle):
    from myxtts.system import current_umask

    mode = 0o666 & ~current_umask()  # what a plainly created file gets (0644 under umask 022)
    for path in (bundle.path, run / "checkpoints" / "best.pt", run / "config.yaml"):
        assert stat.S_IMODE(path.stat().st_mode) == mode, path


def test_the_bundle_speaks_as_its_run_and_is_a_fraction_of_its_size(run, bundle, reference,
                                                                     monkeypatch):
    assert bundle.checkpoint == run / "checkpoints" / "best.pt"
    assert bundle.averaged  # runs keep a moving average of their weights by default
    assert bundle.size == bundle.path.stat().st_size < bundle.checkpoint_size / 2
    from_run = Synthesizer.from_checkpoint(run, device="cpu")

    def no_pickle(*args, **kwargs):
        raise AssertionError("a bundle is read without pickle")

    for owner, name in ((torch, "load"), (torch.serialization, "load"), (pickle, "load"),
                        (pickle, "loads"), (pickle, "Unpickler")):
        monkeypatch.setattr(owner, name, no_pickle)
    from_bundle = Synthesizer.from_checkpoint(bundle.path, device="cpu")
    monkeypatch.undo()
    assert from_bundle.cfg == from_run.cfg and from_bundle.tokenizer == from_run.tokenizer
    assert not from_bundle.neural
    a = from_run.synthesize([TEXT], [reference], seed=5)[0]
    b = from_bundle.synthesize([TEXT], [reference], seed=5)[0]
    assert np.array_equal(a, b)
    contents = read_bundle(bundle.path)
    assert contents.vocoder is None and contents.vocab["languages"] == ["en"]
    assert torch.equal(contents.mel_mean, ck.load(bundle.checkpoint)[ck.MEL_MEAN])


def test_export_and_synthesize_from_the_command_line(run, reference, tmp_path, capsys):
    file = tmp_path / "m.safetensors"
    assert main(["export", str(run), "-o", str(file)]) == 0
    out = capsys.readouterr().out
    assert str(file) in out and "x the size" in out and "averaged (EMA) weights" in out
    for source, wav in ((file, "b.wav"), (run, "r.wav")):
        assert main(["synthesize", "-c", str(source), "-t", TEXT, "-r", str(reference),
                     "-o", str(tmp_path / wav), "--device", "cpu"]) == 0
    assert np.array_equal(sf.read(tmp_path / "b.wav")[0], sf.read(tmp_path / "r.wav")[0])
    named_pt = tmp_path / "m.pt"  # a bundle under any name
    named_pt.write_bytes(file.read_bytes())
    assert Synthesizer.from_checkpoint(named_pt, device="cpu").tokenizer.languages == ["en"]


def _damaged(blob: bytes, at: int) -> bytes:
    return blob[:at] + bytes([blob[at] ^ 0x01]) + blob[at + 1:]


def test_a_changed_byte_a_cut_copy_or_another_file_is_one_line_naming_it(bundle, run, reference,
                                                                          tmp_path, capsys):
    blob = bundle.path.read_bytes()
    header_end = 8 + int.from_bytes(blob[:8], "little")
    config_at = blob.index(b'"config":"') + 20  # a byte inside the config's JSON
    newer = blob.replace(b'"myxtts.bundle":"1"', b'"myxtts.bundle":"9"')
    import safetensors.torch

    cases = {
        "weight.safetensors": (_damaged(blob, (header_end + len(blob)) // 2),
                               "has changed since it was exported"),
        "last.safetensors": (_damaged(blob, len(blob) - 1), "has changed since it was exported"),
        "config.safetensors": (_damaged(blob, config_at), "has changed since it was exported"),
        "cut.safetensors": (blob[: len(blob) - 100], "is truncated"),
        "head.safetensors": (blob[: header_end - 50], "is truncated"),
        "newer.safetensors": (newer, "is a bundle of format 9, newer than this myxtts reads"),
        "plain.safetensors": (safetensors.torch.save({"w": torch.ones(2)}),
                              "is a safetensors file but not a myxtts bundle"),
        "notes.txt": (b"just some text\n", "is not a myxtts model bundle"),
        "empty.safetensors": (b"", "is empty"),
    }
    for name, (data, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(ArtifactError, match=message) as err:
            Synthesizer.from_checkpoint(path, device="cpu")
        assert str(path) in str(err.value) and "\n" not in str(err.value)
        assert main(["synthesize", "-c", str(path), "-t", TEXT, "-r", str(reference),
                     "-o", str(tmp_path / "x.wav"), "--device", "cpu"]) == 2
        err_line = capsys.readouterr().err.strip()
        assert message in err_line and str(path) in err_line and "\n" not in err_line


def test_a_bundle_carries_a_vocoder_and_synthesis_uses_it(run, vocoder_run, reference, tmp_path,
                                                          capsys):
    file = tmp_path / "with_voc.safetensors"
    done = export(run, file, vocoder=vocoder_run)
    assert done.vocoder is not None and done.vocoder.parent.parent == vocoder_run
    synth = Synthesizer.from_checkpoint(file, device="cpu")
    separate = Synthesizer.from_checkpoint(run, device="cpu", vocoder=vocoder_run)
    assert synth.neural and separate.neural
    a = synth.synthesize([TEXT], [reference], seed=2)[0]
    assert np.array_equal(a, separate.synthesize([TEXT], [reference], seed=2)[0])
    griffin_lim = Synthesizer.from_checkpoint(run, device="cpu")
    assert not np.array_equal(a, griffin_lim.synthesize([TEXT], [reference], seed=2)[0])
    assert read_bundle(file).vocoder_config["vocoder"]["dim"] == 16
    assert main(["export", str(vocoder_run), "-o", str(tmp_path / "v.safetensors")]) == 2
    assert "is a vocoder run; give a TTS run here" in capsys.readouterr().err
    assert main(["export", str(run), "-o", str(tmp_path / "v.safetensors"), "--vocoder",
                 str(run)]) == 2
    assert "is a TTS checkpoint, not a vocoder" in capsys.readouterr().err


def test_averaged_weights_go_in_where_the_checkpoint_keeps_them(run, tmp_path, capsys):
    state = ck.load(resolve_checkpoint(run))
    name = next(k for k, v in state[ck.MODEL].items() if v.is_floating_point())
    averaged = torch.full_like(state[ck.MODEL][name], 0.25)
    state["ema"] = {"weights": {name: averaged}, "updates": torch.tensor(4)}
    ck.save(tmp_path / "ema.pt", {k: v for k, v in state.items() if k != ck.FORMAT})
    done = export(tmp_path / "ema.pt", tmp_path / "ema.safetensors")
    assert done.averaged and torch.equal(read_bundle(done.path).weights[name], averaged)
    assert main(["export", str(tmp_path / "ema.pt"), "-o", str(tmp_path / "raw.safetensors"),
                 "--raw-weights"]) == 0
    assert "trained weights" in capsys.readouterr().out
    raw = read_bundle(tmp_path / "raw.safetensors").weights
    assert torch.equal(raw[name], state[ck.MODEL][name])
    assert raw.keys() == state[ck.MODEL].keys()
