"""`myxtts evaluate`: what a user can get wrong is one line, before any model loads."""

from __future__ import annotations

import importlib.util

import pytest

from myxtts.cli.main import main


def _run(capsys, *argv):
    rc = main(["evaluate", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("which", ["model", "data", "vocoder"])
def test_a_path_that_does_not_exist_is_named(tmp_path, capsys, which):
    paths = {"model": tmp_path, "data": tmp_path, "vocoder": None}
    paths[which] = tmp_path / "nope"
    extra = ["--vocoder", paths["vocoder"]] if paths["vocoder"] else []
    rc, _, err = _run(capsys, paths["model"], paths["data"], *extra)
    assert rc == 2 and err.count("\n") == 1
    assert f"{tmp_path / 'nope'} does not exist" in err


@pytest.mark.parametrize("args,message", [
    (["--keep-audio"], "--keep-audio needs --out DIR"), (["--max", "0"], "--max 0: give at least 1")])
def test_flags_that_cannot_work_together_are_refused(tmp_path, capsys, args, message):
    rc, _, err = _run(capsys, tmp_path, tmp_path, *args)
    assert rc == 2 and message in err and err.count("\n") == 1


def test_without_the_extra_it_names_the_install_line(tmp_path, capsys, monkeypatch):
    real = importlib.util.find_spec
    absent = {"pocketsphinx", "speechmos"}
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in absent else real(name, *a))
    rc, _, err = _run(capsys, tmp_path, tmp_path)
    assert rc == 2 and err == ('myxtts evaluate: error: the speech metrics need pocketsphinx, '
                               'speechmos, not installed: pip install "myxtts[eval]"\n')
    rc, _, err = _run(capsys, tmp_path, tmp_path, "--asr", "none")  # no recognizer needed
    assert "need speechmos, not installed" in err
