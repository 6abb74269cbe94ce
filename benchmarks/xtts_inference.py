"""XTTS-v2 synthesis, myxtts against coqui-tts on the same weights, in one run.

    python benchmarks/xtts_inference.py --peer-python PY [--size released|reduced]
        [--max-codes N] [--sentences K] [--threads T] [--device cpu|cuda] [--rounds N]
        [--text-pieces N [--batch-pieces B]] [--json FILE]

The peer environment (``PY``: coqui-tts 0.28 installed, with torchaudio importable;
``tools/oracle_audio.sh`` makes a pure-Python one) writes an XTTS-v2 folder with seeded
random weights (``_xtts_peer.py make``) at the released size (30 layers x 1024, 464 M
parameters with the decoder) or the tests' reduced size. Both implementations then load
that folder, make the voice of one reference clip (untimed), warm up, and speak the same
``--sentences`` English sentences greedily (deterministic: the codes must agree), each
capped at ``--max-codes`` codes (random weights rarely emit the stop code, so both decode
exactly the cap). Per implementation: the real-time factor (synthesis seconds per second
of audio, summed over the sentences; ours also with its GPT in bfloat16, whose codes may
differ from float32's), and with streaming (20 codes per chunk, the
reference's default) the time to the first audio chunk and to the end. ``--rounds N`` runs
the two in turn N times and reports each figure's median. The ratio column is the peer's
time over ours: above 1, myxtts is faster.

``--text-pieces N`` also speaks one long text: the sentences, repeated, joined until the
language's splitting (within its character limit, sentences packed) cuts it into ``N``
pieces. Ours speaks it as one text (``speak``: up to ``--batch-pieces`` pieces decoded
together, one batch), and once more one piece after another (``--batch-pieces 1``); the
peer runs its ``inference`` on each of the same pieces one after another, as its own text
splitting does. Every piece is capped at ``--max-codes`` codes, on both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

HERE = Path(__file__).resolve().parent
SENTENCES = [
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "She sells sea shells by the sea shore, and the shells she sells are surely seashells.",
    "A journey of a thousand miles begins with a single step, or so they say.",
    "In 1969, 2 astronauts walked on the moon while 600 million people watched.",
]


def _peer(args: argparse.Namespace, *argv: str) -> dict:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the peer's own environment, not this tree's sources
    r = subprocess.run([str(args.peer_python), str(HERE / "_xtts_peer.py"), *argv],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"the peer failed ({' '.join(argv[:2])}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _reference_clip(tmp: Path) -> Path:
    """A real clip of ljspeech-mini where it is beside the checkout, else a voiced synthetic one."""
    clips = sorted((common.DEFAULT_DATA / "wavs").glob("*.wav"))
    if clips:
        return clips[0]
    import numpy as np
    import soundfile as sf

    t = np.arange(22050 * 6) / 22050
    wav = 0.3 * np.sin(2 * np.pi * 140 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
    sf.write(tmp / "ref.wav", wav.astype("float32"), 22050)
    return tmp / "ref.wav"


def text_of_pieces(n: int, limit: int = 250) -> tuple[str, list[str]]:
    """A text the English splitting (``limit`` characters) cuts into ``n`` pieces, and them."""
    from myxtts.text.xtts_v2.split import split_text

    words: list[str] = []
    while True:
        words.append(SENTENCES[len(words) % len(SENTENCES)])
        pieces = split_text(" ".join(words), "en", limit)
        if len(pieces) > n:
            words.pop()
            text = " ".join(words)
            return text, split_text(text, "en", limit)


def _timed_text(synth, voice, spec: dict, max_batch: int) -> dict:
    synth.with_decoding(max_batch=max_batch)
    if synth.pieces(spec["text"], spec["language"]) != spec["pieces"]:
        raise SystemExit("the text's pieces differ from the benchmark's plan")
    t0 = time.perf_counter()
    wav = synth.synthesize([spec["text"]], voice, spec["language"])[0]
    return {"seconds": time.perf_counter() - t0, "samples": int(wav.shape[-1])}


def ours(folder: Path, ref: Path, spec: dict, device: str, dtype: str = "float32",
         stream: bool = True) -> dict:
    import torch

    from myxtts.inference.xtts_v2.synthesizer import XttsV2Synthesizer

    torch.set_num_threads(spec["threads"])
    synth = XttsV2Synthesizer.from_path(folder, device=device, dtype=dtype)
    voice = synth.voice([ref])
    synth.with_decoding(greedy=True, max_codes=4)  # the warm-up: every kernel once
    synth.say(spec["sentences"][0], voice, spec["language"])
    if spec.get("pieces"):  # and the batched shapes
        synth.with_decoding(max_batch=spec["batch_pieces"])
        synth.synthesize([spec["text"]], voice, spec["language"])
    synth.with_decoding(max_codes=spec["max_codes"])
    rows = []
    for text in spec["sentences"]:
        t0 = time.perf_counter()
        wav, _ = synth.say(text, voice, spec["language"])
        rows.append({"seconds": time.perf_counter() - t0, "samples": int(wav.shape[-1])})
    text = {}
    if spec.get("pieces"):
        text = {"text": _timed_text(synth, voice, spec, spec["batch_pieces"]),
                "text_sequential": _timed_text(synth, voice, spec, 1)}
    if not stream:
        return {"sentences": rows, **text}
    t0 = time.perf_counter()
    first, samples = None, 0
    for chunk in synth.stream(spec["sentences"][0], voice, spec["language"]):
        first = first if first is not None else time.perf_counter() - t0
        samples += int(chunk.shape[-1])
    return {"sentences": rows, "first_chunk_s": first, "stream_s": time.perf_counter() - t0,
            "stream_samples": samples, **text}


def rtf(run: dict, key: str = "sentences") -> float:
    rows = run[key] if isinstance(run[key], list) else [run[key]]
    return sum(r["seconds"] for r in rows) / (sum(r["samples"] for r in rows) / 24000)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--peer-python", required=True, type=Path, help="interpreter with coqui-tts")
    p.add_argument("--size", choices=("released", "reduced"), default="released")
    p.add_argument("--max-codes", type=int, default=60, help="codes per sentence (~46 ms each)")
    p.add_argument("--sentences", type=int, default=2, help=f"sentences spoken (1-{len(SENTENCES)})")
    p.add_argument("--threads", type=int, default=2, help="torch threads on each side")
    p.add_argument("--device", default="cpu", help="ours: cpu or cuda (the peer runs on the CPU)")
    p.add_argument("--rounds", type=int, default=1, help="peer and ours in turn this many "
                   "times; the table gives each figure's median (a shared machine drifts)")
    p.add_argument("--text-pieces", type=int, default=0, metavar="N", help="also speak one "
                   "text of N pieces (ours: decoded together; the peer: one after another)")
    p.add_argument("--batch-pieces", type=int, default=8, metavar="B",
                   help="ours: pieces decoded together (the synthesizer's max_batch)")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args()
    spec = {"sentences": SENTENCES[:max(1, min(args.sentences, len(SENTENCES)))],
            "language": "en", "max_codes": args.max_codes, "threads": args.threads}
    if args.text_pieces > 0:
        spec["text"], spec["pieces"] = text_of_pieces(args.text_pieces)
        spec["batch_pieces"] = args.batch_pieces
    with tempfile.TemporaryDirectory(prefix="xtts-bench-") as tmp:
        tmp = Path(tmp)
        folder = tmp / "xtts"
        common.say(f"writing a {args.size}-size XTTS-v2 folder with seeded random weights (peer) ...")
        _peer(args, "make", str(folder), "--size", args.size)
        ref = _reference_clip(tmp)
        (tmp / "spec.json").write_text(json.dumps(spec))
        runs: dict[str, list[dict]] = {"peer": [], "mine": [], "half": []}
        for r in range(max(1, args.rounds)):
            common.say(f"round {r + 1}: coqui-tts, greedy synthesis and streaming ...")
            runs["peer"].append(_peer(args, "speak", str(folder), str(ref), str(tmp / "spec.json")))
            common.say(f"round {r + 1}: myxtts, the same ...")
            runs["mine"].append(ours(folder, ref, spec, args.device))
            common.say(f"round {r + 1}: myxtts with the GPT in bfloat16 ...")
            runs["half"].append(ours(folder, ref, spec, args.device, "bfloat16", stream=False))
    peer, mine = runs["peer"][0], runs["mine"][0]
    same = [a["samples"] == b["samples"] for a, b in zip(mine["sentences"], peer["sentences"])]
    f = {name: {"rtf": statistics.median(rtf(x) for x in got)} for name, got in runs.items()}
    for name in ("peer", "mine"):
        for key in ("first_chunk_s", "stream_s"):
            f[name][key] = statistics.median(x[key] for x in runs[name])
    rounds = f", median of {len(runs['peer'])} rounds" if len(runs["peer"]) > 1 else ""
    head = [f"XTTS-v2 {args.size} size, seeded random weights; {len(spec['sentences'])} "
            f"sentences, greedy, {args.max_codes} codes each; torch threads {args.threads}; "
            f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; ours on {args.device}{rounds}",
            f"same audio length per sentence: {'yes' if all(same) else 'NO'}"]
    p_, m_, h_ = f["peer"], f["mine"], f["half"]
    rows = [("real-time factor, whole sentences (lower is faster)",
             [f"{m_['rtf']:.3f}", f"{p_['rtf']:.3f}", f"{p_['rtf'] / m_['rtf']:.2f}x"]),
            ("  the same, our GPT in bfloat16 (--dtype bfloat16)",
             [f"{h_['rtf']:.3f}", f"{p_['rtf']:.3f}", f"{p_['rtf'] / h_['rtf']:.2f}x"]),
            ("streaming: first audio chunk (s)",
             [f"{m_['first_chunk_s']:.2f}", f"{p_['first_chunk_s']:.2f}",
              f"{p_['first_chunk_s'] / m_['first_chunk_s']:.2f}x"]),
            ("streaming: whole first sentence (s)",
             [f"{m_['stream_s']:.2f}", f"{p_['stream_s']:.2f}",
              f"{p_['stream_s'] / m_['stream_s']:.2f}x"])]
    if spec.get("pieces"):
        for name in ("peer", "mine", "half"):
            f[name]["text_rtf"] = statistics.median(rtf(x, "text") for x in runs[name])
        for name in ("mine", "half"):
            f[name]["text_sequential_rtf"] = statistics.median(
                rtf(x, "text_sequential") for x in runs[name])
        n, b = len(spec["pieces"]), min(args.batch_pieces, len(spec["pieces"]))
        head.append(f"one text of {n} pieces ({', '.join(str(len(x)) for x in spec['pieces'])} "
                    f"characters): same audio length: "
                    f"{'yes' if mine['text']['samples'] == peer['text']['samples'] else 'NO'}")
        for label, key, who in (
                (f"real-time factor, one text: ours {b} pieces together", "text_rtf", "mine"),
                ("  ours one piece after another (--batch-pieces 1)", "text_sequential_rtf", "mine"),
                ("  ours in bfloat16, pieces together", "text_rtf", "half")):
            v = f[who][key]
            rows.append((label, [f"{v:.3f}", f"{p_['text_rtf']:.3f}", f"{p_['text_rtf'] / v:.2f}x"]))
    print(common.table(["myxtts", "coqui-tts", "ratio"], rows, head, first="measure", width=12))
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "medians": f,
                                         "rtf_ratio": p_["rtf"] / m_["rtf"],
                                         "rtf_ratio_bf16": p_["rtf"] / h_["rtf"],
                                         "first_chunk_ratio": p_["first_chunk_s"] / m_["first_chunk_s"],
                                         "text_rtf_ratio": (p_["text_rtf"] / m_["text_rtf"]
                                                            if "text_rtf" in m_ else None)},
                                        indent=1))


if __name__ == "__main__":
    sys.exit(main())
