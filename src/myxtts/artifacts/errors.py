"""The error of a file a run wrote and another command reads back: a checkpoint, a vocoder
run, an export bundle. Printed as one line by the CLI, naming the file and what to do."""


class ArtifactError(RuntimeError):
    """A checkpoint, vocoder checkpoint or bundle cannot be used; the message names the file
    and the fix."""
