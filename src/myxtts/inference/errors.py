"""The one error synthesis reports to a user: a reference, a text or a language it cannot
speak with this model. Printed as one line by the CLI, naming the input and the fix."""


class SynthesisError(RuntimeError):
    """Inputs a trained model cannot speak; the message names the input and the fix."""
