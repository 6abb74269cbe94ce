"""Long-form synthesis: wall time and peak memory against the text's length.

Arms, each length in a fresh process (so peak RSS is that run's alone):

* ``windows``: ``myxtts synthesize --text-file`` itself -- the text decoded a window of
  sentences at a time and appended to the wav as each window finishes;
* ``whole text`` (the baseline): the same sentences decoded in batches of up to 16 as one
  window (so the random state, and the audio, differ a little from the windows'), every mel
  kept and vocoded at once, then joined and written -- what holding the whole text costs;
* ``stream`` (at the shortest length only): ``Synthesizer.stream`` written chunk by chunk,
  with the time to its first audio (the first sentence's decode).

The baseline runs only up to ``--baseline-up-to`` characters: its memory grows with the
text, which is what the windows avoid. The text is the demo corpus' own transcripts, one
after the other (the model's language, words it can say), cut at a sentence end.

    myxtts demo --out DEMO        # a trained model and its data (about 5 minutes on a CPU)
    python benchmarks/longform.py --demo DEMO [--chars 2000,5000,20000]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import above_load_mb, machine, measure_plan, say

ARMS = ("windows", "whole text", "stream")


def _text(data: Path, n_chars: int) -> str:
    """The demo corpus' ``en`` transcripts in file order, repeated, up to ``n_chars``."""
    lines = (data / "metadata.csv").read_text(encoding="utf-8").splitlines()
    sentences = [row.split("|")[1].strip() for row in lines
                 if row.count("|") >= 4 and row.split("|")[4] == "en"]
    if not sentences:
        raise SystemExit(f"{data / 'metadata.csv'} has no 'en' transcripts; pass a demo folder")
    out, k = [], 0
    while sum(len(s) + 1 for s in out) < n_chars:
        out.append(sentences[k % len(sentences)])
        k += 1
    return " ".join(out)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _child(arm: str, checkpoint: Path, reference: Path, text_file: Path, out: Path) -> dict:
    """One measurement, in this (fresh) process."""
    import soundfile as sf
    import torch

    from myxtts.audio.io import save_wav
    from myxtts.inference import longform
    from myxtts.inference.synthesizer import Synthesizer

    loaded = Synthesizer.from_checkpoint(checkpoint, device="cpu")
    rss_loaded = _peak_rss_mb()
    del loaded
    t0 = time.perf_counter()
    if arm == "windows":
        from myxtts.cli.main import main

        rc = main(["synthesize", "-c", str(checkpoint), "-r", str(reference), "--text-file",
                   str(text_file), "-o", str(out), "--device", "cpu"])
        if rc != 0:
            raise SystemExit(f"synthesize exited {rc}")
        first = None
    elif arm == "stream":
        synth = Synthesizer.from_checkpoint(checkpoint, device="cpu")
        voice = synth.voice([reference])
        first = None
        with sf.SoundFile(str(out), "w", synth.cfg.audio.sample_rate, 1, "PCM_16") as sink:
            for chunk in synth.stream(text_file.read_text(encoding="utf-8"), voice):
                first = first if first is not None else time.perf_counter() - t0
                sink.write(chunk)
    else:
        synth = Synthesizer.from_checkpoint(checkpoint, device="cpu")
        text = text_file.read_text(encoding="utf-8")
        language = synth.language_for(text)
        voice = synth.voice([reference])
        pieces = longform.plan_pieces([text], language)
        decoded = longform.decode_window(
            list(enumerate(pieces)),
            lambda batch: synth.synthesize_mel([p.text for p in batch], voice, language, 0,
                                               check=False),
            longform.StopGuard(synth.max_frames, synth.cfg.audio.frames_per_second))
        mels = [m for _, m in decoded]
        lengths = torch.tensor([m.shape[0] for m in mels])
        waves = synth.vocode(torch.nn.utils.rnn.pad_sequence(mels, batch_first=True), lengths)
        sr = synth.cfg.audio.sample_rate
        save_wav(out, longform.join(waves, [p.pause_s for p, _ in decoded], sr), sr)
        first = None
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "audio_s": sf.info(str(out)).duration, "peak_rss_mb": _peak_rss_mb(),
            "loaded_rss_mb": rss_loaded, "first_audio_s": first}


