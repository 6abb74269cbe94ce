"""`myxtts` entry point: one thin subcommand module per job, registered here.

Each module in ``myxtts.cli`` exposes ``register(subparsers)``, which adds its
parser and sets ``func`` to a callable ``(args) -> int``. User errors raise one of
the project's error types and are printed as a single line (exit code 2).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from myxtts.system import default_allocator_settings

# Modules are imported lazily by name so `myxtts --help` stays fast (no torch import).
SUBCOMMANDS = [
    "myxtts.cli.config_cmd",
    "myxtts.cli.train",
    "myxtts.cli.train_vocoder",
    "myxtts.cli.synthesize",
    "myxtts.cli.export",
    "myxtts.cli.evaluate",
    "myxtts.cli.demo",
    "myxtts.cli.prepare",
    "myxtts.cli.data_cmds",
    "myxtts.cli.doctor",
    "myxtts.cli.monitor",
    "myxtts.cli.profile",
]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="myxtts",
        description="Train XTTS-style voice-cloning TTS models whose GPU never waits for data.",
    )
    from myxtts import __version__

    p.add_argument("--version", action="version", version=f"myxtts {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(name).register(sub)
    return p


def _user_errors() -> tuple[type[BaseException], ...]:
    from myxtts.cli.common import CLIError
    from myxtts.config import ConfigError
    from myxtts.system import FolderError

    errs: list[type[BaseException]] = [CLIError, ConfigError, FileNotFoundError, FolderError]
    for mod, name in [("myxtts.audio.io", "AudioError"), ("myxtts.data.prepare.records", "DatasetError"),
                      ("myxtts.data.store", "StoreError"), ("myxtts.train.errors", "TrainError"),
                      ("myxtts.artifacts.errors", "ArtifactError"),
                      ("myxtts.inference.errors", "SynthesisError"),
                      ("myxtts.evaluate", "EvaluationError"),
                      ("myxtts.text.tokenizer", "TokenizerError")]:
        try:
            errs.append(getattr(importlib.import_module(mod), name))
        except (ImportError, AttributeError):
            pass
    return tuple(errs)


def main(argv: list[str] | None = None) -> int:
    default_allocator_settings()  # before torch allocates anything on a GPU
    code = _run(argv)
    if "TORCHELASTIC_RUN_ID" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        _exit_torchrun_worker(code)
    return code


def _exit_torchrun_worker(code: int) -> None:
    """End a torchrun worker without interpreter teardown. Every rank has passed the final
    barrier and released the process group, but gloo's worker threads may still be dropping
    the last collective's tensors; one that needs the GIL while the interpreter finalises is
    killed mid-unwind and the rank aborts (SIGABRT after "trained to step N", seen in CI),
    failing a finished run. Nothing is left to clean up: logs are closed, checkpoints
    written atomically."""
    import logging

    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def _run(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except _user_errors() as e:
        print(f"myxtts {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"myxtts {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
