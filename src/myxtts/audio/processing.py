"""Waveform clean-up applied when a clip is loaded: silence trimming and loudness levelling.

Why here and not in the model: leading/trailing silence teaches the decoder to emit
arbitrary-length pauses (and confuses the stop token), and wildly different recording
levels shift the log-mel by a constant the model would otherwise have to learn per clip.
Both are cheap numpy passes done once, at prepare time (or per clip on the fly).
"""

from __future__ import annotations

import numpy as np

# Frame size for the energy measure: 20 ms windows every 5 ms. Short enough to find a
# word onset to within a few ms, long enough that a single click is not "speech".
_FRAME_S = 0.020
_HOP_S = 0.005
# Kept on each side of the detected speech so soft onsets/offsets (breaths, fricatives
# that sit just under the threshold) are not clipped.
_MARGIN_S = 0.050
# Ceiling on |sample| after loudness normalisation: a little headroom below full scale
# so 16-bit export and resampling ripple never clip.
_PEAK_CEILING = 0.99
# A clip whose loudest sample is below this is treated as silent: -70 dBFS is about
# 10 steps of 16-bit PCM, i.e. dither/hum at most, never usable speech.
SILENT_PEAK_DBFS = -70.0


def peak(wav: np.ndarray) -> float:
    """The loudest sample's magnitude (0.0 for an empty clip). Loading a clip asks for it
    once and passes it on (``is_silent``, ``clipped_fraction``, ``trim_silence``): each
    pass over a clip costs ~10 us per second of audio, on every clip of every epoch."""
    # max and -min instead of max(abs): no temporary array the size of the clip.
    return max(float(np.max(wav)), -float(np.min(wav))) if np.size(wav) else 0.0


def peak_dbfs(wav: np.ndarray, level: float | None = None) -> float:
    """Level of the loudest sample in dB re full scale (-inf for an all-zero clip);
    ``level``: the clip's :func:`peak` when the caller has it."""
    level = peak(wav) if level is None else level
    return 20.0 * np.log10(level) if level > 0.0 else float("-inf")


def is_silent(wav: np.ndarray, level: float | None = None) -> bool:
    """True when the clip holds nothing louder than ``SILENT_PEAK_DBFS`` (``level``: as in
    :func:`peak_dbfs`)."""
    return peak_dbfs(wav, level) < SILENT_PEAK_DBFS


def dc_offset(wav: np.ndarray) -> float:
    """Mean sample value (0.0 for an empty clip): the constant the waveform sits on.

    Summed in float32: numpy sums a contiguous clip pairwise (error ~1e-6 of full scale
    here, against rejection limits of 0.1), at half the cost of a float64 sum."""
    wav = np.asarray(wav)
    if not wav.size:
        return 0.0
    return float(np.add.reduce(wav, axis=None, dtype=np.float32)) / wav.size


def clipped_fraction(wav: np.ndarray, min_run: int = 3, level: float | None = None) -> float:
    """Share of samples in runs of ``min_run`` or more equal samples at the clip's peak
    (+ or -): the flat tops hard clipping leaves. A clean waveform touches its peak at
    single samples; 0.0 for an empty or all-zero clip. ``level``: the clip's :func:`peak`
    when the caller has it."""
    wav = np.asarray(wav)
    if not np.size(wav):
        return 0.0
    level = peak(wav) if level is None else level
    if level == 0.0:
        return 0.0
    # Count first (no float temporary): a clean clip has fewer than ``min_run`` samples at
    # its peak and needs nothing more.
    top = np.float32(level)
    if int(np.count_nonzero(wav == top)) + int(np.count_nonzero(wav == -top)) < min_run:
        return 0.0
    at_peak = np.abs(wav) == top  # [T]
    edges = np.flatnonzero(np.diff(np.concatenate([[0], at_peak.astype(np.int8), [0]])))
    lengths = edges[1::2] - edges[::2]  # every run of samples at the peak
    return float(lengths[lengths >= min_run].sum()) / len(wav)