def _measure(arm: str, n_chars: int, args: argparse.Namespace, tmp: Path) -> dict:
    text_file = tmp / f"text_{n_chars}.txt"
    text_file.write_text(_text(args.data, n_chars), encoding="utf-8")
    out = tmp / f"{arm.replace(' ', '_')}_{n_chars}.wav"
    cmd = [sys.executable, __file__, "--child", arm, "--checkpoint", str(args.checkpoint),
           "--reference", str(args.reference), "--text-file", str(text_file), "--out", str(out)]
    say(f"{arm}: {n_chars} characters")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0:
        raise SystemExit(f"{arm} at {n_chars} characters failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--demo", type=Path, help="a `myxtts demo --out` folder: its run, a clip of "
                   "its data as the reference, its transcripts as the text")
    p.add_argument("--checkpoint", type=Path, help="a TTS run (default: DEMO/run)")
    p.add_argument("--reference", type=Path, help="reference clip (default: DEMO/data/wavs/"
                   "spk0_0000.wav)")
    p.add_argument("--data", type=Path, help="demo corpus whose transcripts make the text "
                   "(default: DEMO/data)")
    p.add_argument("--chars", default="2000,5000,20000", help="text lengths, comma-separated")
    p.add_argument("--baseline-up-to", type=int, default=5000,
                   help="longest text the whole-text baseline is run on")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per measurement")
    p.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    p.add_argument("--text-file", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.demo is not None:
        args.checkpoint = args.checkpoint or args.demo / "run"
        args.reference = args.reference or args.demo / "data" / "wavs" / "spk0_0000.wav"
        args.data = args.data or args.demo / "data"
    if args.checkpoint is None or args.reference is None:
        p.error("give --demo DEMO (from `myxtts demo --out DEMO`) or --checkpoint and --reference")
    if args.child:
        print(json.dumps(_child(args.child, args.checkpoint, args.reference, args.text_file,
                                args.out)))
        return
    if args.data is None:
        p.error("give --data (a demo corpus folder) with --checkpoint")
    lengths = [int(c) for c in args.chars.split(",")]
    # the baseline of a length first (its row's ratios need it); the lengths without a
    # baseline (the longest, slowest runs) last
    short = [n for n in lengths if n <= args.baseline_up_to]
    plan = ([(n, arm) for n in short for arm in ("whole text", "windows")]
            + [(min(lengths), "stream")] + [(n, "windows") for n in lengths if n not in short])
    import torch

    print(f"checkpoint {args.checkpoint}, reference {args.reference}; "
          f"{machine(torch.get_num_threads())}")
    columns = [("characters", 10), ("  arm", -13), ("audio s", 9), ("wall s", 9), ("RTF", 7),
               ("peak RSS MB", 13), ("above load MB", 15), ("time vs base", 14),
               ("mem vs base", 13), ("first audio s", 15)]

    def line(n: int, arm: str, r: dict, ratios: list[str]) -> str:
        first = "-" if r["first_audio_s"] is None else f"{r['first_audio_s']:.1f}"
        return (f"{n:>10}  {arm:<11}{r['audio_s']:>9.1f}{r['wall_s']:>9.1f}"
                f"{r['wall_s'] / max(r['audio_s'], 1e-9):>7.3f}{r['peak_rss_mb']:>13.0f}"
                f"{above_load_mb(r):>15.0f}{ratios[0]:>14}{ratios[1]:>13}{first:>15}")

    with tempfile.TemporaryDirectory() as tmp:
        measure_plan(plan, lambda n, arm: _measure(arm, n, args, Path(tmp)), "whole text",
                     ("wall_s", "above"), columns, line)

if __name__ == "__main__":
    main()
