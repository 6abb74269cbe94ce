"""Ctrl-C at any moment is quiet: one line, exit code 130, no traceback -- also while torch
imports (an interrupt there leaves torch half-registered, and a later import of it fails
with "duplicate registrations for aten.linspace"), and while a file is being written
(its temp file is removed and the line says the file was not written). Each case runs in a
process of its own, since the interrupt ends it; the interrupt is sent from inside the
import, so it lands there whatever the machine's speed. A training run stopped by SIGTERM
or SIGHUP saves and exits 143 or 129 (128 + the signal), as Ctrl-C exits 130.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from myxtts.artifacts.runs import CheckpointManager
from tests.helpers import MICRO_MODEL, REPO

# sends SIGINT to its own process when ``name`` is about to be imported (torch's C extension
# is imported from the middle of torch/__init__.py, so torch is half-initialised then)
_INTERRUPT_AT = """
import importlib.abc, os, signal, sys

class InterruptAt(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == {name!r}:
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, InterruptAt())
"""


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{cwd}"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)


def test_ctrl_c_while_torch_imports_is_one_quiet_line(tmp_path):
    code = _INTERRUPT_AT.format(name="torch._C") + textwrap.dedent("""
        from myxtts.cli.main import main
        sys.exit(main(["config", "show"]))
    """)
    proc = _python(code, tmp_path)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr == "myxtts config: interrupted\n", proc.stderr


def test_ctrl_c_during_an_import_inside_a_write_removes_the_unfinished_file(tmp_path):
    (tmp_path / "late_import.py").write_text("import os, signal\n"
                                             "os.kill(os.getpid(), signal.SIGINT)\n"
                                             "import time; time.sleep(1)\n")
    out = tmp_path / "out.bin"
    out.write_bytes(b"the old file")
    code = textwrap.dedent(f"""
        from myxtts.cli.signals import handled_signals
        from myxtts.system import atomic_open

        with handled_signals(lambda: "myxtts test"):
            with atomic_open({str(out)!r}) as fh:
                fh.write(b"half of a new file")
                import late_import  # interrupted half-way: the process ends at once
        raise SystemExit("not reached")
    """)
    proc = _python(code, tmp_path)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr == f"myxtts test: interrupted; {out} not written\n", proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["late_import.py", "out.bin"]
    assert out.read_bytes() == b"the old file"


def test_ctrl_c_before_any_import_and_after_torch_is_quiet(tmp_path):
    for name in ("myxtts.cli.config_cmd", "myxtts.model.xtts"):  # parsing; torch loaded
        code = _INTERRUPT_AT.format(name=name) + textwrap.dedent("""
            from myxtts.cli.main import main
            sys.exit(main(["config", "show"]))
        """)
        proc = _python(code, tmp_path)
        assert proc.returncode == 130 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1 and "interrupted" in proc.stderr, proc.stderr


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143)])
@pytest.mark.slow
def test_a_training_run_stopped_by_a_signal_saves_and_exits_128_plus_the_signal(
        micro_store, tmp_path, signum, code):
    """What docs/protections.md promises: SIGTERM exits 143 (SIGHUP 129 and Ctrl-C 130 take
    the same path: ``cli.signals.EXIT_CODES``), after the checkpoint of the step it stopped
    at."""
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "myxtts.cli.main", "train", str(micro_store), "--quiet",
           "--output-dir", str(run), "--max-steps", "100000", "--set", "train.ckpt_every=100000",
           "--set", "train.val_every=100000"]
    for item in [*MICRO_MODEL, "data.num_workers=0", "train.tensorboard=false",
                 "train.log_every=1", "train.synth_every=0", "train.device=cpu"]:
        cmd += ["--set", item]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    metrics, deadline = run / "metrics.jsonl", time.time() + 120
    while time.time() < deadline and not (metrics.is_file() and metrics.read_text()):
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[0]
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == code, out
    assert "Traceback" not in out and CheckpointManager(run / "checkpoints", 1).latest(), out