def frame_rms_db(wav: np.ndarray, frame_length: int, hop_length: int) -> np.ndarray:
    """RMS level of each frame in dB (re full scale 1.0); frame i covers [i*hop, i*hop+frame).

    The last frame is zero-padded, so a clip shorter than one frame gives one frame.
    Vectorised without a per-sample cumulative sum (the slow part on long clips): squares
    are summed per hop-sized block (one einsum over a reshaped view: no clip-sized
    temporary; float32 over 1-2 hundred samples, exact to ~1e-7), and a frame of
    ``k * hop + r`` samples is ``k`` consecutive blocks (float64 cumulative sum over blocks
    only: no drift however long the clip) plus the first ``r`` samples of the next block.
    """
    wav = np.asarray(wav)
    n_samples = len(wav)
    n_frames = 1 + max(0, -(-(n_samples - frame_length) // hop_length))  # ceil, >= 1
    k, r = divmod(frame_length, hop_length)
    n_blocks = n_frames + k + 1  # every block any frame touches (the rest are zero padding)
    n_full = min(n_samples // hop_length, n_blocks)
    full = wav[: n_full * hop_length].reshape(n_full, hop_length)  # [n_full, hop]
    head = full[:, :r]  # [n_full, r]
    block_sum = np.zeros(n_blocks, np.float64)  # [n_blocks]
    block_sum[:n_full] = np.einsum("ij,ij->i", full, full)
    head_sum = np.zeros(n_blocks, np.float64)  # [n_blocks]: first r samples of each block
    head_sum[:n_full] = np.einsum("ij,ij->i", head, head)
    if n_full < n_blocks:  # the last, partial block (maybe empty)
        tail = wav[n_full * hop_length:].astype(np.float64)
        block_sum[n_full] = tail @ tail
        head_sum[n_full] = tail[:r] @ tail[:r]
    csum = np.concatenate([[0.0], np.cumsum(block_sum)])  # [n_blocks + 1]
    first = np.arange(n_frames)  # [n_frames]: frame i starts at block i
    energy = (csum[first + k] - csum[first] + head_sum[first + k]) / frame_length  # mean square
    return 10.0 * np.log10(np.maximum(energy, 1e-20))


def trim_silence(wav: np.ndarray, sample_rate: int, top_db: float,
                 margin_s: float = _MARGIN_S, level: float | None = None) -> np.ndarray:
    """Cut leading and trailing silence; keep ``margin_s`` of context on each side.

    A frame is silence when its RMS level is more than ``top_db`` below the loudest
    frame of the same clip (relative, so quiet-but-clean recordings are not erased).
    Returns an empty array when the clip is silent (``is_silent``); the caller decides
    whether that is an error (``load_audio`` makes it one). ``level``: the clip's
    :func:`peak` when the caller has it. The kept samples are :func:`trim_bounds`'.
    """
    start, end = trim_bounds(wav, sample_rate, top_db, margin_s, level)
    return np.asarray(wav)[start:end]


def trim_bounds(wav: np.ndarray, sample_rate: int, top_db: float,
                margin_s: float = _MARGIN_S, level: float | None = None) -> tuple[int, int]:
    """``(start, end)``: the samples :func:`trim_silence` keeps, ``(0, 0)`` for a silent clip."""
    wav = np.asarray(wav)
    if is_silent(wav, level):
        return 0, 0
    frame_length = max(1, round(_FRAME_S * sample_rate))
    hop_length = max(1, round(_HOP_S * sample_rate))
    level_db = frame_rms_db(wav, frame_length, hop_length)  # [n_frames]
    loud = np.flatnonzero(level_db > level_db.max() - top_db)  # never empty: max frame counts
    # Cut at frame centres (+- half a hop): a frame counts as loud as soon as its edge
    # touches speech, so its start/end would overshoot by up to a frame.
    margin = round(margin_s * sample_rate)
    centre = frame_length // 2
    start = max(0, int(loud[0]) * hop_length + centre - hop_length // 2 - margin)
    end = min(len(wav), int(loud[-1]) * hop_length + centre + hop_length // 2 + margin)
    return start, end


def normalize_loudness(wav: np.ndarray, target_dbfs: float,
                       peak_ceiling: float = _PEAK_CEILING) -> np.ndarray:
    """Scale the clip so its RMS is ``target_dbfs``, unless that would push a peak past
    ``peak_ceiling``; then the gain is lowered so the loudest sample sits at the ceiling.

    A plain gain (no compression) keeps the waveform's shape; a silent clip is returned
    unchanged rather than amplified by infinity.
    """
    wav = np.asarray(wav, dtype=np.float32)
    rms = float(np.sqrt(np.mean(np.square(wav, dtype=np.float64)))) if wav.size else 0.0
    if rms == 0.0:
        return wav.copy()
    gain = 10.0 ** (target_dbfs / 20.0) / rms
    peak = float(np.max(np.abs(wav)))
    gain = min(gain, peak_ceiling / peak)
    return (wav * np.float32(gain)).astype(np.float32, copy=False)
