"""`myxtts doctor [DATA|STORE]`: check the machine (and the data, an XTTS store included)
before training."""

from __future__ import annotations

import argparse
import sys

from myxtts.cli.common import CLIError, add_config_args, config_from_args
from myxtts.cli.train import xtts_config_name


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "doctor", help="check this machine (and a store or dataset) for training",
        description="One line per check: ✔ ok, ⚠ works but limited (with its fix), ✗ blocks "
                    "training (with its fix). Exit code 1 when anything blocks training. "
                    "Compiling a test function takes a few seconds (skip it with "
                    "--set train.compile=off).")
    p.add_argument("data", nargs="?", help="prepared store (also an XTTS store of `myxtts prepare "
                                          "--xtts`) or raw dataset to check as well")
    p.add_argument("--init-from", metavar="XTTS_DIR",
                   help="with an XTTS store: check that this XTTS-v2 folder is the model the "
                        "store was made for")
    add_config_args(p, training=False)
    g = p.add_argument_group("loader and device (what the checks size against)")
    g.add_argument("--num-workers", type=int, help="loader worker processes (data.num_workers; "
                                                   "-1 = auto)")
    g.add_argument("--batch-frames", type=int, help="frame budget per batch (data.batch_frames)")
    g.add_argument("--batch-size", type=int, help="max utterances per batch (data.max_batch_size)")
    g.add_argument("--device", help="train.device: auto, cpu, cuda, cuda:N")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from myxtts.data.xtts_store import is_xtts_store  # deferred: numpy

    xtts = args.data is not None and is_xtts_store(args.data)
    if args.init_from and not xtts:
        raise CLIError(f"--init-from: only with a store of `myxtts prepare --xtts` (the XTTS-v2 "
                       f"folder it was made for); {args.data or 'no store'} is not one: leave "
                       f"--init-from out")
    if xtts:  # the loader checks size what `myxtts train` fine-tunes with
        args.config = xtts_config_name(args.config)
    cfg = config_from_args(args, base_overrides=[f"train.device={args.device}"] if args.device
                           else None, data=args.data)
    # deferred: the checks' modules, not for `myxtts --help`
    from myxtts.diagnose.doctor.check import exit_code, format_checks
    from myxtts.diagnose.doctor.run import run_checks

    checks = run_checks(cfg, args.data, init_from=args.init_from)
    try:
        "✔⚠✗—".encode(sys.stdout.encoding or "ascii")
        ascii_only = False
    except (UnicodeEncodeError, LookupError):
        ascii_only = True
    print(format_checks(checks, ascii_only=ascii_only))
    return exit_code(checks)
