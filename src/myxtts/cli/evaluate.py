"""`myxtts evaluate MODEL DATA`: the numbers TTS papers report, beside the ground truth's."""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
from pathlib import Path

from myxtts.cli.common import CLIError, add_command, seed_arg
from myxtts.metrics import require
from myxtts.outputs import no_empty_folder_left, output_folder
from myxtts.system import writable_folder


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "evaluate", run, "score a trained model on held-out utterances "
                    "(CER/WER, speaker similarity, DNSMOS, MCD, F0, duration, RTF)")
    p.add_argument("model", metavar="MODEL", help="a run folder (its best.pt, else the newest "
                   "checkpoint), a checkpoint .pt file, a bundle of `myxtts export`, or an "
                   "XTTS-v2 folder as downloaded")
    p.add_argument("data", metavar="DATA", help="a dataset (any layout `prepare` reads) or a "
                   "store of `myxtts prepare --audio`")
    p.add_argument("--vocoder", metavar="RUN", help="a `myxtts train-vocoder` run (default: the "
                   "bundle's vocoder where it carries one, else Griffin-Lim)")
    p.add_argument("--max", dest="max_utterances", type=int, default=20, metavar="N",
                   help="utterances to evaluate, a seeded choice (default 20; each costs a few "
                        "seconds of ASR and DNSMOS per row on a CPU)")
    p.add_argument("--split", default="val", choices=["val", "all"], help="the validation "
                   "split prepare makes with the run's data settings (default), or every "
                   "utterance (a held-out test set)")
    p.add_argument("--asr", default="pocketsphinx", metavar="NAME", help="pocketsphinx "
                   "(English, default), whisper[:SIZE] (openai-whisper or faster-whisper with "
                   "its weights on disk) or none")
    p.add_argument("--out", metavar="DIR", help="write evaluation.json and utterances.csv here")
    p.add_argument("--keep-audio", action="store_true", help="also keep each model clip and "
                   "vocoded truth in DIR/audio/")
    p.add_argument("--json", action="store_true", help="print the JSON summary instead of "
                   "the table")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed of the utterance and reference "
                   "choice and of the prenet dropout")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")


def run(args: argparse.Namespace) -> int:
    """Synthesize held-out utterances of DATA with MODEL, each in the voice of another clip
    of the same speaker, and score the output, the true clip's mel through the same vocoder
    ("truth, vocoded") and the true clip itself ("truth") on the same metrics: ASR
    character/word error rates, speaker similarity to the reference clip, DNSMOS SIG/BAK/
    OVRL, and against the true clip mel-cepstral distortion, log-F0 RMSE, voicing error and
    duration ratio; the model's real-time factor. A table per language on screen; JSON and a
    per-utterance CSV with --out. Offline: every model it uses ships inside its package
    (pip install "myxtts[eval]"). What each number means: docs/evaluation.md."""
    from myxtts.metrics.scorer import packages  # deferred: torch, not for `myxtts --help`

    if not Path(args.model).exists():
        raise CLIError(f"MODEL {args.model} does not exist; pass a run folder of `myxtts train`, "
                       f"a checkpoint, a bundle of `myxtts export` or an XTTS-v2 folder")
    if not Path(args.data).exists():
        raise CLIError(f"DATA {args.data} does not exist; pass a dataset folder or a store of "
                       f"`myxtts prepare --audio`")
    if args.vocoder and not Path(args.vocoder).exists():
        raise CLIError(f"--vocoder {args.vocoder} does not exist; pass a `myxtts train-vocoder` "
                       f"run folder")
    if args.max_utterances < 1:
        raise CLIError(f"--max {args.max_utterances}: give at least 1")
    if args.keep_audio and not args.out:
        raise CLIError("--keep-audio needs --out DIR (the clips go to DIR/audio/)")
    out = _out_folder(args) if args.out else None  # before minutes of scoring, not after
    require(*packages(args.asr))  # before any model loads: one line naming what is missing

    # deferred: torch and the model; `myxtts --help` starts without them
    from myxtts.evaluate.harness import evaluate
    from myxtts.evaluate.report import AUDIO_DIR, staging, text_report, to_json, write

    stage = staging(out) if out is not None else None
    with no_empty_folder_left(out) if out is not None else contextlib.nullcontext():
        if out is not None:
            writable_folder(out, "--out")  # (made here: a failed run removes it again)
        try:
            ev = evaluate(args.model, args.data, vocoder=args.vocoder,
                          max_utterances=args.max_utterances, split=args.split, asr=args.asr,
                          device=args.device, seed=args.seed,
                          audio_dir=stage / AUDIO_DIR if stage and args.keep_audio else None,
                          progress=_progress)
            print(json.dumps(to_json(ev), indent=1, ensure_ascii=False) if args.json
                  else text_report(ev))
            if out is not None:
                written = write(ev, out)
                print(f"wrote {', '.join(str(p) for p in written)}", file=sys.stderr)
        finally:  # stopped or failed half-way: the previous evaluation's files stay as they were
            if stage is not None:
                shutil.rmtree(stage, ignore_errors=True)
    return 0


def _out_folder(args: argparse.Namespace) -> Path:
    """``--out``, checked before any scoring: a folder (not a file, not standard output)
    that takes files and is none of the command's inputs, nor a run folder, a store or a
    dataset of its own (each holds an evaluation.json or a table of its own that this
    command must not replace)."""
    from myxtts.data.store.format import MANIFEST  # deferred: numpy, not for `myxtts --help`

    inputs = [("MODEL", args.model), ("DATA", args.data), ("--vocoder", args.vocoder)]
    path = output_folder(args.out, "--out", inputs, create=False)
    marks = {"checkpoints": "a training run", MANIFEST: "a feature store",
             "metadata.csv": "a dataset", "metrics.jsonl": "a training run"}
    for name, what in marks.items():
        if (path / name).exists():
            raise CLIError(f"--out {path} is {what} (it holds {name}); evaluate writes "
                           f"evaluation.json there: choose a folder of its own")
    if path.exists():
        writable_folder(path, "--out")
    else:  # made once the checks passed (a failed run removes it again): its parent now
        writable_folder(_existing_parent(path), "--out")
    return path


def _existing_parent(path: Path) -> Path:
    for folder in path.absolute().parents:
        if folder.exists():
            return folder
    return Path("/")  # pragma: no cover - the root exists


def _progress(done: int, total: int, utterance: str) -> None:
    if done < total:
        print(f"evaluate: utterance {done + 1}/{total}: {utterance}", file=sys.stderr, flush=True)
