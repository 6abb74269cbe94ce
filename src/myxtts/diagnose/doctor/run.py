"""``myxtts doctor``: can this machine train, and what will limit it? One line per check.

Why a command of its own: the things that stop or slow a run -- a CPU-only torch, no
GPU visible, a GPU without bf16, a broken inductor toolchain, a /dev/shm too small for
the loader workers (Docker's default is 64 MB), a damaged store -- otherwise surface
minutes into a run, one at a time, as a traceback or as a GPU that quietly waits. Here
every check runs in seconds and each finding carries its fix (the command, flag or
config key), so one pass repairs them all.

:func:`run_checks` gathers the real facts and runs every check in display order: the
machine's (``environment``), then the data's and the loader's (``data``). Each check is
a :class:`~myxtts.diagnose.doctor.check.Check`.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from myxtts import system
from myxtts.config import Config
from myxtts.diagnose.doctor import data as dd
from myxtts.diagnose.doctor import environment as env
from myxtts.diagnose.doctor.check import Check
from myxtts.system import available_cpus


def run_checks(cfg: Config, path: str | Path | None = None, *,
               facts: env.TorchFacts | None = None, python: tuple[int, ...] | None = None,
               cpus: int | None = None, shm_probe: Callable[[], int | None] | None = None,
               compile_fn: Callable[[str], float] | None = None,
               importer: Callable[[str], Any] | None = None,
               init_from: str | Path | None = None) -> list[Check]:
    """Every check for ``cfg`` (and the store or dataset at ``path``; ``init_from``: the
    XTTS-v2 folder an XTTS store is checked against), in display order. The other keyword
    arguments replace the real facts (tests); left out, they are measured."""
    if facts is None:
        try:
            facts = env.probe_torch()
        except (ImportError, OSError) as e:  # no torch, or a CUDA build whose libraries fail
            return [env.check_python(python or tuple(sys.version_info[:3])),
                    Check("torch", "fail", f"cannot import torch ({type(e).__name__}: {e})",
                          "pip install 'torch>=2.4' (" + env.TORCH_INSTALL + ")")]
    cpus = available_cpus() if cpus is None else cpus
    try:
        device = env.training_device(cfg.train.device, len(facts.gpus))
    except ValueError:
        device = "cpu"  # check_gpus reports the setting
    out = [env.check_python(python or tuple(sys.version_info[:3])), env.check_torch(facts)]
    out += env.check_gpus(facts, cfg.train.device, dict(os.environ))
    out += [env.check_precision(facts, cfg.train.precision), env.check_nccl(facts),
            env.check_allocator(facts, dict(os.environ), system.allocator_defaulted),
            env.check_compile(device, cfg.train.compile, compile_fn or env.compile_probe)]
    out += env.check_packages(len(facts.gpus), cfg.train.tensorboard,
                              importer or importlib.import_module, facts.nvml_note)
    data_checks, plan = dd.check_data(cfg, path, init_from=init_from)
    ranks = len(facts.gpus) if device != "cpu" and len(facts.gpus) > 1 else 1
    out += dd.check_loader(cfg, plan, cpus, transfer=device != "cpu", ranks=ranks,
                           shm_free=(shm_probe or dd.shm_free_bytes)())
    out += dd.check_roles(cfg, plan, len(facts.gpus), device)
    return out + data_checks
