"""Long-form synthesis on a model that never stops: work and memory against the text.

An untrained ``tiny`` model (its stop head never fires, as on a barely trained run) speaks
a Persian text through ``Synthesizer.speak`` (what ``myxtts synthesize --text-file``
runs), with Griffin-Lim, at ``--max-frames`` (``model.max_decoder_frames``; the default
1500 frames makes every decode 17.4 s of audio, slow to measure on a CPU):

* ``guarded``: as shipped -- the first piece too short to last the limit that reaches it
  names the model once, and from then on pieces are cut at the limit, not split;
* ``split to words`` (the baseline): the same with ``longform.StopGuard`` never firing, so
  every sentence is split down to its words and each word decoded to the limit.

Each row runs in a fresh process (peak RSS is that run's alone). The baseline runs only up
to ``--baseline-up-to`` characters: it grows with the number of words, which is the point.
No data or trained model is needed.

    python benchmarks/never_stops.py [--chars 300,3000] [--baseline-up-to 300] [--max-frames 300]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import above_load_mb, machine, measure_plan, say

ARMS = ("split to words", "guarded")
PERSIAN = ("امروز هوا خوب است و ما به پارک می‌رویم. کتاب‌های زیادی در کتابخانه هست، اما وقت "
           "کم است. آیا فردا باران می‌آید؟ دوستان ما از شهر دیگری آمده‌اند و چند روز می‌مانند. ")


def _text(n_chars: int) -> str:
    """``PERSIAN`` repeated and cut at the sentence end nearest ``n_chars``."""
    text = PERSIAN * (n_chars // len(PERSIAN) + 2)
    ends = [i + 1 for i, ch in enumerate(text) if ch in ".؟" and i < n_chars + 40]
    return text[:min(ends, key=lambda i: abs(i - n_chars))]


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _child(arm: str, n_chars: int, max_frames: int, tmp: Path) -> dict:
    """One measurement, in this (fresh) process."""
    import numpy as np
    import soundfile as sf
    import torch

    from myxtts.config import load_config
    from myxtts.inference import longform
    from myxtts.inference.synthesizer import Synthesizer
    from myxtts.model.xtts import build_model
    from myxtts.text import Tokenizer, clean_text

    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    text = _text(n_chars)
    cfg = load_config(overrides=["text.languages=[fa]", "text.default_language=fa",
                                 "train.device=cpu", f"model.max_decoder_frames={max_frames}"])
    tokenizer = Tokenizer.build([clean_text(text, "fa", cfg.text)], ["fa"])
    torch.manual_seed(0)
    model = build_model(cfg, tokenizer.vocab_size, 1, None, None)
    synth = Synthesizer(model, cfg, tokenizer, torch.device("cpu"))
    t = np.arange(int(1.5 * 22050)) / 22050
    sf.write(tmp / "ref.wav", (0.3 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), 22050)
    voice = synth.voice([tmp / "ref.wav"])
    if arm == "split to words":
        longform.StopGuard.check = lambda self, piece: False  # the schedule without the guard
    decoded = {"pieces": 0, "frames": 0}
    real = synth.synthesize_mel

    def counted(texts, *a, **k):
        mels, lengths = real(texts, *a, **k)
        decoded["pieces"] += len(texts)
        decoded["frames"] += int(lengths.sum())
        return mels, lengths

    synth.synthesize_mel = counted
    loaded = _peak_rss_mb()
    t0 = time.perf_counter()
    samples = sum(a.size for _, a in synth.speak([text], voice))
    return {"wall_s": time.perf_counter() - t0, "audio_s": samples / 22050,
            "chars": len(text), "words": len(text.split()),
            "sentences": len(longform.plan_pieces([text], "fa")), **decoded,
            "peak_rss_mb": _peak_rss_mb(), "loaded_rss_mb": loaded}


def _measure(arm: str, n_chars: int, max_frames: int, timeout: int) -> dict:
    say(f"{arm}: {n_chars} characters")
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, __file__, "--child", arm, "--n", str(n_chars),
                               "--max-frames", str(max_frames), "--tmp", tmp],
                              capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"{arm} at {n_chars} characters failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--chars", default="300,3000", help="text lengths, comma-separated")
    p.add_argument("--baseline-up-to", type=int, default=300,
                   help="longest text the split-to-words baseline is run on")
    p.add_argument("--max-frames", type=int, default=300, help="model.max_decoder_frames "
                   "(default 300: 3.5 s per decode)")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per measurement")
    p.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    p.add_argument("--tmp", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.n, args.max_frames, args.tmp)))
        return

    lengths = [int(c) for c in args.chars.split(",")]
    plan = [(n, arm) for n in lengths for arm in ARMS
            if arm == "guarded" or n <= args.baseline_up_to]
    print(f"untrained tiny model, max_decoder_frames {args.max_frames}, Griffin-Lim; "
          f"{machine(os.environ.get('THREADS', '2'))}")
    columns = [("chars", 6), (" words", 7), (" sent.", 7), ("  arm", -17), ("pieces", 7),
               ("frames", 9), ("audio s", 9), ("wall s", 8), ("above load MB", 15),
               ("frames vs base", 16), ("time vs base", 14), ("mem vs base", 13)]

    def line(n: int, arm: str, r: dict, ratios: list[str]) -> str:
        return (f"{r['chars']:>6} {r['words']:>6} {r['sentences']:>6}  {arm:<15}{r['pieces']:>7}"
                f"{r['frames']:>9}{r['audio_s']:>9.0f}{r['wall_s']:>8.1f}{above_load_mb(r):>15.0f}"
                f"{ratios[0]:>16}{ratios[1]:>14}{ratios[2]:>13}")

    measure_plan(plan, lambda n, arm: _measure(arm, n, args.max_frames, args.timeout),
                 "split to words", ("frames", "wall_s", "above"), columns, line)

if __name__ == "__main__":
    main()
