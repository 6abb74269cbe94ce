"""`myxtts synthesize`: text + reference audio of a voice -> wav (or a stream of audio)."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from myxtts.cli.common import CLIError, seed_arg
from myxtts.cli.signals import quiet_stdout
from myxtts.outputs import STDOUT, FileKind, Inputs, output_file, output_folder
from myxtts.system import atomic_open, path_kind

if TYPE_CHECKING:
    from myxtts.inference.synthesizer import Synthesizer
    from myxtts.inference.xtts_v2.synthesizer import XttsV2Synthesizer


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("synthesize", help="speak text in the voice of reference clips",
                       description="Speak each --text (or the whole --text-file) in the voice of "
                                   "the --reference clips. Long text is split into sentences, "
                                   "decoded a window of sentences at a time (one output .wav is "
                                   "written as it goes, with progress) and joined with short "
                                   "pauses.")
    p.add_argument("--checkpoint", "-c", required=True,
                   help="a run folder (uses its best.pt, else the newest checkpoint), a "
                        "checkpoint .pt file, a bundle from `myxtts export`, or Coqui's "
                        "XTTS-v2 folder as downloaded (config.json, model.pth, vocab.json, ...)")
    p.add_argument("--text", "-t", action="append", default=[], help="text to speak (repeatable: "
                   "one wav each)")
    p.add_argument("--text-file", help="UTF-8 text file spoken as one text (paragraphs and "
                   "sentences are split and joined with pauses)")
    p.add_argument("--reference", "-r", action="append", default=[],
                   help="reference audio of the voice to clone (repeatable: the clips' voices "
                        "are averaged)")
    p.add_argument("--speaker", help="XTTS-v2: a voice stored with the model "
                   "(speakers_xtts.pth) instead of --reference")
    p.add_argument("--out", "-o", required=True,
                   help="a name ending in .wav: that file (one text); any other name, or an "
                        "existing folder: a folder of 000.wav, 001.wav, ... one per text; '-' "
                        "(with --stream only): raw 16-bit PCM on stdout, to pipe into a player. "
                        "An existing file is replaced only if it is a WAV and none of the inputs")
    p.add_argument("--vocoder", metavar="RUN", help="neural vocoder run from `myxtts "
                   "train-vocoder` (default: the bundle's vocoder where it carries one, else "
                   "Griffin-Lim)")
    p.add_argument("--raw-weights", action="store_true", help="speak with the trained weights "
                   "even where the run kept a moving average of them (train.ema_decay), which "
                   "is used by default")
    p.add_argument("--language", "-l", help="language code (default: each text's by its "
                   "letters, e.g. Persian letters fa, Latin en; the model's default for a text "
                   "without letters)")
    p.add_argument("--stream", action="store_true", help="write audio while it is generated and "
                   "report time to first audio and real-time factor")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed of the prenet dropout, or of "
                   "XTTS-v2's sampling (repeatable output)")
    x = p.add_argument_group("XTTS-v2 decoding (defaults: the model's config.json)")
    x.add_argument("--greedy", action="store_true", help="the most likely code at every step "
                   "(the repetition penalty still applies): the same output every time")
    x.add_argument("--temperature", type=_positive(float), help="sampling temperature")
    x.add_argument("--top-k", type=_positive(int), help="sample among the K most likely codes")
    x.add_argument("--top-p", type=_unit, help="sample among the most likely codes holding "
                   "this share of the probability")
    x.add_argument("--repetition-penalty", type=_positive(float), help="divides the score of "
                   "codes already spoken (1: off)")
    x.add_argument("--max-codes", type=_positive(int), help="at most N codes per sentence "
                   "(~46 ms of speech each; default: the model's limit)")
    x.add_argument("--speed", type=_positive(float), help="speaking rate (1: as trained; "
                   "1.2: 20%% faster)")
    x.add_argument("--batch-pieces", type=_positive(int), metavar="N",
                   help="decode up to N pieces of a long text together, one batch (default "
                   "8; 1: one after another, as the reference does; greedy audio is the "
                   "same either way, sampled audio another draw)")
    x.add_argument("--dtype", choices=("float32", "bfloat16"), help="the GPT's precision "
                   "(default float32, equal to Coqui's implementation; bfloat16 reads half "
                   "the weights per code: faster, codes may differ)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.set_defaults(func=run)


XTTS_ONLY = ("speaker", "greedy", "temperature", "top_k", "top_p", "repetition_penalty",
             "max_codes", "speed", "dtype", "batch_pieces")


def _positive(kind: type) -> object:
    def parse(text: str) -> float | int:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text} must be above 0")
        return value
    return parse


def _unit(text: str) -> float:
    value = _positive(float)(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{text} must be in (0, 1]")
    return value


def read_text_file(name: str) -> str:
    path = Path(name)
    if not path.is_file():
        raise CLIError(f"--text-file {path} does not exist (or is not a file)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise CLIError(f"--text-file {path} is not UTF-8 text (byte {e.start}); save it as UTF-8") from e
    except OSError as e:
        raise CLIError(f"--text-file {path} cannot be read ({e.strerror})") from e
    if not text.strip():
        raise CLIError(f"--text-file {path} is empty; put the text to speak in it")
    return text


def _is_wav(path: Path) -> bool:
    from myxtts.audio.io import is_wav_file  # deferred: numpy, not for `myxtts --help`

    return is_wav_file(path)


WAV_FILE = FileKind("a WAV file", _is_wav)


def output_paths(out: str, n_texts: int, stream: bool, inputs: Inputs) -> list[Path | None]:
    """Where each text goes, checked before minutes of decoding: ``-`` is standard output
    (raw PCM, with --stream only: None); a name ending in .wav is that file (one text); any
    other name is a folder that gets ``000.wav``, ``001.wav``, ... one per text. A target
    that is one of ``inputs`` or a file other than a WAV is refused (``outputs.output_file``)."""
    if out == STDOUT:
        if not stream:
            raise CLIError("-o - (standard output) is raw 16-bit PCM while it is generated: it "
                           "needs --stream; add --stream, or give a .wav file name or a folder")
        return [None]
    path = Path(out)
    there = path_kind(path)
    if path.suffix.lower() == ".wav" and there != "a folder":
        if n_texts != 1:
            raise CLIError(f"{n_texts} texts need an output folder, not the file {path}")
        return [output_file(path, "--out", WAV_FILE, inputs)]
    if there != "a folder" and (path.suffix or there != "nothing"):
        what = "" if there == "nothing" else f" is {there}"
        raise CLIError(f"--out {path}{what}: give a .wav file name, a folder (one NNN.wav per "
                       f"text) or - with --stream")
    output_folder(path, "--out")
    return [output_file(path / f"{i:03d}.wav", "--out", WAV_FILE, inputs) for i in range(n_texts)]


def run(args: argparse.Namespace) -> int:
    texts = [t for t in args.text]
    if args.text_file:
        texts.append(read_text_file(args.text_file))
    if not texts or not any(t.strip() for t in texts):
        raise CLIError("nothing to say: give --text \"...\" or --text-file FILE")
    if not args.reference and not args.speaker:
        raise CLIError("give the voice: --reference CLIP (repeatable), or --speaker NAME with "
                       "an XTTS-v2 model")
    if args.reference and args.speaker:
        raise CLIError("give --reference or --speaker, not both")
    for r in args.reference:
        if Path(r).is_dir():
            raise CLIError(f"reference audio {r} is a folder; give audio files (-r a.wav -r b.wav)")
        if not Path(r).is_file():
            raise CLIError(f"reference audio {r} does not exist")
    if args.vocoder and not Path(args.vocoder).exists():
        raise CLIError(f"--vocoder {args.vocoder} does not exist; pass a `myxtts train-vocoder` run folder")
    if args.stream and len(texts) != 1:
        raise CLIError("--stream speaks one text; give one --text or a --text-file")
    inputs = [*(("the --reference clip", r) for r in args.reference),
              ("the --text-file", args.text_file), ("the --checkpoint", args.checkpoint),
              ("the --vocoder", args.vocoder)]
    outputs = output_paths(args.out, len(texts), args.stream, inputs)
    synth = _open(args)
    if args.stream:
        return _stream(synth, texts[0], args, outputs[0])
    if len(outputs) == 1 and outputs[0] is not None:
        return _write_as_it_goes(synth, texts[0], args, outputs[0])
    voice = _voice(synth, args)
    for p in synth.synthesize_to_files(texts, voice, outputs, args.language, args.seed):
        print(p)
    return 0


def _open(args: argparse.Namespace) -> Synthesizer | XttsV2Synthesizer:
    """The synthesizer of ``--checkpoint``: XTTS-v2 (a folder as downloaded, or its bundle)
    with the decoding flags applied, or a model of `myxtts train`, which refuses them."""
    from myxtts.artifacts.xtts_v2 import is_xtts_v2  # deferred: torch

    if is_xtts_v2(args.checkpoint):
        if args.vocoder:
            raise CLIError("--vocoder: XTTS-v2 speaks through its own HiFi-GAN decoder; leave "
                           "--vocoder out")
        if not args.language:  # said before seconds of loading the model
            raise CLIError("XTTS-v2 needs the text's language: pass --language (en, es, fr, "
                           "de, ... as its config.json lists them)")
        from myxtts.inference.xtts_v2.synthesizer import XttsV2Synthesizer  # deferred: torch

        synth = XttsV2Synthesizer.from_path(args.checkpoint, device=args.device,
                                            dtype=args.dtype or "float32")
        synth.with_decoding(greedy=args.greedy or None, max_codes=args.max_codes,
                            speed=args.speed, max_batch=args.batch_pieces,
                            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                            repetition_penalty=args.repetition_penalty)
        return synth
    given = [f"--{k.replace('_', '-')}" for k in XTTS_ONLY if getattr(args, k) not in (None, False)]
    if given:
        raise CLIError(f"{', '.join(given)}: for XTTS-v2 models only; {args.checkpoint} is a "
                       f"model of `myxtts train`")
    from myxtts.inference.synthesizer import Synthesizer  # deferred: torch

    return Synthesizer.from_checkpoint(args.checkpoint, device=args.device, vocoder=args.vocoder,
                                       raw_weights=args.raw_weights)


def _voice(synth: Synthesizer | XttsV2Synthesizer, args: argparse.Namespace):
    """The voice to speak in: a stored speaker (XTTS-v2) or the reference clips."""
    if args.speaker:
        return synth.speaker(args.speaker)
    return synth.voice(args.reference)


def _write_as_it_goes(synth: Synthesizer, text: str, args: argparse.Namespace, out: Path) -> int:
    """One text into one wav, appended window by window: memory stays flat in the text's
    length and a long text shows its progress."""
    import soundfile as sf  # deferred: numpy and libsndfile, not for `myxtts --help`

    from myxtts.audio.io import to_pcm16

    voice = _voice(synth, args)
    t0 = time.perf_counter()

    def progress(done: int, total: int) -> None:
        if total > 1:
            print(f"synthesised {done}/{total} sentences ({time.perf_counter() - t0:.0f} s)",
                  file=sys.stderr, flush=True)

    _say_planning(text)

    # a temp file renamed over ``out`` at the end: a failed, interrupted or terminated
    # synthesis leaves no half-written wav (and says so); an old ``out`` stays as it was
    with atomic_open(out) as fh, sf.SoundFile(fh, "w", synth.sample_rate, 1,
                                              "PCM_16", format="WAV") as sink:
        for _, audio in synth.speak([text], voice, args.language, args.seed, progress):
            sink.write(to_pcm16(audio))
    print(out)
    return 0


LONG_TEXT_CHARS = 100_000  # a text this long takes seconds to clean and plan: said first


def _say_planning(text: str) -> None:
    """Before a long text's seconds of cleaning and sentence planning, one line, so the
    command is not silent (the first progress line follows once it is planned)."""
    if len(text) >= LONG_TEXT_CHARS:
        print(f"cleaning and splitting {len(text):,} characters into sentences",
              file=sys.stderr, flush=True)


def _stream(synth: Synthesizer, text: str, args: argparse.Namespace, out: Path | None) -> int:
    """``text`` spoken while it is generated: into the wav ``out`` (through a temp file, as
    ``_write_as_it_goes``), or with ``out`` None as raw 16-bit PCM on standard output."""
    import soundfile as sf  # deferred: numpy and libsndfile, not for `myxtts --help`

    from myxtts.audio.io import to_pcm16

    sr = synth.sample_rate
    raw = out is None
    if raw and sys.stdout is None:  # started with stdout closed (`>&-`)
        raise CLIError("-o -: standard output is closed; redirect it to a file or a pipe, or "
                       "give -o FILE.wav")
    voice = _voice(synth, args)
    t0 = time.perf_counter()
    first, n_samples = None, 0
    _say_planning(text)
    with contextlib.ExitStack() as stack:  # the wav: closed, then renamed into place
        sink = None if raw else stack.enter_context(sf.SoundFile(
            stack.enter_context(atomic_open(out)), "w", sr, 1, "PCM_16", format="WAV"))
        try:
            for chunk in synth.stream(text, voice, args.language, args.seed):
                if first is None:
                    first = time.perf_counter() - t0
                n_samples += chunk.size
                if raw:
                    sys.stdout.buffer.write(to_pcm16(chunk).astype("<i2").tobytes())
                    sys.stdout.buffer.flush()
                else:
                    sink.write(to_pcm16(chunk))
        except BrokenPipeError:  # the reader stopped (`| head -c 100`): what it took, it has
            quiet_stdout()
            return 0
        except OSError as e:
            if not raw:
                raise
            quiet_stdout()
            raise CLIError(f"-o -: cannot write to standard output ({e.strerror or e}); "
                           f"stopped after {n_samples / sr:.2f} s of audio") from None
    total = time.perf_counter() - t0
    if not raw:
        print(out)
    seconds = n_samples / sr
    print(f"streamed {seconds:.2f} s of audio: first audio after {1000 * (first or 0):.0f} ms, "
          f"real-time factor {total / max(seconds, 1e-9):.3f}", file=sys.stderr)
    return 0


