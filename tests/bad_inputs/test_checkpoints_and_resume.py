"""Hostile and careless inputs around checkpoints and resume, run as a user would.

Every file read back is checked (a flipped byte, a pointer out of its folder, a manifest
naming files outside its store, a checkpoint declaring far more than it holds); a resume
either does what its config says or refuses naming the key; non-finite weights stop a run
and are never saved; a vocabulary of another size and a full disk are one-line errors.
Same outcome rules as tests/test_bad_inputs.py: ``error`` is exit 2 with one error line.
"""

from __future__ import annotations

import io
import json
import shutil
import zipfile
from pathlib import Path

import pytest
import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.artifacts.errors import ArtifactError
from myxtts.artifacts.runs import CheckpointManager
from myxtts.cli.main import main
from myxtts.train.engine import TrainEngine
from tests.helpers import MICRO_MODEL, full_disk_for_checkpoints

SETS = [*MICRO_MODEL, "train.device=cpu", "data.num_workers=0", "train.tensorboard=false",
        "train.synth_every=0", "data.batch_frames=1200", "train.ckpt_every=2",
        "train.val_every=100"]


def _train_argv(store: Path, run: Path, steps: int, *extra: str) -> list[str]:
    return ["train", str(store), "--output-dir", str(run), "--quiet", "--max-steps", str(steps),
            *[a for item in [*SETS, *extra] for a in ("--set", item)]]


@pytest.fixture(scope="module")
def run4(micro_store, tmp_path_factory) -> Path:
    """A micro run trained to step 4, checkpoints at steps 2 and 4."""
    run = tmp_path_factory.mktemp("ckruns") / "run"
    assert main(_train_argv(micro_store, run, 4)) == 0
    return run


@pytest.fixture
def run(run4, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run4, copy)
    return copy


def _one_error(rc: int, capsys) -> str:
    out = capsys.readouterr()
    text = out.out + out.err
    assert "Traceback" not in text, text
    assert rc == 2, (rc, text)
    errors = [ln for ln in out.err.splitlines() if ": error: " in ln]
    assert len(errors) == 1, out.err
    return errors[0]


def _ref(store: Path) -> Path:
    return sorted((store.parent / "data" / "wavs").glob("*.wav"))[0]


def _flip_tensor_byte(path: Path) -> None:
    """Flip one byte in the middle of the checkpoint's largest tensor record."""
    blob = bytearray(path.read_bytes())
    with zipfile.ZipFile(io.BytesIO(bytes(blob))) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    head = info.header_offset
    start = head + 30 + int.from_bytes(blob[head + 26:head + 28], "little") + \
        int.from_bytes(blob[head + 28:head + 30], "little")
    blob[start + info.file_size // 2] ^= 0x10
    path.write_bytes(bytes(blob))


# ---- every file read back is checked

def test_flipped_byte_is_refused_and_auto_resume_falls_back(run, micro_store, capsys, caplog):
    ckpts = run / "checkpoints"
    _flip_tensor_byte(ckpts / "ckpt_00000004.pt")
    with pytest.raises(ArtifactError, match=r"ckpt_00000004\.pt is damaged .*checksum"):
        ck.load(ckpts / "ckpt_00000004.pt")
    line = _one_error(main(["synthesize", "-c", str(ckpts / "ckpt_00000004.pt"), "-t", "a",
                            "-r", str(_ref(micro_store)), "-o", str(run / "o.wav"), "--device",
                            "cpu"]), capsys)
    assert "ckpt_00000004.pt" in line and "checksum" in line
    with caplog.at_level("WARNING"):
        assert CheckpointManager(ckpts, 2).resumable() == ckpts / "ckpt_00000002.pt"
    assert "skipping a damaged checkpoint" in caplog.text


def test_vocoder_style_checkpoint_checked_too(tmp_path):
    path = tmp_path / "v.pt"
    ck.save(path, {"kind": "vocoder", "model": {"w": torch.arange(4096.0)}})
    _flip_tensor_byte(path)
    with pytest.raises(ArtifactError, match="checksum"):
        ck.load(path)


def test_checkpoint_without_checksum_still_loads(run, tmp_path):
    src = run / "checkpoints" / "ckpt_00000004.pt"
    old = tmp_path / "old.pt"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(old, "w") as zout:
        for info in zin.infolist():
            if not info.filename.endswith(ck.DIGEST_ENTRY):
                zout.writestr(info, zin.read(info))
    assert ck.load(old)[ck.PROGRESS]["step"] == 4


@pytest.mark.parametrize("target", ["absolute", "parent"])
def test_pointer_outside_its_run_is_refused(run, tmp_path, target):
    other = tmp_path / "other-run" / "checkpoints"
    other.mkdir(parents=True)
    shutil.copy(run / "checkpoints" / "ckpt_00000002.pt", other / "ckpt_00000009.pt")
    name = str(other / "ckpt_00000009.pt") if target == "absolute" else \
        "../../other-run/checkpoints/ckpt_00000009.pt"
    (run / "checkpoints" / "latest.txt").write_text(name)
    with pytest.raises(ArtifactError, match=r"latest\.txt names"):
        CheckpointManager(run / "checkpoints", 2).latest()


def test_manifest_naming_files_outside_the_store(micro_store, tmp_path, capsys):
    from myxtts.data.store.verify import verify_store

    store = tmp_path / "store"
    shutil.copytree(micro_store, store)
    manifest = json.loads((store / "manifest.json").read_text())
    manifest["files"]["../../../etc/passwd"] = {"size": 1, "sha256": "0"}
    (store / "manifest.json").write_text(json.dumps(manifest))
    problems = verify_store(store)
    assert any("outside the store" in p and "etc/passwd" in p for p in problems), problems
    rc = main(["prepare", "--verify", str(store)])
    text = capsys.readouterr()
    assert rc == 1 and "outside the store" in text.out + text.err


def test_compressed_huge_tensor_is_refused_before_loading(tmp_path, monkeypatch):
    plain = io.BytesIO()
    torch.save({ck.FORMAT: ck.FORMAT_VERSION, "w": torch.zeros(16 * 2**20)}, plain)  # 64 MiB
    bomb = tmp_path / "bomb.pt"
    with zipfile.ZipFile(plain) as zin, zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info), compress_type=zipfile.ZIP_DEFLATED)
    assert bomb.stat().st_size < 2**20

    def never(*a, **k):
        raise AssertionError("torch.load ran on a checkpoint that should be refused unread")

    monkeypatch.setattr(torch, "load", never)
    with pytest.raises(ArtifactError, match=r"bomb\.pt declares 64 MiB"):
        ck.load(bomb)


