"""The behaviour fingerprint: digests of everything a small end-to-end run writes.

A refactor that claims "no change in behaviour" runs this before and after and compares:

    python tools/fingerprint.py --out before.json          # on the old commit
    python tools/fingerprint.py --out after.json           # on the new one
    python tools/fingerprint.py --compare before.json after.json
    python tools/fingerprint.py --out now.json && \
        python tools/fingerprint.py --compare tools/fingerprint.json now.json

``tools/fingerprint.json`` is the fingerprint of this tree (torch 2.13.0 on the CPU): a change
that must not alter behaviour leaves it identical, and one that alters it on purpose
rewrites it and says which entries moved and why.

What runs, through the real CLI on the CPU (``myxtts`` of the installed package), in a
scratch folder with fixed relative paths so nothing path-dependent leaks into the digests:
make-demo-data (3 voices x 12 clips, en+fa) -> prepare --audio -> train tiny 6 steps on the
store (validation, samples and checkpoints at 3 and 6) -> resumed to 8 steps -> train 4
steps on the raw folder (features on the fly) -> fine-tune 3 steps from the first run ->
train-vocoder 4 steps (discriminators from step 2) -> train-vocoder on the TTS run's mels
-> synthesize with Griffin-Lim, with the vocoder and from an exported bundle.

What is digested: every store file's bytes (the manifest and report without paths and
times), every logged loss (timings left out), every checkpoint's tensors and values,
every sample and synthesised wav, the bundle's tensors. The same commit gives the same
fingerprint run after run (the loss sums are fp32 on a fixed thread count).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

TIMING = ("per_s", "wait", "seconds", "ready", "mem", "util", "mfu", "tflops", "time")
TEXT = "tabet kano mire, sulo pena."


SOURCE: Path | None = None  # --source: the src folder of the code under test


def run(args: list[str], cwd: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "PYTHONHASHSEED": "0",
           "CUDA_VISIBLE_DEVICES": ""}
    if SOURCE is not None:
        env["PYTHONPATH"] = str(SOURCE)
    cmd = [sys.executable, "-m", "myxtts.cli.main", *args]
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def value_digest(value: Any) -> str:
    """A digest of a checkpoint value: tensors by dtype, shape and bytes; containers by key."""
    import torch

    h = hashlib.sha256()

    def feed(v: Any) -> None:
        if isinstance(v, torch.Tensor):
            t = v.detach().cpu().contiguous()
            h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif isinstance(v, dict):
            h.update(b"{")
            for k in sorted(v, key=str):
                h.update(repr(k).encode())
                feed(v[k])
            h.update(b"}")
        elif isinstance(v, (list, tuple)):
            h.update(b"[")
            for x in v:
                feed(x)
            h.update(b"]")
        else:
            h.update(repr(v).encode())

    feed(value)
    return h.hexdigest()[:16]


def checkpoint_digests(path: Path, name: str) -> dict[str, str]:
    import torch

    state = torch.load(path, map_location="cpu", weights_only=True)
    return {f"{name}:{k}": value_digest(v) for k, v in sorted(state.items())}


def bundle_digests(path: Path, name: str) -> dict[str, str]:
    from safetensors import safe_open

    out = {}
    with safe_open(str(path), "pt") as f:
        for k in sorted(f.keys()):
            out[f"{name}:{k}"] = value_digest(f.get_tensor(k))
        meta = dict(f.metadata() or {})
    meta.pop("myxtts.sha256", None)  # over the header too, whose key order safetensors varies
    out[f"{name}:metadata"] = value_digest({k: v for k, v in meta.items() if "time" not in k})
    return out


def strip(value: Any) -> Any:
    """A manifest or report without what depends on where and when it was written."""
    if isinstance(value, dict):
        return {k: strip(v) for k, v in value.items()
                if not any(w in k for w in ("time", "created", "path", "source", "seconds",
                                            "workers", "host"))}
    if isinstance(value, list):
        return [strip(v) for v in value]
    return value


def losses(metrics: Path, name: str) -> dict[str, str]:
    rows = []
    for line in metrics.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        rows.append({k: v for k, v in row.items() if not any(w in k for w in TIMING)})
    return {f"{name}:metrics": value_digest(rows)}


def files(folder: Path, name: str, suffix: str) -> dict[str, str]:
    return {f"{name}:{p.relative_to(folder)}": digest(p.read_bytes())
            for p in sorted(folder.rglob(f"*{suffix}"))}


def run_folder(folder: Path, name: str) -> dict[str, str]:
    out = losses(folder / "metrics.jsonl", name)
    for p in sorted((folder / "checkpoints").glob("*.pt")):
        out.update(checkpoint_digests(p, f"{name}/{p.name}"))
    if (folder / "samples").is_dir():
        out.update(files(folder / "samples", f"{name}/samples", ".wav"))
    return out


def fingerprint(work: Path) -> dict[str, str]:
    produce(work)
    return digests(work)


def produce(work: Path) -> None:
    """Run every command of the fingerprint in ``work``."""
    tiny = ["--device", "cpu", "--no-compile", "--quiet"]
    langs = ["--set", "text.languages=[en,fa]"]
    every = ["--set", "train.log_every=1", "--set", "train.val_every=3", "--set",
             "train.synth_every=3", "--set", "train.ckpt_every=3", "--set", "data.num_workers=0",
             "--set", "train.synth_sentences=1"]
    run(["make-demo-data", "corpus", "--speakers", "3", "--utterances", "12", "--languages",
         "en,fa"], work)
    run(["prepare", "corpus", "--out", "store", "--audio", "--workers", "2", "--quiet", *langs],
        work)
    train = ["train", "store", "--model-size", "tiny", "--batch-frames", "1200", *tiny, *every]
    run([*train, "--max-steps", "6", "--output-dir", "run"], work)
    shutil.copytree(work / "run", work / "run6")  # the 6-step run, before it is resumed
    run([*train, "--max-steps", "8", "--output-dir", "run"], work)
    run(["train", "corpus", "--model-size", "tiny", "--batch-frames", "1200", *tiny, *every,
         *langs, "--max-steps", "4", "--output-dir", "otf"], work)
    run(["train", "store", "--init-from", "run6", "--config", "finetune", *tiny, *every,
         "--batch-frames", "1200", "--max-steps", "3", "--output-dir", "ft"], work)
    voc = ["train-vocoder", "store", "--vocoder-size", "tiny", "--device", "cpu", "--no-compile",
           "--quiet", "--set", "vocoder.disc_start=2", "--set", "train.log_every=1", "--set",
           "train.val_every=2", "--set", "train.synth_every=0", "--set", "train.ckpt_every=2"]
    run([*voc, "--max-steps", "4", "--output-dir", "voc"], work)
    run([*voc, "--max-steps", "2", "--tts-checkpoint", "run6", "--output-dir", "voc_ft"], work)
    ref = sorted((work / "corpus").rglob("*.wav"))[0].relative_to(work)
    synth = ["synthesize", "-t", TEXT, "-r", str(ref), "--seed", "0", "--device", "cpu"]
    run([*synth, "-c", "run6", "-o", "out/griffin_lim.wav"], work)
    run([*synth, "-c", "run6", "--vocoder", "voc", "-o", "out/vocoder.wav"], work)
    run(["export", "run6", "--vocoder", "voc", "-o", "bundle.safetensors"], work)
    run([*synth, "-c", "bundle.safetensors", "-o", "out/bundle.wav"], work)


def digests(work: Path) -> dict[str, str]:
    """The digests of what :func:`produce` wrote in ``work``."""
    out: dict[str, str] = {}
    for p in sorted((work / "store").rglob("*")):
        if not p.is_file():
            continue
        rel = str(p.relative_to(work / "store"))
        if p.suffix == ".json":
            out[f"store:{rel}"] = value_digest(strip(json.loads(p.read_text(encoding="utf-8"))))
        elif p.suffix not in (".log", ".lock"):
            out[f"store:{rel}"] = digest(p.read_bytes())
    for name in ("run6", "run", "otf", "ft", "voc", "voc_ft"):
        out.update(run_folder(work / name, name))
    out.update(files(work / "out", "synthesized", ".wav"))
    out.update(bundle_digests(work / "bundle.safetensors", "bundle"))
    return out


def compare(a: dict[str, str], b: dict[str, str]) -> int:
    keys = sorted(set(a) | set(b))
    diff = [k for k in keys if a.get(k) != b.get(k)]
    for k in diff:
        print(f"DIFFERS {k}: {a.get(k, '(absent)')} vs {b.get(k, '(absent)')}")
    print(f"{len(keys) - len(diff)} of {len(keys)} entries identical")
    return 1 if diff else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="write the fingerprint (JSON) here")
    p.add_argument("--keep", type=Path, help="run in this folder and keep it (default: a "
                                             "temporary one)")
    p.add_argument("--digest-only", type=Path, metavar="DIR",
                   help="digest a folder an earlier --keep run left, without running anything")
    p.add_argument("--source", type=Path, metavar="SRC",
                   help="run the package from this src folder (e.g. a worktree of the commit "
                        "to fingerprint) instead of the installed one, so the tree can change "
                        "while it runs")
    p.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"),
                   help="compare two fingerprints; exit 1 if any entry differs")
    args = p.parse_args()
    if args.compare:
        a, b = (json.loads(x.read_text(encoding="utf-8")) for x in args.compare)
        return compare(a, b)
    if args.out is None:
        p.error("give --out FILE (or --compare A B)")
    global SOURCE
    SOURCE = args.source.resolve() if args.source else None
    if args.digest_only:
        result = digests(args.digest_only.resolve())
    elif args.keep:
        shutil.rmtree(args.keep, ignore_errors=True)
        args.keep.mkdir(parents=True)
        result = fingerprint(args.keep.resolve())
    else:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp) / "fp"
            work.mkdir()
            result = fingerprint(work)
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{len(result)} entries -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
