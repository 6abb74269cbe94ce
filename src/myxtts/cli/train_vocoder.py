"""`myxtts train-vocoder DATA`: train the neural vocoder on a store with audio (or a raw
dataset, prepared with audio first)."""

from __future__ import annotations

import argparse
import logging

from myxtts.cli.common import add_config_args, config_from_args, seed_arg
from myxtts.cli.signals import EXIT_CODES
from myxtts.outputs import no_empty_folder_left, output_folder

DEFAULT_OUTPUT = "runs/vocoder"

# flag -> config key; every flag is an override applied after --config and --set
_FLAGS = {"vocoder_preset": "vocoder.preset", "tts_checkpoint": "vocoder.tts_checkpoint",
          "max_steps": "train.max_steps", "vocoder_batch": "vocoder.batch_size",
          "output_dir": "train.output_dir", "seed": "train.seed", "compile": "train.compile",
          "precision": "train.precision", "device": "train.device"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train-vocoder", help="train the neural vocoder (mel -> audio) used by synthesize --vocoder",
        description="Train a Vocos-style GAN vocoder on random fixed-length segments of DATA: a "
                    "store prepared with `myxtts prepare --audio`, or a raw dataset (prepared with "
                    "audio into OUTPUT_DIR/store first). The same command again resumes.")
    p.add_argument("data", help="store with audio, or a raw dataset folder")
    p.add_argument("--resume", metavar="CKPT", help="continue from this vocoder checkpoint "
                   "(default: the newest one in the output folder, if any)")
    p.add_argument("--vocoder-size", dest="vocoder_preset", choices=["tiny", "base"],
                   help="size preset (vocoder.preset): tiny for a CPU, base for a GPU")
    p.add_argument("--tts-checkpoint", metavar="RUN", help="fine-tune on this TTS run's "
                   "teacher-forced mels (vocoder.tts_checkpoint)")
    p.add_argument("--max-steps", type=int, help="optimizer steps (train.max_steps)")
    p.add_argument("--batch-size", dest="vocoder_batch", type=int,
                   help="segments per batch (vocoder.batch_size)")
    p.add_argument("--output-dir", help=f"run folder (train.output_dir; default {DEFAULT_OUTPUT})")
    p.add_argument("--seed", type=seed_arg, help="train.seed")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--compile", dest="compile", action="store_const", const="on",
                   help="torch.compile generator and discriminators (train.compile=on)")
    g.add_argument("--no-compile", dest="compile", action="store_const", const="off",
                   help="train eagerly (train.compile=off)")
    p.add_argument("--precision", choices=["auto", "bf16", "fp32"], help="train.precision")
    p.add_argument("--device", help="train.device: auto, cpu, cuda, cuda:N")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_config_args(p, training=False)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    flags = [f"{key}={getattr(args, name)}" for name, key in _FLAGS.items()
             if getattr(args, name) is not None]
    args.overrides = list(args.overrides) + flags
    # Not the TTS run's default folder; --config, --set and --output-dir still win.
    cfg = config_from_args(args, base_overrides=[f"train.output_dir={DEFAULT_OUTPUT}"],
                           data=args.data)
    output_folder(cfg.train.output_dir, "--output-dir", [
        ("the data", args.data), ("the --tts-checkpoint run", cfg.vocoder.tts_checkpoint or None)],
        create=False)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from myxtts.train.vocoder.recipe import train_vocoder  # deferred: torch

    with no_empty_folder_left(cfg.train.output_dir):
        result = train_vocoder(cfg, args.data, resume=args.resume, progress=not args.quiet)
    print(f"trained the vocoder to step {result.step}; run folder {result.output_dir}; use it "
          f"with `myxtts synthesize --vocoder {result.output_dir} ...`")
    return 0 if result.stopped_by is None else EXIT_CODES[result.stopped_by]  # 128 + signal
