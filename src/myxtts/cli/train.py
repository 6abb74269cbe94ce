"""`myxtts train DATA`: train on a prepared store (or, on the fly, on a raw dataset)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from myxtts.cli.common import CLIError, add_config_args, config_from_args, config_with_size
from myxtts.cli.signals import EXIT_CODES
from myxtts.outputs import no_empty_folder_left, output_folder


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train", help="train a model on a prepared store (or a raw dataset, features on the fly)",
        description="Train on STORE (from `myxtts prepare`) or a raw dataset (features on the fly, on "
                    "data.data_device). The same command again continues from the newest checkpoint.")
    p.add_argument("data", help="prepared store folder, or a raw dataset for on-the-fly features")
    p.add_argument("--resume", metavar="CKPT", help="continue from this checkpoint file "
                   "(default: the newest one in the output folder, if any)")
    p.add_argument("--init-from", metavar="RUN_OR_CKPT",
                   help="fine-tune: start a new run (step 0, fresh optimizer, its own "
                        "--output-dir) from this trained run's model (its best.pt, else its "
                        "newest checkpoint) or checkpoint file; the vocabulary grows to cover "
                        "the data. Try --config finetune. On a store of `myxtts prepare "
                        "--xtts`: the XTTS-v2 folder it was made for (config xtts-finetune, "
                        "which --config finetune also reads there, unless --config names "
                        "another)")
    add_run_args(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_config_args(p)
    p.set_defaults(func=run)


def add_run_args(p: argparse.ArgumentParser) -> None:
    """How the step runs: flags ``myxtts profile`` takes too, so it measures the same run."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--compile", dest="compile", action="store_const", const="on",
                   help="force torch.compile of the training step (train.compile=on)")
    g.add_argument("--no-compile", dest="compile", action="store_const", const="off",
                   help="train eagerly (train.compile=off)")
    p.add_argument("--precision", choices=["auto", "bf16", "fp16", "fp32"], help="train.precision")
    p.add_argument("--device", help="train.device: auto, cpu, cuda, cuda:N")
    p.add_argument("--data-device", help="on-the-fly mode: device computing mels (data.data_device)")


def run_overrides(args: argparse.Namespace) -> list[str]:
    """The ``add_run_args`` flags as config overrides."""
    extra = []
    if args.compile:
        extra.append(f"train.compile={args.compile}")
    if args.precision:
        extra.append(f"train.precision={args.precision}")
    if args.device:
        extra.append(f"train.device={args.device}")
    if args.data_device:
        extra.append(f"data.data_device={args.data_device}")
    return extra


def run(args: argparse.Namespace) -> int:
    if args.init_from and args.resume:
        raise CLIError("--init-from starts a new run from a trained model, --resume continues a "
                       "run from its own checkpoint: give one of them")
    from myxtts.data.xtts_store import is_xtts_store  # deferred: numpy

    if is_xtts_store(args.data):
        return _train_xtts(args)
    if args.init_from and args.preset:
        raise CLIError(f"--model-size: the model comes from --init-from {args.init_from}; "
                       f"leave --model-size out")
    if args.init_from:
        cfg = config_from_args(args, run_overrides(args), args.data)
        size_line = f"model: the one of {args.init_from} (fine-tuning it)"
    else:
        cfg, size_line = config_with_size(args, run_overrides(args), args.data)
    output_folder(cfg.train.output_dir, "--output-dir", [
        ("the data", args.data), ("the --init-from run", args.init_from),
        ("the train.vocoder run", cfg.train.vocoder or None)], create=False)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(size_line, flush=True)
    from myxtts.evaluate.training import TrainingEvaluation  # deferred: torch
    from myxtts.train.tts import train

    with no_empty_folder_left(cfg.train.output_dir):
        result = train(cfg, args.data, resume=args.resume, progress=not args.quiet,
                       init_from=args.init_from, evaluation=TrainingEvaluation)
    print(f"trained to step {result.step}; run folder {result.output_dir}"
          + (f"; last checkpoint {result.last_checkpoint}" if result.last_checkpoint else ""))
    if result.skipped_steps:  # said also with --quiet: "loss nan" in a bar may go unseen
        from myxtts.data.store.format import store_state  # deferred: numpy

        check = (f"`myxtts prepare --verify {args.data}`" if store_state(Path(args.data)) ==
                 "complete" else "`myxtts inspect-data` on the data")
        print(f"{result.skipped_steps} step(s) of this run were skipped for a non-finite loss "
              f"or gradient: if the data may hold NaN or infinite values, check it with "
              f"{check}; else lower train.lr or try --set train.precision=fp32",
              file=sys.stderr)
    return 0 if result.stopped_by is None else EXIT_CODES[result.stopped_by]  # 128 + signal


def xtts_config_name(name: str | None) -> str:
    """The config an XTTS-v2 fine-tune reads: ``xtts-finetune`` unless another is named;
    ``finetune`` (the myxtts model's fine-tuning config, 40 times its learning rate) means
    fine-tuning, so on an XTTS store it reads ``xtts-finetune`` too."""
    return "xtts-finetune" if name in (None, "finetune") else name


def _train_xtts(args: argparse.Namespace) -> int:
    """Fine-tune XTTS-v2 on a store of `myxtts prepare --xtts`."""
    if args.preset:
        raise CLIError("--model-size: an XTTS-v2 store trains the model given with --init-from; "
                       "leave --model-size out")
    args.config = xtts_config_name(args.config)
    cfg = config_from_args(args, run_overrides(args))
    output_folder(cfg.train.output_dir, "--output-dir", [
        ("the data", args.data), ("the --init-from model", args.init_from)], create=False)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(f"model: XTTS-v2 of {args.init_from or cfg.train.output_dir} (config {args.config})",
          flush=True)
    from myxtts.evaluate.xtts_training import XttsTrainingEvaluation  # deferred: torch
    from myxtts.train.xtts.recipe import train_xtts

    with no_empty_folder_left(cfg.train.output_dir):
        result = train_xtts(cfg, args.data, resume=args.resume, init_from=args.init_from,
                            progress=not args.quiet, evaluation=XttsTrainingEvaluation)
    print(f"trained to step {result.step}; run folder {result.output_dir}"
          + (f"; last checkpoint {result.last_checkpoint}" if result.last_checkpoint else ""))
    if result.skipped_steps:
        print(f"{result.skipped_steps} step(s) of this run were skipped for a non-finite loss "
              f"or gradient: lower train.lr or try --set train.precision=fp32", file=sys.stderr)
    return 0 if result.stopped_by is None else EXIT_CODES[result.stopped_by]  # 128 + signal
