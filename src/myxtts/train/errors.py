"""User-facing training errors (printed as one line by the CLI)."""


class TrainError(RuntimeError):
    """A training run cannot start or continue; the message names the cause and the fix."""
