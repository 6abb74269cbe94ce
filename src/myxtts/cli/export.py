"""`myxtts export RUN -o FILE`: a trained model as one portable file for synthesis."""

from __future__ import annotations

import argparse
from pathlib import Path

from myxtts.cli.common import CLIError, add_command
from myxtts.outputs import output_file


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "export", run, "write a trained model as one file to synthesize from")
    p.add_argument("run_path", metavar="RUN", help="a TTS run folder (its best.pt, else the "
                   "newest checkpoint), a checkpoint .pt file, or an XTTS-v2 model (the folder "
                   "as downloaded, its bundle, or a run fine-tuning it)")
    p.add_argument("--out", "-o", required=True, metavar="FILE",
                   help="the bundle to write, e.g. model.safetensors: a file name (not a folder, "
                        "not '-': a bundle is a file to keep); an existing file is replaced only "
                        "if it is a bundle and not one of the inputs. With --format xtts: the "
                        "folder to write")
    p.add_argument("--format", choices=("bundle", "xtts"), default="bundle",
                   help="bundle (default): one myxtts file; xtts: an XTTS-v2 model in Coqui's "
                        "released folder layout (config.json, model.pth, vocab.json, ...), "
                        "which coqui-tts loads")
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
    from myxtts.artifacts.xtts_v2 import is_xtts_v2  # deferred: torch

    if is_xtts_v2(args.run_path):
        return _export_xtts(args)
    if args.format == "xtts":
        raise CLIError(f"--format xtts writes XTTS-v2 models; {args.run_path} is a model of "
                       f"`myxtts train` (export it as a bundle: leave --format out)")
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


def _export_xtts(args: argparse.Namespace) -> int:
    """An XTTS-v2 model (folder or bundle) as a bundle, or as Coqui's folder layout."""
    # deferred: torch; `myxtts --help` starts without it
    from myxtts.artifacts.bundle import BUNDLE_FILE
    from myxtts.artifacts.xtts_v2 import read_xtts_v2_any, write_xtts_v2, write_xtts_v2_bundle
    from myxtts.artifacts.xtts_v2.run import is_xtts_run
    from myxtts.evaluate.record import read_evaluation
    from myxtts.system import folder_lock

    source = Path(args.run_path)
    if args.vocoder:
        raise CLIError("--vocoder: not for XTTS-v2 models, which carry their own decoder; "
                       "leave it out")
    if args.raw_weights and not is_xtts_run(source):
        raise CLIError(f"--raw-weights: {source} is a released XTTS-v2 model, which keeps no "
                       f"moving average; leave it out")
    files = read_xtts_v2_any(source, args.raw_weights)
    if is_xtts_run(source):  # the bundle carries the run's last evaluation in training
        files.evaluation = read_evaluation(source)
    mb = 1 / 2**20
    if args.format == "xtts":
        out = Path(args.out)
        if out.exists() and not out.is_dir():
            raise CLIError(f"--out {out} is a file; --format xtts writes a folder: give a new "
                           f"or empty folder")
        out.mkdir(parents=True, exist_ok=True)
        with folder_lock(out, "export"):
            write_xtts_v2(out, files)
        size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
        print(f"{out}: XTTS-v2 in Coqui's folder layout, {size * mb:.2f} MB "
              f"({', '.join(sorted(p.name for p in out.iterdir() if not p.name.startswith('.')))})")
        return 0
    output_file(args.out, "--out", BUNDLE_FILE, [("the model being exported", source)])
    size = write_xtts_v2_bundle(args.out, files)
    print(f"{args.out}: {size * mb:.2f} MB, XTTS-v2 from {source} "
          f"({len(files.speakers or {})} stored voices{', DVAE' if files.dvae else ''})")
    return 0
