"""`myxtts demo`: the whole loop on generated data, so a new user sees it work in minutes.

generate data (two made-up languages: one in Latin letters, "en", one in Persian letters,
"fa"; some voices speak one, some both) -> prepare a store -> train the tiny preset ->
speak a sentence of each language in two voices that never spoke the other language
(cross-lingual cloning). Every stage resumes: re-running the command after a kill continues where it
stopped (the data is regenerated only if missing, prepare and training pick up their work).
"""

from __future__ import annotations

import argparse
import logging
import time
from importlib import resources
from pathlib import Path

from myxtts.cli.common import CLIError, add_config_args, config_from_args
from myxtts.cli.signals import EXIT_CODES
from myxtts.outputs import output_folder

DEMO_LANGUAGES = ("en", "fa")


def demo_config_path() -> Path:
    return Path(str(resources.files("myxtts") / "presets" / "demo.yaml"))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="generate data, prepare, train the tiny model, speak two languages in two voices",
                       description="End to end on a generated multi-speaker dataset: about five "
                                   "minutes on a 2-core CPU, much less on a GPU.")
    p.add_argument("--out", default="demo_out", help="folder for data, store, run and wavs")
    p.add_argument("--speakers", type=int, default=8,
                   help="demo speakers (>= 2); many voices teach the model to clone unseen ones")
    p.add_argument("--utterances", type=int, default=125, help="utterances per speaker")
    p.add_argument("--device", default="auto", help="training and synthesis device: auto, cpu, "
                   "cuda, cuda:N")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_config_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # deferred: torch and the training stack; `myxtts --help` starts without them
    from myxtts.data.prepare.build import prepare_store
    from myxtts.evaluate.training import TrainingEvaluation
    from myxtts.inference.synthesizer import Synthesizer
    from myxtts.synthetic import demo_sentence, demo_speaker_f0, make_demo_data, speaker_languages
    from myxtts.train.tts import train

    if args.speakers < 2:
        raise CLIError("--speakers must be >= 2 (the demo speaks in two voices)")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out = output_folder(args.out, "--out")  # before minutes of work, not after
    extra = [f"train.output_dir={out / 'run'}", f"train.device={args.device}"]
    if args.config is None:
        args.config = str(demo_config_path())
    cfg = config_from_args(args, base_overrides=extra)
    t0 = time.perf_counter()

    data = out / "data"
    if not (data / "metadata.csv").is_file():
        print(f"[1/4] generating {args.speakers} speakers x {args.utterances} utterances in {data}")
        make_demo_data(data, speakers=args.speakers, utterances=args.utterances, seed=0,
                       sample_rate=cfg.audio.sample_rate, languages=DEMO_LANGUAGES)
    else:
        print(f"[1/4] demo data already in {data}")
    store = out / "store"
    print(f"[2/4] preparing the feature store {store}")
    prepare_store(data, store, cfg, progress=not args.quiet)
    print(f"[3/4] training the {cfg.model.preset} model for {cfg.train.max_steps} steps "
          f"in {cfg.train.output_dir}")
    result = train(cfg, store, progress=not args.quiet, evaluation=TrainingEvaluation)
    if result.stopped_by_signal:
        print("stopped; run the same command again to continue")
        return EXIT_CODES[result.stopped_by]  # 128 + the signal, as for train

    print("[4/4] speaking a sentence of each language in two voices")
    synth = Synthesizer.from_checkpoint(result.output_dir / "checkpoints", device=args.device)
    spoken = speaker_languages(args.speakers, DEMO_LANGUAGES)
    voices = [0, args.speakers - 1]  # the lowest voice (speaks en only), the highest (fa only)
    outputs = []
    for v in voices:
        ref = _reference_clip(data, f"spk{v}")
        for lang in DEMO_LANGUAGES:
            wav_path = out / f"voice_spk{v}_{lang}.wav"
            synth.synthesize_to_files([demo_sentence(lang)], [ref], [wav_path], language=lang)
            native = "its own language" if lang in spoken[f"spk{v}"] else "a language it never spoke"
            outputs.append((wav_path, ref, demo_speaker_f0(v, args.speakers), native))
    minutes = (time.perf_counter() - t0) / 60
    print(f"\ndone in {minutes:.1f} min. Everything is in {out}/:")
    print(f"  data        {data}  (generated clips, LJSpeech layout + speaker and language columns)")
    print(f"  store       {store}  (packed features; report.json lists rejected clips)")
    print(f"  run         {result.output_dir}  (config.yaml, checkpoints/, metrics.jsonl, "
          f"tensorboard/, samples/)")
    for wav_path, ref, f0, native in outputs:
        print(f"  voice       {wav_path}  (reference {ref.name}, pitch ~{f0:.0f} Hz, {native})")
    print(f"\nlisten to the wavs, or: tensorboard --logdir {result.output_dir}")
    return 0


def _reference_clip(data: Path, speaker: str) -> Path:
    """The longest clip of ``speaker`` in the metadata: the synthesizer wants a reference of at
    least half the conditioning crop after trimming silence (``Synthesizer.reference``), and
    the longest clip is the one most likely to hold that much of the voice."""
    import soundfile as sf  # deferred: numpy and libsndfile, not for `myxtts --help`

    chosen, best = None, -1
    for line in (data / "metadata.csv").read_text(encoding="utf-8").splitlines():
        cols = line.split("|")
        if len(cols) >= 4 and cols[3] == speaker:
            wav = data / "wavs" / f"{cols[0]}.wav"
            try:
                frames = sf.info(str(wav)).frames
            except (OSError, RuntimeError):
                continue
            if frames > best:
                chosen, best = wav, frames
    if chosen is None:
        raise CLIError(f"no clip of {speaker} in {data / 'metadata.csv'}; delete {data} and re-run")
    return chosen
