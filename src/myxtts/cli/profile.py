"""`myxtts profile DATA`: where a training step's time goes, and what to change (on an XTTS
store of `myxtts prepare --xtts`: XTTS-v2's fine-tuning step, as `myxtts train STORE
--init-from XTTS_DIR` runs it)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from myxtts.artifacts.errors import ArtifactError
from myxtts.cli.common import CLIError, add_config_args, config_from_args, config_with_size
from myxtts.cli.train import add_run_args, run_overrides, xtts_config_name
from myxtts.outputs import output_folder

MAX_STEPS = 1000  # a profile's figures settle within tens of steps; more is a run, not a profile


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile", help="time the real training step phase by phase and say what limits it",
        description="Build the run exactly as `myxtts train DATA` would (same flags and config: "
                    "loader, model, precision, compile mode, CUDA graphs, frame budget), run a few "
                    "untimed steps, then time STEPS steps phase by phase (data wait, host->device "
                    "copy, forward, backward, optimizer, other), with GPU utilisation, MFU, peak "
                    "memory and padding; end with a verdict and the change to try. Writes no "
                    "checkpoint. On a store of `myxtts prepare --xtts`: XTTS-v2's fine-tuning "
                    "step (give --init-from XTTS_DIR, or --run RUN of such a run).")
    p.add_argument("data", help="prepared store folder (also an XTTS store), or a raw dataset "
                                "(features on the fly)")
    p.add_argument("--steps", type=int, default=30, help="measured steps (default 30, at most 1000)")
    p.add_argument("--json", action="store_true",
                   help="print everything as one JSON object on stdout (progress goes to stderr)")
    p.add_argument("--trace", metavar="DIR", type=Path,
                   help="also write a torch.profiler trace of a few steps into DIR "
                        "(TensorBoard's profiler plugin or https://ui.perfetto.dev)")
    p.add_argument("--run", metavar="RUN", type=Path,
                   help="profile this training run's model: its settings and its newest "
                        "checkpoint's weights (nothing is written to it); an XTTS-v2 "
                        "fine-tuning run on its XTTS store")
    p.add_argument("--init-from", metavar="XTTS_DIR",
                   help="on an XTTS store (`myxtts prepare --xtts`): the XTTS-v2 folder it was "
                        "made for, whose GPT the profiled run fine-tunes (config xtts-finetune "
                        "unless --config names another)")
    add_run_args(p)
    add_config_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.steps < 1:
        raise CLIError(f"--steps must be at least 1, got {args.steps}")
    if args.steps > MAX_STEPS:
        raise CLIError(f"--steps {args.steps} is more than {MAX_STEPS}: a profile needs a window "
                       f"of tens of steps (default 30); time a long run with `myxtts train` and "
                       f"its metrics instead")
    if args.trace is not None:  # fail now, not after the whole window
        output_folder(args.trace, "--trace", [("the data", args.data), ("the --run", args.run)])
    from myxtts.data.xtts_store import is_xtts_store  # deferred: numpy

    xtts = is_xtts_store(args.data)
    _check_model_args(args, xtts)
    resume = None
    if args.run is not None:
        from myxtts.artifacts.runs import resolve_checkpoint  # deferred: torch

        try:
            resume = resolve_checkpoint(args.run)
        except ArtifactError as e:
            raise CLIError(f"--run {args.run}: {e}") from e
    if xtts:  # the config `myxtts train` fine-tunes (and continues a run) with
        args.config = xtts_config_name(args.config)
        cfg = config_from_args(args, run_overrides(args), args.run)
    else:
        # the report names the model size (setup line), so no size line here: stderr stays
        # one line for a user error
        cfg, _ = config_with_size(args, run_overrides(args), args.run or args.data)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    # deferred: torch and the training stack; `myxtts --help` starts without them
    from myxtts.diagnose.profile.report import format_report
    from myxtts.diagnose.profile.run import profile

    result = profile(cfg, args.data, args.steps, args.trace, resume=resume,
                     init_from=args.init_from,
                     echo=lambda s: print(s, file=sys.stderr, flush=True))
    print(json.dumps(result, indent=2) if args.json else format_report(result))
    return 0


def _check_model_args(args: argparse.Namespace, xtts: bool) -> None:
    """--init-from only on an XTTS store, which needs it or an XTTS-v2 run (one line each)."""
    if not xtts:
        if args.init_from:
            raise CLIError(f"--init-from: only for a store of `myxtts prepare --xtts` (the "
                           f"XTTS-v2 folder it was made for); {args.data} is not one: leave "
                           f"--init-from out")
        if args.run is not None and _is_xtts_run(args.run):
            raise CLIError(f"--run {args.run} fine-tunes XTTS-v2: profile it on its XTTS store "
                           f"(`myxtts profile STORE --run {args.run}`)")
        return
    if args.init_from and args.run is not None:
        raise CLIError("--init-from starts a new fine-tuning run, --run profiles a run's own "
                       "checkpoint: give one of them")
    if not args.init_from and args.run is None:
        raise CLIError(f"{args.data} is a store for XTTS-v2: give the model it was made for "
                       f"with --init-from XTTS_DIR (or --run RUN of an XTTS-v2 fine-tuning run)")
    if args.preset:
        raise CLIError("--model-size: an XTTS-v2 store trains the model given with --init-from "
                       "or --run; leave --model-size out")
    if args.run is not None and not _is_xtts_run(args.run):
        raise CLIError(f"--run {args.run} is no XTTS-v2 fine-tuning run; give the run that "
                       f"fine-tunes on {args.data}, or --init-from XTTS_DIR")


def _is_xtts_run(path: Path) -> bool:
    from myxtts.artifacts.xtts_v2.run import is_xtts_run  # deferred: torch

    return is_xtts_run(path)
