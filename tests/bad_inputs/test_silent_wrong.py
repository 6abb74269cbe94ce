"""Settings that would quietly do something else than the user meant are refused naming the
key: ``train.keep_last=0`` would keep every checkpoint (about 1.7 GB each at the base
size) until the disk fills."""

from __future__ import annotations

import pytest

from tests.bad_inputs.test_files_and_folders import _error


@pytest.mark.parametrize("value", ["0", "-2"])
def test_keeping_no_checkpoint_is_refused_naming_the_key(value, micro_store, tmp_path, capsys):
    _error(["train", str(micro_store), "--output-dir", str(tmp_path / "run"), "--set",
            f"train.keep_last={value}"], capsys, "train.keep_last", ">= 1")
    assert not (tmp_path / "run").exists()
