"""What subcommands share: how one is added, the flags of every subcommand that needs a
config, and the one way to turn them into one."""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable

from myxtts.config import Config, load_config


class CLIError(Exception):
    """A user error: printed as one line, exit code 2, no traceback."""


def add_command(sub: argparse._SubParsersAction, name: str, run: Callable[[argparse.Namespace], int],
                summary: str) -> argparse.ArgumentParser:
    """The subcommand ``name``: ``summary`` in the command list, ``run``'s docstring as its
    ``--help`` description (argparse re-flows it), and ``run`` called with the parsed args."""
    p = sub.add_parser(name, help=summary, description=inspect.getdoc(run))
    p.set_defaults(func=run)
    return p


def add_config_args(p: argparse.ArgumentParser, training: bool = True) -> None:
    """``--config`` and ``--set`` always; the training shortcuts only where they matter
    (``training=False`` for commands such as prepare that never read them)."""
    g = p.add_argument_group("configuration")
    g.add_argument("--config", metavar="YAML", help="config file (see `myxtts config show`)")
    g.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value, e.g. --set train.lr=3e-4 (repeatable)")
    if not training:
        return
    g.add_argument("--model-size", "--preset", dest="preset", choices=["tiny", "small", "base"],
                   help="model size preset (overrides the file's model section)")
    g.add_argument("--batch-frames", type=int, help="frame budget per batch (data.batch_frames)")
    g.add_argument("--batch-size", type=int, help="max utterances per batch (data.max_batch_size)")
    g.add_argument("--num-workers", type=int, help="loader worker processes (data.num_workers; -1 = auto)")
    g.add_argument("--max-steps", type=int, help="optimizer steps (train.max_steps)")
    g.add_argument("--output-dir", help="run folder (train.output_dir)")
    g.add_argument("--seed", type=int, help="train.seed")


_FLAG_TO_KEY = {
    "batch_frames": "data.batch_frames",
    "batch_size": "data.max_batch_size",
    "num_workers": "data.num_workers",
    "max_steps": "train.max_steps",
    "output_dir": "train.output_dir",
    "seed": "train.seed",
}


def config_from_args(args: argparse.Namespace, base_overrides: list[str] | None = None) -> Config:
    """File -> preset -> ``base_overrides`` -> --set -> convenience flags (last wins)."""
    overrides = list(base_overrides or []) + list(getattr(args, "overrides", []) or [])
    for flag, key in _FLAG_TO_KEY.items():
        value = getattr(args, flag, None)
        if value is not None:
            overrides.append(f"{key}={value}")
    return load_config(getattr(args, "config", None), getattr(args, "preset", None), overrides)
