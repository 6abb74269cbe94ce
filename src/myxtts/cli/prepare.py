"""`myxtts prepare DATA --out STORE`: extract features once into a packed store;
`myxtts prepare --verify STORE`: check a store's sizes, checksums and index."""

from __future__ import annotations

import argparse

from myxtts.cli.common import CLIError, add_command, add_config_args, config_from_args
from myxtts.outputs import output_folder
from myxtts.system import available_cpus


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "prepare", _run,
                    "extract features from a dataset into a packed store (resumable)")
    p.add_argument("data", nargs="?", help="dataset folder or manifest file")
    p.add_argument("--out", "-o", metavar="STORE", help="store folder to write (outside the "
                   "dataset)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="extraction processes (default: every available CPU)")
    p.add_argument("--audio", action="store_true",
                   help="also keep every clip's trimmed, resampled waveform (int16) in STORE, for "
                        "vocoder training (the same as --set data.store_audio=true)")
    p.add_argument("--xtts", metavar="XTTS_DIR",
                   help="prepare for fine-tuning this XTTS-v2 folder instead: its text tokens, "
                        "its DVAE's codes and the 22050 Hz audio (a language it lacks grows "
                        "the vocabulary)")
    p.add_argument("--force", action="store_true",
                   help="rebuild STORE, also one that is complete with these settings or was "
                        "prepared with other ones (only files its manifest lists are deleted)")
    p.add_argument("--verify", metavar="STORE",
                   help="check an existing store (sizes, sha256 checksums, index) and exit")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_config_args(p, training=False)


def _run(args: argparse.Namespace) -> int:
    """Read DATA (LJSpeech folder, speaker folders or a manifest), clean and tokenize the
    texts, extract log-mels in parallel and pack them into STORE. A killed prepare resumes
    where it stopped when re-run with the same command."""
    if args.verify:
        from myxtts.data.store import verify_store  # deferred: numpy, not for `myxtts --help`

        problems = verify_store(args.verify)
        for line in problems:
            print(f"problem: {line}")
        if problems:
            print(f"{args.verify}: {len(problems)} problem(s); rebuild with "
                  f"`myxtts prepare DATA --out {args.verify} --force`")
            return 1
        print(f"{args.verify}: ok (sizes, checksums and index consistent)")
        return 0
    if not args.data or not args.out:
        raise CLIError("usage: myxtts prepare DATA --out STORE (or myxtts prepare --verify STORE)")
    if args.workers is not None and args.workers < 1:
        raise CLIError(f"--workers {args.workers}: extraction needs at least one process; use "
                       f"--workers N with N >= 1 (default: {available_cpus()}, the available CPUs)")
    output_folder(args.out, "--out", [("the dataset", args.data)], create=False)
    if args.xtts:
        if args.audio:
            raise CLIError("--audio and --xtts: an XTTS store always keeps the audio (at 22050 "
                           "Hz); leave --audio out")
        from myxtts.train.xtts.prepare import prepare_xtts  # deferred: torch and the model

        prepare_xtts(args.data, args.out, config_from_args(args, data=args.data), args.xtts,
                     workers=args.workers, force=args.force, progress=not args.quiet)
        return 0
    from myxtts.data.prepare.build import prepare_store  # deferred: not for `myxtts --help`

    if args.audio:  # last override, so it wins over --config and --set
        args.overrides = [*args.overrides, "data.store_audio=true"]
    cfg = config_from_args(args, data=args.data)
    prepare_store(args.data, args.out, cfg, workers=args.workers, force=args.force,
                  progress=not args.quiet)
    return 0
