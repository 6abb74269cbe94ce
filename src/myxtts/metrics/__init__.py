"""Speech metrics: the numbers TTS papers report, computed offline.

One module per family, each small and tested on cases with known answers:

    dtw        dynamic time warping (the aligned path every comparison with the truth uses)
    cepstrum   mel cepstra of a clip and their distortion (MCD, dB)
    pitch      F0 by YIN, log-F0 error (cents) and voicing error on aligned frames
    truth      a synthesized clip against its ground-truth clip: MCD, F0, voicing, duration
    speaker    speaker similarity (a GE2E d-vector encoder; weights from ``resemblyzer``)
    asr        intelligibility: CER/WER of a recognizer's transcript (pocketsphinx, whisper)
    mos        predicted quality: DNSMOS P.835 SIG/BAK/OVRL (``speechmos`` + ``onnxruntime``)

``scorer`` runs the families on one clip and summarises many; ``table`` lays the summaries
out per language, a row per kind of audio.

``dtw``, ``cepstrum``, ``pitch`` and ``truth`` need only numpy and torch (the trainer scores
its samples with them); ``speaker``, ``asr`` and ``mos`` need the optional packages of
``pip install "myxtts[eval]"``, whose wheels carry their model weights, so nothing is
downloaded. ``require`` names what is missing in one line.

A leaf: the metrics import only ``audio``, ``text`` and ``config``; what runs them on a
model (``myxtts evaluate``, the evaluation in training) is ``myxtts.evaluate``.
"""

from __future__ import annotations

import importlib.util

EXTRA_INSTALL = 'pip install "myxtts[eval]"'


class EvaluationError(ValueError):
    """A user error of the evaluation (a missing package, absent weights): one line."""


def missing(*modules: str) -> list[str]:
    """The names among ``modules`` that are not installed (found without importing them)."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


def require(*modules: str, what: str = "the speech metrics") -> None:
    """EvaluationError naming the packages of ``modules`` that are absent and the install
    command that brings them."""
    absent = missing(*modules)
    if absent:
        raise EvaluationError(f"{what} need {', '.join(absent)}, not installed: "
                              f"{EXTRA_INSTALL}")
