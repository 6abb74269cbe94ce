"""`myxtts make-demo-data` and `myxtts inspect-data`: create and look at datasets."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from myxtts.cli.common import CLIError, add_command, add_config_args, config_from_args, seed_arg
from myxtts.outputs import STDOUT, FileKind, output_file, output_folder
from myxtts.system import atomic_write


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "make-demo-data", _make_demo, "write a small synthetic multi-speaker "
                    "corpus (LJSpeech layout) that trains in minutes")
    p.add_argument("out", metavar="OUT", help="folder to create (must be empty or absent)")
    p.add_argument("--speakers", type=int, default=4, help="number of voices (default 4)")
    p.add_argument("--utterances", type=int, default=300, help="utterances per speaker (default 300)")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed of the texts and variations (default 0)")
    p.add_argument("--sample-rate", type=int, default=22050, help="Hz (default 22050)")
    p.add_argument("--languages", default="en", metavar="LANGS",
                   help="comma-separated demo languages: en, fa or en,fa (default en). With two, "
                        "some voices speak one, some the other, some both, and metadata.csv gets "
                        "a language column; train with --set text.languages=[en,fa]")
    p.add_argument("--force", action="store_true",
                   help="replace the corpus an earlier make-demo-data wrote in OUT "
                   "(a folder holding anything else is refused)")

    q = add_command(sub, "inspect-data", _inspect, "summarise a dataset (counts, hours, speakers, "
                    "durations) and list its problems")
    q.add_argument("path", metavar="PATH", help="dataset folder or manifest file")
    q.add_argument("--max-problems", type=int, default=5, metavar="N",
                   help="problems listed per reason (default 5; all are counted)")
    q.add_argument("--json", metavar="FILE", help="also write every problem to FILE as JSON "
                   "('-': to stdout, and the summary to stderr); an existing FILE is replaced "
                   "only if it is JSON and none of the inputs")
    add_config_args(q, training=False)


def _make_demo(args: argparse.Namespace) -> int:
    """Write a deterministic synthetic corpus: a 14-letter made-up language (and, with
    --languages en,fa, a second one in Persian letters) spoken by N voices that differ in
    pitch and timbre. Same arguments -> identical files."""
    from myxtts.synthetic import DEMO_LANGUAGES, make_demo_data  # deferred: not for `myxtts --help`

    out = output_folder(args.out, "OUT", create=False)
    languages = tuple(x.strip() for x in args.languages.split(",") if x.strip())
    if not languages or len(set(languages)) != len(languages) or not set(languages) <= set(DEMO_LANGUAGES):
        raise CLIError(f"--languages must be one or two distinct demo languages of "
                       f"{','.join(DEMO_LANGUAGES)} (e.g. en,fa), got {args.languages!r}")
    if args.speakers < 1 or args.utterances < 1:
        raise CLIError("--speakers and --utterances must be at least 1")
    if args.sample_rate < 16000:
        raise CLIError(f"--sample-rate must be >= 16000 Hz, got {args.sample_rate}")
    if out.exists() and not out.is_dir():
        raise CLIError(f"{out} exists and is not a folder; choose another OUT")
    if out.is_dir() and any(out.iterdir()) and not args.force:
        raise CLIError(f"{out} is not empty; choose a new folder, or pass --force to replace "
                       f"the corpus an earlier make-demo-data wrote there")
    start = time.perf_counter()
    make_demo_data(out, speakers=args.speakers, utterances=args.utterances, seed=args.seed,
                   sample_rate=args.sample_rate, languages=languages)
    n = args.speakers * args.utterances
    print(f"wrote {n} clips ({args.speakers} speakers x {args.utterances}) to {out} "
          f"in {time.perf_counter() - start:.1f} s; see {out / 'README.txt'}")
    print(f"next: myxtts inspect-data {out}")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    """Read a dataset and every clip's header; print counts per split, hours, per-speaker
    totals, a duration histogram, sample rates and the problems found (file:line and the
    fix). Exit code 0 even when problems are found."""
    # deferred: the dataset readers, not for `myxtts --help`
    from myxtts.data.prepare.inspect import format_inspection, inspect_dataset
    from myxtts.data.prepare.records import DatasetError

    cfg = config_from_args(args, data=args.path)
    to_stdout = args.json == STDOUT
    report = output_file(args.json, "--json", JSON_REPORT, [
        ("the dataset", args.path), ("the --config", args.config)], stdout=True) \
        if args.json else None
    summary = sys.stderr if to_stdout else sys.stdout  # stdout carries the JSON alone

    def write(json_text: str) -> None:
        if to_stdout:
            sys.stdout.write(json_text)
        elif report is not None:
            atomic_write(report, json_text)

    try:
        ins = inspect_dataset(args.path, cfg)
    except DatasetError as e:
        if e.report is not None and len(e.report):  # show what made it unusable, then fail
            print(e.report.format(args.max_problems), file=summary)
            write(e.report.to_json())
        raise
    print(format_inspection(ins, cfg, args.max_problems), file=summary)
    write(ins.report.to_json())
    return 0


def _starts_as_json(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(64).lstrip()[:1] in (b"{", b"[")


JSON_REPORT = FileKind("a JSON report", _starts_as_json)