# ---- resume does what its config says, and config.yaml records it

def test_resume_with_another_model_size_is_refused(run, micro_store, capsys):
    before = (run / "config.yaml").read_bytes()
    line = _one_error(main(_train_argv(micro_store, run, 6, "model.d_model=64")), capsys)
    assert "model.d_model" in line
    assert (run / "config.yaml").read_bytes() == before


def test_resume_without_naming_the_model_trains_the_runs_own(run, micro_store, capsys):
    argv = ["train", str(micro_store), "--output-dir", str(run), "--quiet", "--max-steps", "6",
            *[a for item in SETS if not item.startswith("model.") for a in ("--set", item)]]
    assert main(argv) == 0, capsys.readouterr().err


def test_changed_lr_takes_effect_on_resume(run, micro_store):
    from myxtts.train.engine import lr_factor
    from myxtts.train.tts import TTSRecipe
    from tests.helpers import micro_config

    cfg = micro_config(run, "train.lr=0.123", "train.max_steps=10")
    setup = TTSRecipe(cfg, micro_store, run / "checkpoints" / "ckpt_00000004.pt")
    setup.setup()
    want = 0.123 * lr_factor(4, setup.cfg.train)
    groups = setup.engine.state_dict()[ck.OPTIMIZER]["param_groups"]
    assert [g["lr"] for g in groups] == pytest.approx([want, want])


def test_resume_that_trains_nothing_keeps_config_yaml(run, micro_store):
    before = (run / "config.yaml").read_bytes()
    assert main(_train_argv(micro_store, run, 4, "train.lr=0.5")) == 0
    assert (run / "config.yaml").read_bytes() == before


# ---- non-finite weights stop the run and are never saved

def test_absurd_learning_rate_is_refused_naming_the_key(micro_store, tmp_path, capsys):
    for key in ("train.lr", "vocoder.lr"):
        line = _one_error(main(_train_argv(micro_store, tmp_path / "r", 6, f"{key}=1e300")), capsys)
        assert f"{key}=1e+300 is above 1" in line and "1e-4 to 1e-3" in line
    assert not (tmp_path / "r").exists()


def test_nonfinite_weights_stop_the_run_unsaved(micro_store, tmp_path, capsys, monkeypatch):
    real, calls = TrainEngine.step, []

    def overflow_after_three(self, batches):  # what an update that overflowed leaves behind
        real(self, batches)
        calls.append(1)
        if len(calls) == 3:
            with torch.no_grad():
                next(self.model.parameters()).fill_(float("inf"))

    monkeypatch.setattr(TrainEngine, "step", overflow_after_three)
    run = tmp_path / "r"
    line = _one_error(main(_train_argv(micro_store, run, 6)), capsys)
    assert "non-finite at step 4" in line and "not saved" in line and "train.lr" in line
    assert sorted(p.name for p in (run / "checkpoints").glob("ckpt_*.pt")) == ["ckpt_00000002.pt"]
    weights = ck.load(run / "checkpoints" / "ckpt_00000002.pt")[ck.MODEL]
    assert all(torch.isfinite(w).all() for w in weights.values())


# ---- no tracebacks

def test_resume_with_a_vocabulary_of_another_size(run, micro_store, capsys):
    path = run / "checkpoints" / "ckpt_00000004.pt"
    from myxtts.text.tokenizer import Tokenizer

    state = ck.load(path)  # the run as if trained on a vocabulary of one symbol fewer
    n = Tokenizer.from_dict(state[ck.VOCAB]).vocab_size
    state[ck.VOCAB] = {**state[ck.VOCAB], "tokens": state[ck.VOCAB]["tokens"][:-1]}
    state[ck.MODEL] = {k: v[:-1] if v.ndim and v.shape[0] == n else v
                       for k, v in state[ck.MODEL].items()}
    ck.save(path, state)
    line = _one_error(main(_train_argv(micro_store, run, 6)), capsys)
    assert "another vocabulary" in line


def test_disk_full_while_checkpointing(run, micro_store, capsys, monkeypatch):
    real = full_disk_for_checkpoints(monkeypatch)
    line = _one_error(main(_train_argv(micro_store, run, 6)), capsys)
    assert "disk is full" in line and "ckpt_00000004.pt survives" in line
    monkeypatch.setattr(ck, "atomic_write", real)
    assert ck.load(run / "checkpoints" / "ckpt_00000004.pt")[ck.PROGRESS]["step"] == 4
