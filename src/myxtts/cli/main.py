"""`myxtts` entry point: one thin subcommand module per job, registered here.

Each module in ``myxtts.cli`` exposes ``register(subparsers)``, which adds its
parser and sets ``func`` to a callable ``(args) -> int``. User errors raise one of
the project's error types and are printed as a single line (exit code 2).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys


def _command_name(argv: list[str]) -> str:
    """The command's name as typed, before the parser (whose imports take a while) reads it."""
    words = [a for a in argv if not a.startswith("-")]
    return f"myxtts {words[0]}" if words and words[0].replace("-", "").isalpha() else "myxtts"


def _quiet_exit(signum: int, frame: object) -> None:
    os.write(2, f"{_command_name(sys.argv[1:])}: interrupted\n".encode(errors="replace"))
    os._exit(128 + signum)


# Run as the `myxtts` program, Ctrl-C before main() starts (the imports below) exits quietly;
# main() then installs the full handling (cli.signals). Not when imported by other code.
if os.path.basename(sys.argv[0]).removesuffix(".exe") == "myxtts":  # pragma: no cover
    signal.signal(signal.SIGINT, _quiet_exit)

from myxtts import __version__  # noqa: E402
from myxtts.cli.signals import (  # noqa: E402
    EXIT_CODES,
    Terminated,
    handled_signals,
    one_line,
    quiet_stdout,
    stopped_by,
)
from myxtts.system import default_allocator_settings  # noqa: E402

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
    p.add_argument("--version", action="version", version=f"myxtts {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(name).register(sub)
    return p


_USER_ERRORS = [("myxtts.cli.common", "CLIError"), ("myxtts.config.sections", "ConfigError"),
                ("myxtts.system", "FolderError"), ("myxtts.system", "WriteFailed"),
                ("myxtts.audio.io", "AudioError"), ("myxtts.data.prepare.records", "DatasetError"),
                ("myxtts.data.store", "StoreError"), ("myxtts.train.errors", "TrainError"),
                ("myxtts.artifacts.errors", "ArtifactError"),
                ("myxtts.inference.errors", "SynthesisError"),
                ("myxtts.metrics", "EvaluationError"), ("myxtts.text.tokenizer", "TokenizerError")]


def _user_errors() -> tuple[type[BaseException], ...]:
    """The error types printed as one line. Only modules already imported are asked: an
    error cannot come from a module that never loaded, and importing one here (torch with
    it) while handling an interrupt that stopped torch's import half-way would fail again."""
    errs: list[type[BaseException]] = [FileNotFoundError]
    for mod, name in _USER_ERRORS:
        module = sys.modules.get(mod)
        if module is not None and isinstance(getattr(module, name, None), type):
            errs.append(getattr(module, name))
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
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def _run(argv: list[str] | None) -> int:
    """The command of ``argv`` (None: the process's own arguments, run as the real CLI)."""
    command = _command_name(sys.argv[1:] if argv is None else argv)
    try:
        with handled_signals(lambda: command, restore=argv is not None):
            parser = build_parser()
            args = parser.parse_args(argv)
            if not getattr(args, "func", None):
                parser.print_help()
                return 0
            command = f"myxtts {args.command}"
            try:
                code = int(args.func(args) or 0)
                sys.stdout.flush()  # a reader gone (`| head`) is seen here, not at exit
                return code
            except BrokenPipeError:  # the reader took what it wanted: quietly, every command
                quiet_stdout()
                return 0
            except _user_errors() as e:
                print(f"{command}: error: {one_line(str(e))}", file=sys.stderr)
                return 2
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM or SIGHUP (Terminated): quiet, one line
        notes = "".join(f"; {n}" for n in getattr(e, "__notes__", ()))
        signum = e.signum if isinstance(e, Terminated) else signal.SIGINT
        try:
            print(f"{command}: {stopped_by(signum)}{notes}", file=sys.stderr)
        except OSError:  # a hung-up terminal refuses the line; the exit code still says it
            pass
        return EXIT_CODES[signum]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
