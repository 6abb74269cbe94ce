"""What the bad-input families share: one micro run and its bundle, trained once, and the
checks every case makes (exit code 2, one error line naming the file, nothing already
written changed, nothing new left behind)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from myxtts.cli.main import main


@pytest.fixture(scope="package")
def micro_run(micro_store, tmp_path_factory) -> Path:
    """2 micro steps (checkpoints at step 2 and best.pt); decoding stops at 24 frames."""
    from myxtts.train.tts import train
    from tests.helpers import micro_config

    out = tmp_path_factory.mktemp("bad_inputs") / "run"
    train(micro_config(out, "train.max_steps=2", "train.ckpt_every=2", "train.val_every=2",
                       "model.max_decoder_frames=24"), micro_store, progress=False)
    return out


@pytest.fixture(scope="package")
def micro_bundle(micro_run, tmp_path_factory) -> Path:
    from myxtts.artifacts.bundle import export

    return export(micro_run, tmp_path_factory.mktemp("bundle") / "model.safetensors").path


@pytest.fixture(scope="package")
def reference(micro_store) -> Path:
    return sorted((micro_store.parent / "data" / "wavs").glob("*.wav"))[0]


def snapshot(*paths: Path) -> dict[str, str]:
    """Every file under ``paths`` (recursively) -> sha256: what a case must leave as it was,
    and the names it must not add to (a temp file, a folder named ``-``)."""
    out = {}
    for path in paths:
        files = [path] if path.is_file() else sorted(q for q in path.rglob("*") if q.is_file())
        for q in files:
            if q.name != ".lock":
                out[str(q)] = hashlib.sha256(q.read_bytes()).hexdigest()
    return out


def one_error(argv: list[str], capsys, *needles: str, rc: int = 2) -> str:
    """Run ``argv``; assert exit code ``rc``, no traceback and exactly one error line holding
    every needle; return that line."""
    code = main(argv)  # an unexpected exception fails the test with its traceback
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err, out.err
    assert code == rc, (code, out.out[-2000:], out.err[-2000:])
    errors = [ln for ln in out.err.splitlines() if ": error: " in ln]
    assert len(errors) == 1, out.err
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
    return errors[0]
