"""`myxtts export RUN -o FILE`: a trained model as one portable file for synthesis."""

from __future__ import annotations

import argparse
from pathlib import Path

from myxtts.cli.common import CLIError, add_command
from myxtts.outputs import output_file


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "export", run, "write a trained model as one file to synthesize from")
    p.add_argument("run_path", metavar="RUN", help="a TTS run folder (its best.pt, else the "
                   "newest checkpoint) or a checkpoint .pt file")
    p.add_argument("--out", "-o", required=True, metavar="FILE",
                   help="the bundle to write, e.g. model.safetensors: a file name (not a folder, "
                        "not '-': a bundle is a file to keep); an existing file is replaced only "
                        "if it is a bundle and not one of the inputs")
    p.add_argument("--vocoder", metavar="VOC_RUN", help="also carry this `myxtts train-vocoder` "
                   "run's generator (synthesize then uses it without --vocoder)")
    p.add_argument("--raw-weights", action="store_true", help="the trained weights, not their "
                   "moving average (EMA), where the checkpoint keeps both")


def run(args: argparse.Namespace) -> int:
    """Write RUN as an inference bundle: one safetensors file holding the model's weights
    (their moving average where the checkpoint keeps one), its config, vocabulary with the
    language table, mel statistics and, with --vocoder, a trained vocoder; no optimizer
    state, and no pickle (loading it runs no code). A checksum over the whole file makes a
    damaged copy an error. Synthesize from it with `myxtts synthesize -c FILE`."""
    # deferred: torch; `myxtts --help` starts without it
    from myxtts.artifacts.bundle import BUNDLE_FILE, export
    from myxtts.artifacts.runs import resolve_checkpoint
    from myxtts.evaluate.record import read_evaluation

    if not Path(args.run_path).exists():
        raise CLIError(f"{args.run_path} does not exist; pass a run folder of `myxtts train`")
    if args.vocoder and not Path(args.vocoder).exists():
        raise CLIError(f"--vocoder {args.vocoder} does not exist; pass a `myxtts train-vocoder` "
                       f"run folder")
    checkpoint = resolve_checkpoint(args.run_path)
    inputs = [("the checkpoint being exported", checkpoint),
              ("the --vocoder checkpoint",
               resolve_checkpoint(args.vocoder) if args.vocoder else None)]
    output_file(args.out, "--out", BUNDLE_FILE, inputs)
    done = export(args.run_path, args.out, args.vocoder, args.raw_weights,
                  evaluation=read_evaluation(checkpoint))
    mb = 1 / 2**20
    weights = "averaged (EMA)" if done.averaged else "trained"
    with_voc = f", vocoder from {done.vocoder}" if done.vocoder else ""
    print(f"{done.path}: {done.size * mb:.2f} MB, {weights} weights of {done.checkpoint} "
          f"({done.checkpoint_size * mb:.2f} MB, {done.checkpoint_size / done.size:.1f}x the "
          f"size){with_voc}")
    return 0
