"""What subcommands share: how one is added, the flags of every subcommand that needs a
config, and the one way to turn them into one."""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from myxtts.config import Config, config_from_dict, load_config, resolve_device
from myxtts.config.checks import MAX_SEED
from myxtts.config.parse import load_yaml


class CLIError(Exception):
    """A user error: printed as one line, exit code 2, no traceback."""


def add_command(sub: argparse._SubParsersAction, name: str, run: Callable[[argparse.Namespace], int],
                summary: str) -> argparse.ArgumentParser:
    """The subcommand ``name``: ``summary`` in the command list, ``run``'s docstring as its
    ``--help`` description (argparse re-flows it), and ``run`` called with the parsed args."""
    p = sub.add_parser(name, help=summary, description=inspect.getdoc(run))
    p.set_defaults(func=run)
    return p


def seed_arg(text: str) -> int:
    """An argparse type: a seed in [0, 2**32 - 1] (numpy's range), else the usual one-line
    argparse error naming the flag."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text[:40]!r}") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"a seed is in [0, {MAX_SEED}], got {text[:40]}")
    return value


def add_config_args(p: argparse.ArgumentParser, training: bool = True) -> None:
    """``--config`` and ``--set`` always; the training shortcuts only where they matter
    (``training=False`` for commands such as prepare that never read them)."""
    g = p.add_argument_group("configuration")
    g.add_argument("--config", metavar="YAML", help="config file (see `myxtts config show`), "
                   "or one that comes with myxtts: " + ", ".join(PACKAGED_CONFIGS))
    g.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value, e.g. --set train.lr=3e-4 (repeatable)")
    if not training:
        return
    g.add_argument("--model-size", "--preset", dest="preset", choices=["tiny", "small", "base"],
                   help="model size preset (overrides the file's model section)")
    g.add_argument("--batch-frames", type=int, help="frame budget per batch (data.batch_frames)")
    g.add_argument("--batch-size", type=int, help="max utterances per batch (data.max_batch_size)")
    g.add_argument("--num-workers", type=int, help="loader worker processes (data.num_workers; -1 = auto)")
    g.add_argument("--max-steps", type=int, help="optimizer steps (train.max_steps)")
    g.add_argument("--output-dir", help="run folder (train.output_dir)")
    g.add_argument("--seed", type=seed_arg, help="train.seed")


# Configs that come with myxtts (src/myxtts/presets/NAME.yaml), for --config NAME.
PACKAGED_CONFIGS = ("demo", "finetune", "xtts-finetune")


def config_file(value: str | None) -> str | Path | None:
    """``--config``'s file: ``value`` itself, or where no such file exists and it names a
    packaged config (``PACKAGED_CONFIGS``), that config's file."""
    if value is None or value not in PACKAGED_CONFIGS or Path(value).exists():
        return value
    return Path(str(resources.files("myxtts") / "presets" / f"{value}.yaml"))


_FLAG_TO_KEY = {
    "batch_frames": "data.batch_frames",
    "batch_size": "data.max_batch_size",
    "num_workers": "data.num_workers",
    "max_steps": "train.max_steps",
    "output_dir": "train.output_dir",
    "seed": "train.seed",
}


def config_from_args(args: argparse.Namespace, base_overrides: list[str] | None = None,
                     data: str | Path | None = None, quiet: bool = False) -> Config:
    """File -> preset -> ``base_overrides`` -> --set -> convenience flags (last wins); then
    what ``data`` brings fills every key those left unset: a store's or run's settings
    (:func:`data_settings`), or the languages a downloaded corpus declares
    (:func:`corpus_languages`; said on stderr unless ``quiet``)."""
    overrides = list(base_overrides or []) + list(getattr(args, "overrides", []) or [])
    for flag, key in _FLAG_TO_KEY.items():
        value = getattr(args, flag, None)
        if value is not None:
            overrides.append(f"{key}={value}")
    file = config_file(getattr(args, "config", None))
    brought = data_settings(data) if data is not None else None
    cfg = load_config(file, getattr(args, "preset", None), overrides, inherit=brought)
    if data is None or brought is not None:
        return cfg
    extra, line = corpus_languages(data, cfg, file, overrides)
    if not extra:
        return cfg
    if not quiet:
        print(line, file=sys.stderr, flush=True)
    return load_config(file, getattr(args, "preset", None), [*extra, *overrides])


def _named_keys(file: str | Path | None, overrides: list[str]) -> set[str]:
    """The ``section.key`` names a config file (read fine already) and the overrides set."""
    named = {o.split("=", 1)[0].strip() for o in overrides}
    if file is not None:
        d = load_yaml(Path(file).read_text(encoding="utf-8")) or {}
        named |= {f"{sec}.{key}" for sec, keys in d.items() if isinstance(keys, dict)
                  for key in keys}
    return named


