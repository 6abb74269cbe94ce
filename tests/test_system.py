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


def _killed_writer(target) -> int:
    """The pid of a process that died by SIGKILL in the middle of an atomic write of
    ``target``: its temp file is still there."""
    import signal
    import subprocess
    import sys

    code = ("import os, signal, sys\nfrom myxtts.system import atomic_open\n"
            "with atomic_open(sys.argv[1]) as fh:\n    fh.write(b'x' * 1000)\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(target)])
    assert proc.wait(timeout=60) == -signal.SIGKILL
    return proc.pid


def test_a_killed_writers_temp_file_goes_when_the_folder_is_next_locked(tmp_path, caplog):
    from myxtts.system import folder_lock, remove_abandoned

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    pid = _killed_writer(run / "checkpoints" / "ckpt_000100.pt")
    left = list((run / "checkpoints").glob(".*.tmp"))
    assert len(left) == 1 and f"-{pid}." in left[0].name  # who wrote it is in its name
    # a live writer's temp file, one from another host and one without a writer stay
    with atomic_open(run / "config.yaml") as fh:
        fh.write(b"a: 1\n")
        live = next(run.glob(".config.yaml.*.tmp"))
        other = run / ".metrics.csv.otherhost-1.abcd1234.tmp"
        plain = run / ".notes.txt.abcd1234.tmp"
        other.write_bytes(b"1")
        plain.write_bytes(b"1")
        with caplog.at_level("INFO", logger="myxtts.system"), folder_lock(run, "myxtts train"):
            assert live.exists() and other.exists() and plain.exists()
            assert not left[0].exists() and "unfinished write of a killed run" in caplog.text
    assert (run / "config.yaml").read_bytes() == b"a: 1\n"
    assert not (run / "checkpoints" / "ckpt_000100.pt").exists()
    assert remove_abandoned(run) == []
