"""A synthesized utterance against its ground-truth clip: the metrics that need the truth.

Both clips are trimmed of leading and trailing silence the way clips are loaded for
training (``audio.trim_silence`` at ``audio.trim_db``), so the duration ratio compares
speech with speech. One DTW over their mel cepstra gives the aligned frame pairs that MCD
and the F0 errors are measured on.

Ceilings: a clip against itself gives MCD 0, log-F0 RMSE 0, voicing error 0 and duration
ratio 1 (tested).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from myxtts.audio.mel import compute_mel
from myxtts.audio.processing import trim_silence
from myxtts.config import AudioConfig
from myxtts.metrics.cepstrum import mcd, mel_cepstra
from myxtts.metrics.pitch import f0_errors, yin

# A synthesized utterance is decoded up to this multiple of its true length (in frames),
# then cut: a model that never stops is scored at most this long, and ``duration_ratio``
# means the same in `myxtts evaluate` and in training's evaluation.
MAX_LENGTH_RATIO = 3.0


def length_cap(true_frames: int) -> int:
    """The frames a synthesis of an utterance of ``true_frames`` frames may last."""
    return int(MAX_LENGTH_RATIO * true_frames) + 1


@dataclass
class TruthScores:
    """``mcd_db``: mel-cepstral distortion after DTW (dB); ``f0_rmse_cents``: log-F0 RMSE on
    frame pairs voiced in both (NaN when none is); ``voicing_error``: share of aligned pairs
    whose voiced/unvoiced decisions differ; ``duration_ratio``: synthesized / true length."""

    mcd_db: float
    f0_rmse_cents: float
    voicing_error: float
    duration_ratio: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def against_truth(synth: np.ndarray, truth: np.ndarray, cfg: AudioConfig) -> TruthScores:
    """Score the mono clip ``synth`` against ``truth``, both at ``cfg.sample_rate``."""
    clips = [_speech(w, cfg) for w in (synth, truth)]
    ceps = [mel_cepstra(compute_mel(w, cfg)) for w in clips]
    distortion, pairs = mcd(ceps[0], ceps[1])
    (f0_a, v_a), (f0_b, v_b) = (yin(w, cfg.sample_rate, cfg.hop_length) for w in clips)
    rmse, voicing = f0_errors(f0_a, v_a, f0_b, v_b, pairs)
    return TruthScores(distortion, rmse, voicing, len(clips[0]) / len(clips[1]))


def _speech(wav: np.ndarray, cfg: AudioConfig) -> np.ndarray:
    """float32 ``wav`` without its leading and trailing silence (all of it when the clip is
    silent or shorter than a frame: a silent synthesis is scored, not refused)."""
    wav = np.ascontiguousarray(wav, dtype=np.float32)
    if wav.size < cfg.n_fft:
        return np.pad(wav, (0, cfg.n_fft - wav.size))
    trimmed = trim_silence(wav, cfg.sample_rate, cfg.trim_db)
    return trimmed if trimmed.size >= cfg.n_fft else wav
