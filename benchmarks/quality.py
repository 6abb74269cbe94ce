"""Speech quality of re-synthesis: Griffin-Lim vs a trained vocoder vs the recordings, on
every metric of ``myxtts evaluate``, in one run (the recordings are the baseline).

    python benchmarks/quality.py [--data DIR] [--vocoder RUN] [--steps N] [--max N]

1. Prepares DATA (default ../shared/data/ljspeech-mini) with its audio and a 20 % held-out
   split (``data.val_fraction=0.2``).
2. Without ``--vocoder``: trains the tiny vocoder on the store with ``myxtts train-vocoder``
   for ``--steps`` reconstruction steps (default 1500; the table's header says how many).
3. For up to ``--max`` held-out clips: the recording, its mel through Griffin-Lim and
   through the vocoder, each scored on ASR CER/WER (pocketsphinx), speaker similarity to
   another held-out clip of the same speaker, DNSMOS SIG/BAK/OVRL, and against the recording
   MCD, log-F0 RMSE, voicing error and duration ratio; RTF is the vocoding time over the
   audio's length on this machine.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import find_data, say  # noqa: E402


def train_a_vocoder(store: Path, run: Path, steps: int) -> Path:
    """The tiny vocoder trained ``steps`` reconstruction steps by `myxtts train-vocoder`."""
    from myxtts.cli.main import main as myxtts

    say(f"training the tiny vocoder on {store}: {steps} steps (myxtts train-vocoder)")
    rc = myxtts(["train-vocoder", str(store), "--output-dir", str(run), "--max-steps", str(steps),
                 "--set", f"vocoder.disc_start={steps}", "--set", f"train.val_every={steps}",
                 "--set", f"train.ckpt_every={steps}", "--set", "train.tensorboard=false",
                 "--set", "train.device=cpu"])
    if rc:
        raise SystemExit(f"myxtts train-vocoder failed ({rc})")
    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, help="dataset (default ../shared/data/ljspeech-mini)")
    p.add_argument("--vocoder", type=Path, help="a trained `myxtts train-vocoder` run (default: "
                   "train the tiny one for --steps)")
    p.add_argument("--steps", type=int, default=1500, help="vocoder steps when training one")
    p.add_argument("--max", type=int, default=20, help="held-out clips scored (default 20)")
    p.add_argument("--asr", default="pocketsphinx", help="recognizer (evaluate's --asr)")
    args = p.parse_args()
    from myxtts.artifacts.vocoder import load_vocoder
    from myxtts.audio.griffin_lim import GriffinLim
    from myxtts.config import load_config
    from myxtts.data.prepare.build import prepare_store
    from myxtts.data.store import FeatureStore
    from myxtts.metrics.scorer import Scorer, summarize
    from myxtts.metrics.table import COLUMNS, table

    device = torch.device("cpu")
    cfg = load_config(overrides=["data.store_audio=true", "data.val_fraction=0.2"])
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        data = find_data(args.data, tmp)
        say(f"preparing {data} with its audio")
        prepare_store(data, tmp / "store", cfg, progress=False, echo=lambda s: None)
        if args.vocoder is None:
            voc_run, trained_note = train_a_vocoder(tmp / "store", tmp / "voc", args.steps), \
                f"the tiny vocoder trained here for {args.steps} steps (reconstruction only)"
        else:
            voc_run, trained_note = args.vocoder, f"the vocoder of {args.vocoder}"
        vocoders = {"Griffin-Lim resynthesis": GriffinLim(cfg.audio).to(device),
                    "vocoder resynthesis": load_vocoder(voc_run, cfg.audio, device)}
        val = FeatureStore.open(tmp / "store", "val")
        scorer = Scorer(cfg.audio, asr=args.asr, device="cpu")
        picked = list(range(min(args.max, len(val))))
        rows: dict[str, list] = {"recording (baseline)": [], **{k: [] for k in vocoders}}
        for n, i in enumerate(picked):
            say(f"clip {n + 1}/{len(picked)}: {val.ids[i]}")
            truth = val.audio(i).astype(np.float32) / 32767.0
            other = picked[(n + 1) % len(picked)]  # another held-out clip as the voice reference
            ref = scorer.embed(val.audio(other).astype(np.float32) / 32767.0)
            lang = val.tokenizer.languages[int(val.language_ids[i])]
            text = val.tokenizer.decode(val.tokens(i))  # the transcript as prepare cleaned it
            rows["recording (baseline)"].append(scorer.score(truth, text, lang, truth, ref))
            mel = torch.from_numpy(val.mel(i).astype(np.float32))[None]
            for name, vocoder in vocoders.items():
                start = time.perf_counter()
                with torch.inference_mode():
                    wav = vocoder.waveforms(mel, torch.tensor([mel.shape[1]]))[0]
                took = time.perf_counter() - start
                scores = scorer.score(wav, text, lang, truth, ref)
                scores.synthesis_s = took
                rows[name].append(scores)
    summaries = {name: summarize(s) for name, s in rows.items()}
    base = summaries["recording (baseline)"]
    print(f"data: {data}, {len(picked)} held-out clips; {trained_note}; CPU, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}; ASR {args.asr}\n")
    print(table({"re-synthesis of held-out clips": summaries}))
    heads = {key: head for key, head, _ in COLUMNS}
    keys = ["cer", "wer", "similarity", "sig", "bak", "ovrl"]  # the metrics with a baseline
    width = max(len(n) for n in summaries) + 2
    print(f"\n{'ratio to the recording':<{width}}" + "".join(f"{heads[k]:>8}" for k in keys))
    for name, s in summaries.items():
        cells = [f"{s[k] / base[k]:8.3f}" if s[k] is not None and base[k] else f"{'-':>8}"
                 for k in keys]
        print(f"  {name:<{width - 2}}" + "".join(cells))


if __name__ == "__main__":
    main()
