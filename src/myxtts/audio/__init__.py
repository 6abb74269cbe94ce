"""Audio: loading/saving clips (``io``), clean-up (``processing``), log-mel features (``mel``)
and the frame count of a clip (``frames``).

The mel names are imported lazily so that ``import myxtts.audio.io`` (readers, worker
processes, the CLI's error handling) does not pay for importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from myxtts.audio.frames import n_frames_for
from myxtts.audio.io import AudioError, AudioInfo, audio_info, load_audio, read_audio, save_wav
from myxtts.audio.processing import is_silent, normalize_loudness, peak_dbfs, trim_silence

if TYPE_CHECKING:
    from myxtts.audio.mel import MelSpectrogram, compute_mel, mel_filterbank

_MEL_NAMES = ("MelSpectrogram", "compute_mel", "mel_filterbank")

__all__ = [
    "AudioError", "AudioInfo", "audio_info", "load_audio", "read_audio", "save_wav",
    "is_silent", "normalize_loudness", "peak_dbfs", "trim_silence",
    "MelSpectrogram", "compute_mel", "mel_filterbank", "n_frames_for",
]


def __getattr__(name: str) -> Any:
    if name in _MEL_NAMES:
        from myxtts.audio import mel  # deferred: torch, only for the mel names (module doc)

        return getattr(mel, name)
    raise AttributeError(f"module 'myxtts.audio' has no attribute {name!r}")
