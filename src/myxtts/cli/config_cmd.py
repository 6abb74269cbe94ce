"""`myxtts config show`: print the complete, commented, resolved config."""

from __future__ import annotations

import argparse

from myxtts.cli.common import add_config_args, config_from_args
from myxtts.config import to_yaml


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="show the resolved configuration as commented YAML")
    csub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = csub.add_parser("show", help="print the full config (load it back with --config)")
    add_config_args(show)
    show.set_defaults(func=_show)


def _param_counts_header(cfg) -> str:
    """Parameter count of the configured model, so a preset's size is visible before training."""
    try:  # deferred: torch; `myxtts --help` starts without it
        from myxtts.model.xtts import count_parameters
    except ImportError:  # model package not importable: show the config alone
        return ""
    n = count_parameters(cfg)
    return f"model parameters ({cfg.model.preset} preset as configured): {n / 1e6:.2f} M"


def _show(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    header = "myxtts config; load with `myxtts <command> --config FILE`."
    extra = _param_counts_header(cfg)
    if extra:
        header += "\n" + extra
    print(to_yaml(cfg, header=header))
    return 0
