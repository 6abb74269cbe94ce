"""Fine-tuning benchmark: what fine-tuning into a new language gains, and what it forgets.

    python benchmarks/finetune.py [--speakers N] [--utterances M] [--pretrain-steps P]
                                  [--steps F] [--lr LR] [--freeze PARTS] [--threads T]
                                  [--out DIR]

1. Generates the demo corpus twice: ``en`` voices only, and ``fa`` voices only (other
   clips, Persian letters the ``en`` model never saw); prepares a store of each with the
   demo's settings (``presets/demo.yaml``), each with its own language only.
2. Trains the demo's tiny model on ``en`` for ``--pretrain-steps`` (the base model).
3. Fine-tunes it on ``fa`` for ``--steps`` (``myxtts train FA --init-from BASE``: the
   vocabulary grows, fresh optimizer, ``--lr`` with a short warm-up), once more with
   ``train.freeze`` = ``--freeze``, and trains the same model from scratch on ``fa`` for as
   many steps with the demo's settings.
4. Teacher-forced validation loss (the trainer's) of each model on the ``en`` and the
   ``fa`` validation split: what the fine-tuned model gained on ``fa`` over the one from
   scratch, and what it lost on ``en`` against the base model.

``--out DIR`` keeps the corpora, stores and runs; a second call with the same DIR reuses
what it finds (a finished run is not trained again).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import LABEL, say  # noqa: E402

EN = ("text.languages=[en]", "text.default_language=en")
FA = ("text.languages=[fa]", "text.default_language=fa")


def config(out: Path, steps: int, *overrides: str):
    from myxtts.cli.demo import demo_config_path
    from myxtts.config import load_config

    return load_config(demo_config_path(), overrides=[
        f"train.output_dir={out}", f"train.max_steps={steps}", f"train.val_every={steps}",
        f"train.ckpt_every={steps}", "train.synth_every=0", "train.tensorboard=false",
        "train.device=cpu", *overrides])


def val_loss(checkpoint: Path, store: Path, text: tuple[str, ...]) -> float:
    """The trainer's validation loss of ``checkpoint``'s model on ``store``'s val split (its
    ids mapped into the model's vocabulary, as a fine-tuning run maps them)."""
    from myxtts.train.tts import TTSRecipe
    from myxtts.train.validation import validation_loss

    with tempfile.TemporaryDirectory() as tmp:
        run = TTSRecipe(config(Path(tmp), 1, *text), store, init_from=checkpoint,
                        show_progress=False)
        run.setup()
        try:
            return validation_loss(run.engine, run.data, run.device)["loss"]
        finally:
            run.cleanup()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--speakers", type=int, default=6, help="voices per language (default 6)")
    p.add_argument("--utterances", type=int, default=40, help="clips per voice (default 40)")
    p.add_argument("--pretrain-steps", type=int, default=800, help="en steps (default 800)")
    p.add_argument("--steps", type=int, default=300, help="fa steps of each arm (default 300)")
    p.add_argument("--lr", type=float, default=4e-4,
                   help="fine-tuning peak rate (default 4e-4: a fifth of the demo's)")
    p.add_argument("--freeze", default="conditioning,decoder,postnet",
                   help="train.freeze of the second fine-tuning arm (default: "
                        "conditioning,decoder,postnet: only the text side learns)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--out", type=Path, help="keep the data and runs here (default: a temp dir)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from myxtts.data.prepare.build import prepare_store
    from myxtts.synthetic import make_demo_data
    from myxtts.train.tts import train

    root = args.out or Path(tempfile.mkdtemp(prefix="myxtts-finetune-"))
    stores = {}
    for lang, text, seed in (("en", EN, 11), ("fa", FA, 12)):
        stores[lang] = root / f"{lang}_store"
        if stores[lang].exists():
            continue
        say(f"generating and preparing the {lang} corpus")
        data = make_demo_data(root / lang, speakers=args.speakers, utterances=args.utterances,
                              seed=seed, languages=(lang,))
        prepare_store(data, stores[lang], config(root / "unused", 1, *text), progress=False,
                      echo=lambda s: None)
    tuning = (*FA, f"train.lr={args.lr}", "train.warmup_steps=50")
    arms = [("base", f"base model: {args.pretrain_steps} steps on en", stores["en"],
             config(root / "base", args.pretrain_steps, *EN), None),
            ("finetuned", f"fine-tuning: {args.steps} steps on fa", stores["fa"],
             config(root / "finetuned", args.steps, *tuning), root / "base"),
            ("frozen", f"fine-tuning, {args.freeze} frozen: {args.steps} steps on fa",
             stores["fa"], config(root / "frozen", args.steps, *tuning,
                                  f"train.freeze=[{args.freeze}]"), root / "base"),
            ("scratch", f"from scratch: {args.steps} steps on fa", stores["fa"],
             config(root / "scratch", args.steps, *FA), None)]
    t0 = time.perf_counter()
    for name, what, store, cfg, init in arms:
        if (root / name / "checkpoints").is_dir():
            say(f"{what}: {root / name} is there already")
            continue
        say(what)
        train(cfg, store, progress=False, init_from=init)
    minutes = (time.perf_counter() - t0) / 60
    rows = []
    for name, run in (("base (en only)", "base"), ("fine-tuned on fa", "finetuned"),
                      (f"fine-tuned on fa, {args.freeze} frozen", "frozen"),
                      ("fa from scratch", "scratch")):
        rows.append((name, [f"{val_loss(root / run, stores[lang], text):.3f}"
                            for lang, text in (("en", EN), ("fa", FA))]))
    print(f"tiny model (demo settings), CPU, {args.threads} thread(s), torch "
          f"{torch.__version__}; {args.speakers} voices x {args.utterances} clips per language; "
          f"base {args.pretrain_steps} steps on en, then {args.steps} steps on fa (fine-tuned: "
          f"lr {args.lr}, 50 warm-up steps; scratch: the demo's lr 2e-3); {minutes:.1f} min "
          f"of training in this call")
    print(f"\n{'model':<{LABEL}}{'en val loss':>14}{'fa val loss':>14}")
    for name, cells in rows:
        print(f"{name:<{LABEL}}" + "".join(f"{c:>14}" for c in cells))


if __name__ == "__main__":
    main()
