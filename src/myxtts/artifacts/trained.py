"""A trained TTS model as its readers need it, from a run folder, a checkpoint or a bundle.

:func:`load_trained` reads any of the three (a bundle without pickle, a checkpoint with
``weights_only``) into one ``Trained`` (defined beside the bundle, which holds just that):
config, vocabulary, the weights to speak with (their moving average unless
``raw_weights``), mel statistics and, where a bundle carries one, a vocoder's config and
generator weights, and the run's last evaluation in training that a bundle carries (a run
folder's own, ``RUN/evaluation.json``, is ``myxtts.evaluate.record``'s to read). Building
the model from it is the reader's business (``inference``, ``evaluate``).
"""

from __future__ import annotations

from pathlib import Path

from myxtts.artifacts import checkpoint as ck
from myxtts.artifacts.averaged import averaged_state
from myxtts.artifacts.bundle import Trained, is_bundle, read_bundle, tts_checkpoint
from myxtts.artifacts.readback import file_kind
from myxtts.artifacts.runs import resolve_checkpoint


def load_trained(path: str | Path, raw_weights: bool = False) -> Trained:
    """The model a run folder, a checkpoint file or a bundle of ``myxtts export`` holds (a
    run folder whose ``best.pt`` is a bundle too), every field checked before use
    (``artifacts.readback``)."""
    file = path if is_bundle(path) else resolve_checkpoint(path)
    if file_kind(file) == "bundle" or is_bundle(file):
        return read_bundle(file)
    state = tts_checkpoint(file, path)
    ema = None if raw_weights else state.get(ck.EMA)
    return Trained(Path(file), state[ck.CONFIG], state[ck.VOCAB],
                   averaged_state(state[ck.MODEL], ema), state[ck.MEL_MEAN], state[ck.MEL_STD])
