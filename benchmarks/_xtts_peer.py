"""coqui-tts's XTTS-v2 timed as ``xtts_inference.py`` measures it against ours.

Run by the interpreter of the peer environment (``--peer-python``), never imported by
myxtts. It reads and writes reference folders with ``tests/xtts_v2/reference.py`` (which
imports nothing of myxtts):

    python _xtts_peer.py make OUT --size reduced|released [--seed S]
    python _xtts_peer.py speak FOLDER REF.wav SPEC.json

``make`` writes an XTTS-v2 folder with seeded random weights. ``speak`` loads it with
coqui-tts's own ``load_checkpoint``, makes the voice of REF.wav (untimed), warms up, then
times greedy ``inference`` of each sentence of SPEC.json and, once, ``inference_stream``
until its first chunk and to its end; where SPEC.json has the ``pieces`` of one text, times
``inference`` of each piece one after another, as its own text splitting runs them (the
pieces are given, so that both sides speak the same ones); prints one JSON line.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.xtts_v2.reference import (  # noqa: E402 (the repository root goes on the path first)
    REDUCED,
    RELEASED,
    fix_reference_generation,
    load_reference,
    write_folder,
)


def _voice(model, ref: Path):
    import soundfile as sf
    import torch
    import torchaudio

    wav, sr = sf.read(str(ref), dtype="float32", always_2d=True)
    audio = torch.from_numpy(wav.mean(axis=1))[None]
    audio = torchaudio.functional.resample(audio, sr, 22050).clamp(-1, 1)
    cfg = model.config
    audio = audio[:, :22050 * cfg.max_ref_len]
    latents = model.get_gpt_cond_latents(audio, 22050, length=cfg.gpt_cond_len,
                                         chunk_length=cfg.gpt_cond_chunk_len)
    return latents, model.get_speaker_embedding(audio, 22050)


def speak(folder: Path, ref: Path, spec: dict) -> dict:
    import torch

    torch.set_num_threads(spec["threads"])
    model = load_reference(folder)
    fix_reference_generation(model)
    latents, embedding = _voice(model, ref)
    cfg = model.config
    kw = {"temperature": cfg.temperature, "length_penalty": cfg.length_penalty,
          "repetition_penalty": cfg.repetition_penalty, "top_k": cfg.top_k, "top_p": cfg.top_p,
          "do_sample": False, "max_new_tokens": spec["max_codes"]}
    model.inference(spec["sentences"][0], spec["language"], latents, embedding,
                    **{**kw, "max_new_tokens": 4})
    rows = []
    for text in spec["sentences"]:
        t0 = time.perf_counter()
        out = model.inference(text, spec["language"], latents, embedding, **kw)
        rows.append({"seconds": time.perf_counter() - t0, "samples": int(out["wav"].shape[-1]),
                     "latents": int(out["gpt_latents"].shape[1])})
    t0 = time.perf_counter()
    first, samples = None, 0
    for chunk in model.inference_stream(spec["sentences"][0], spec["language"], latents,
                                        embedding, stream_chunk_size=20, **kw):
        first = first if first is not None else time.perf_counter() - t0
        samples += int(chunk.shape[-1])
    out = {"sentences": rows, "first_chunk_s": first, "stream_s": time.perf_counter() - t0,
           "stream_samples": samples}
    if spec.get("pieces"):
        t0 = time.perf_counter()
        wavs = [model.inference(piece, spec["language"], latents, embedding, **kw)["wav"]
                for piece in spec["pieces"]]
        out["text"] = {"seconds": time.perf_counter() - t0,
                       "samples": sum(int(w.shape[-1]) for w in wavs)}
    return out


def main() -> None:
    command = sys.argv[1]
    if command == "make":
        size = RELEASED if "--size" in sys.argv and sys.argv[sys.argv.index("--size") + 1] == "released" else REDUCED
        seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 0
        write_folder(Path(sys.argv[2]), size, seed)
        print(json.dumps({"folder": sys.argv[2]}))
    elif command == "speak":
        spec = json.loads(Path(sys.argv[4]).read_text())
        print(json.dumps(speak(Path(sys.argv[2]), Path(sys.argv[3]), spec)))
    else:
        raise SystemExit(f"unknown command {command!r}: make or speak")


if __name__ == "__main__":
    main()
