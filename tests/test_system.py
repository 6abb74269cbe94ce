"""Files myxtts writes: atomic, and with the mode a plainly created file would get."""

from __future__ import annotations

import os
import stat

import pytest

from myxtts.system import atomic_open, atomic_write, current_umask


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_atomic_writes_take_the_users_umask(umask, tmp_path):
    old = os.umask(umask)
    try:
        assert current_umask() == umask
        atomic_write(tmp_path / "a.json", "{}")
        with atomic_open(tmp_path / "b.bin", fsync=False) as fh:
            fh.write(b"\0")
        atomic_write(tmp_path / "a.json", "{} ")  # replacing a file: the same mode
    finally:
        os.umask(old)
    for name in ("a.json", "b.bin"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.bin"]  # no temp files
