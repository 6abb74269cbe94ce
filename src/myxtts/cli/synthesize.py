"""`myxtts synthesize`: text + reference audio of a voice -> wav."""

from __future__ import annotations

import argparse
from pathlib import Path

from myxtts.cli.common import CLIError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("synthesize", help="speak text in the voice of a reference clip",
                       description="Synthesize each --text in the voice of --reference audio "
                                   "(a few seconds of the target speaker; several clips are joined).")
    p.add_argument("--checkpoint", "-c", required=True,
                   help="a checkpoint .pt file or a run folder (uses its best.pt, else the newest)")
    p.add_argument("--text", "-t", action="append", default=[], help="sentence to speak (repeatable)")
    p.add_argument("--text-file", help="file with one sentence per line")
    p.add_argument("--reference", "-r", action="append", required=True,
                   help="reference audio of the voice to clone (repeatable)")
    p.add_argument("--out", "-o", required=True,
                   help="output .wav (one sentence) or folder (several sentences)")
    p.add_argument("--language", "-l", help="language code (default: the model's default language)")
    p.add_argument("--seed", type=int, default=0, help="seed of the prenet dropout (repeatable output)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    texts = list(args.text)
    if args.text_file:
        path = Path(args.text_file)
        if not path.is_file():
            raise CLIError(f"--text-file {path} does not exist")
        texts += [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not texts:
        raise CLIError("nothing to say: give --text \"...\" or --text-file FILE")
    for r in args.reference:
        if not Path(r).is_file():
            raise CLIError(f"reference audio {r} does not exist")
    out = Path(args.out)
    if len(texts) == 1 and out.suffix.lower() == ".wav":
        outputs = [out]
    else:
        if out.suffix:
            raise CLIError(f"{len(texts)} sentences need an output folder, not the file {out}")
        outputs = [out / f"{i:03d}.wav" for i in range(len(texts))]
    from myxtts.inference.synthesizer import Synthesizer

    synth = Synthesizer.from_checkpoint(args.checkpoint, device=args.device)
    for p in synth.synthesize_to_files(texts, args.reference, outputs, args.language, args.seed):
        print(p)
    return 0