def corpus_languages(data: str | Path, cfg: Config, file: str | Path | None,
                     overrides: list[str]) -> tuple[list[str], str]:
    """``(overrides, line)``: the ``text.languages`` (and ``text.default_language``) a
    downloaded corpus declares (``readers.declared_languages``), unless the config file or
    the overrides set ``text.languages`` themselves; the line says where they came from."""
    named = _named_keys(file, overrides)
    if "text.languages" in named:
        return [], ""
    from myxtts.data.prepare.readers import declared_languages  # deferred: not for `myxtts --help`

    found = declared_languages(data, cfg)
    if found is None:
        return [], ""
    languages = list(found.languages)
    if "text.default_language" in named:
        default = cfg.text.default_language
        languages += [] if default in languages else [default]
        extra = [f"text.languages=[{','.join(languages)}]"]
    else:
        default = found.default_language
        extra = [f"text.languages=[{','.join(languages)}]", f"text.default_language={default}"]
    return extra, (f"text.languages [{', '.join(languages)}] (default {default}): the "
                   f"languages of {found.source}; set text.languages to train others")


def data_settings(path: str | Path) -> tuple[str, dict[str, dict[str, Any]]] | None:
    """The settings a folder was made with: a store's audio and text sections (what its
    features and vocabulary were prepared with), or a run folder's audio, text and model
    sections (its ``config.yaml``). None for anything else (a raw dataset)."""
    # deferred: the store's modules load numpy, which `myxtts --help` does without
    from myxtts.data.store import StoreError
    from myxtts.data.store.format import MANIFEST, read_manifest

    path = Path(path)
    if (path / MANIFEST).is_file():
        try:
            manifest = read_manifest(path)
        except StoreError:
            return None  # an incomplete or damaged store: opening it says what to do
        return f"the store {path}", {k: manifest.get(k) or {} for k in ("audio", "text")}
    run_config = path / "config.yaml"
    if run_config.is_file() and ((path / "checkpoints").is_dir() or (path / "metrics.jsonl").is_file()):
        try:
            saved = load_yaml(run_config.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as e:
            raise CLIError(f"{run_config}: cannot read the run's config ({e}); restore the file "
                           f"or pass the settings with --config") from e
        return f"the run {path}", {k: saved.get(k) or {} for k in ("audio", "text", "model")}
    return None


# The model a training command builds when none is named: worth a GPU's time there, quick on
# a CPU. ~35 M parameters fit one consumer GPU (24 GB) with room for large batches.
DEFAULT_SIZE = {"cuda": "small", "cpu": "tiny"}


def config_with_size(args: argparse.Namespace, base_overrides: list[str] | None,
                     data: str | Path | None) -> tuple[Config, str]:
    """``config_from_args`` for a training command (``train``, and ``profile``, which measures
    the same run), with the default model size for its
    device when the command names none (no --model-size, no model key in --config or --set,
    no run to take it from), and the line that says which size trains and why."""
    cfg = config_from_args(args, base_overrides, data)
    named = getattr(args, "preset", None) or any(
        o.split("=", 1)[0].startswith("model.") for o in getattr(args, "overrides", None) or [])
    config = config_file(getattr(args, "config", None))
    if config is not None and not named:
        named = "model" in (load_yaml(Path(config).read_text(encoding="utf-8")) or {})
    if named:
        return cfg, f"model: {cfg.model.preset} (as configured)"
    brought = data_settings(data) if data is not None else None
    if brought is not None and brought[1].get("model"):
        return cfg, f"model: {cfg.model.preset}, {brought[0]}'s"
    resume = getattr(args, "resume", None)
    if resume or any(Path(cfg.train.output_dir, "checkpoints").glob("ckpt_*.pt")):
        return _model_of_checkpoint(cfg, resume), (
            f"model: the one of {resume or 'the run in ' + str(cfg.train.output_dir)} "
            f"(continuing it)")
    device = resolve_device(cfg.train.device, "train.device").type
    size = DEFAULT_SIZE.get(device, "tiny")
    if size != cfg.model.preset:
        args.preset = size
        cfg = config_from_args(args, base_overrides, data, quiet=True)
        args.preset = None
    where = "GPU" if device == "cuda" else "CPU"
    return cfg, f"model: {size}, the default on a {where} (choose with --model-size tiny|small|base)"


def _model_of_checkpoint(cfg: Config, resume: str | None) -> Config:
    """``cfg`` with the model section of the checkpoint a run continues from (``resume``, else
    the run folder's newest good one): a resume that names no model trains the run's own."""
    # deferred: torch; `myxtts --help` starts without it
    from myxtts.artifacts import checkpoint as ck
    from myxtts.artifacts.runs import CheckpointManager

    path = Path(resume) if resume else CheckpointManager(
        Path(cfg.train.output_dir) / "checkpoints", 1).resumable()
    if path is None:
        return cfg
    saved = ck.load(path)[ck.CONFIG]
    return config_from_dict({**cfg.to_dict(), "model": saved["model"]})
