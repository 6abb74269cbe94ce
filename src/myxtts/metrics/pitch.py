"""F0 by YIN, and the pitch errors between two utterances on aligned frames.

YIN (de Cheveigne & Kawahara, 2002): per frame, the squared difference of the signal and
itself shifted by each lag, normalised by its running mean (d'); the period is the first
lag whose dip goes under 0.1, else the lag of the deepest dip, refined by a parabola
through its neighbours. A frame is voiced when its deepest dip is under 0.2 (its
aperiodicity) and it is not near-silent; the log-F0 of voiced frames is then smoothed by a
3-frame median (voiced neighbours only), which removes most single-frame octave jumps. The
threshold is strict on purpose: octave errors, not small deviations, dominate an F0 RMSE.
Frames are centred every ``hop`` samples like the log-mels (frame ``k`` at sample
``k * hop``, ``1 + n // hop`` frames), so a DTW path over mel frames pairs F0 frames too.

Errors on aligned pairs: log-F0 RMSE in cents (100 cents = a semitone; pairs voiced in
both) and the voicing error (share of pairs whose voiced/unvoiced decision differs).
"""

from __future__ import annotations

import numpy as np

F0_MIN_HZ, F0_MAX_HZ = 50.0, 600.0  # the speaking range searched
YIN_THRESHOLD = 0.1  # the first dip of d' under this is the period (else the deepest dip)
VOICED_THRESHOLD = 0.2  # a frame whose deepest dip of d' stays above this is unvoiced
SILENT_DB = 40.0  # a frame this far below the loudest one is unvoiced, whatever YIN says
SILENT_DBFS = -70.0  # and so is a frame quieter than this (a silent clip has no loudest frame)


def yin(wav: np.ndarray, sample_rate: int, hop: int, window: int | None = None,
        fmin: float = F0_MIN_HZ, fmax: float = F0_MAX_HZ,
        threshold: float = YIN_THRESHOLD, voiced_threshold: float = VOICED_THRESHOLD
        ) -> tuple[np.ndarray, np.ndarray]:
    """(F0 in Hz float64 [frames], voiced bool [frames]) of a mono clip; F0 is 0 where
    unvoiced. ``window`` samples are compared per lag (default: two periods of ``fmin``)."""
    wav = np.asarray(wav, dtype=np.float64)
    n_frames = 1 + len(wav) // hop
    lag_min, lag_max = max(2, int(sample_rate / fmax)), int(np.ceil(sample_rate / fmin))
    window = window or 2 * lag_max
    span = window + lag_max  # samples one frame reads: its window, then the longest lag
    padded = np.pad(wav, (window // 2, window - window // 2 + lag_max))  # window k centred at k * hop
    frames = np.lib.stride_tricks.sliding_window_view(padded, span)[::hop][:n_frames]  # [F, span]
    diff = _difference(frames, window, lag_max)  # [F, lag_max + 1]
    lags = np.arange(1, lag_max + 1)
    cmnd = np.ones_like(diff)  # cumulative mean normalised difference, d'(0) = 1
    running = np.cumsum(diff[:, 1:], axis=1)
    cmnd[:, 1:] = np.where(running > 0, diff[:, 1:] * lags / np.maximum(running, 1e-30), 1.0)
    f0, voiced = np.zeros(n_frames), np.zeros(n_frames, dtype=bool)
    level = 10.0 * np.log10(np.maximum((frames[:, :window] ** 2).mean(1), 1e-20))  # [F] dB
    loud = (level > level.max() - SILENT_DB) & (level > SILENT_DBFS)
    for k in np.flatnonzero(loud):
        row = cmnd[k]
        searched = row[lag_min:lag_max]
        deepest = int(np.argmin(searched))
        if searched[deepest] >= voiced_threshold:
            continue
        below = np.flatnonzero(searched < threshold)
        t = lag_min + (int(below[0]) if below.size else deepest)
        while t + 1 < lag_max and row[t + 1] < row[t]:  # walk down to the dip's bottom
            t += 1
        a, b, c = row[t - 1], row[t], row[t + 1]
        bend = a - 2.0 * b + c
        shift = 0.5 * (a - c) / bend if bend > 0 else 0.0  # vertex of the parabola
        f0[k], voiced[k] = sample_rate / (t + shift), True
    return _median3(f0, voiced), voiced


def _median3(f0: np.ndarray, voiced: np.ndarray) -> np.ndarray:
    """Each voiced frame's F0 replaced by the median of its voiced neighbours and itself."""
    log_f0 = np.pad(np.where(voiced, np.log(np.maximum(f0, 1e-9)), np.nan), 1,
                    constant_values=np.nan)
    windows = np.lib.stride_tricks.sliding_window_view(log_f0, 3)[voiced]  # [voiced, 3]
    out = np.zeros_like(f0)
    out[voiced] = np.exp(np.nanmedian(windows, axis=1)) if len(windows) else 0.0
    return out


def _difference(frames: np.ndarray, window: int, lag_max: int) -> np.ndarray:
    """YIN's difference ``d(t) = sum_j (x_j - x_{j+t})^2`` for j < window, t = 0..lag_max,
    per frame [F, span] -> [F, lag_max + 1], through one FFT correlation per frame."""
    head = frames[:, :window]
    size = 1 << int(np.ceil(np.log2(frames.shape[1] + window)))
    cross = np.fft.irfft(np.fft.rfft(frames, size) * np.conj(np.fft.rfft(head, size)),
                         size)[:, :lag_max + 1]  # [F, lags]: sum_j x_j x_{j+t}
    energy = np.cumsum(np.pad(frames ** 2, ((0, 0), (1, 0))), axis=1)  # prefix sums [F, span+1]
    lags = np.arange(lag_max + 1)
    shifted = energy[:, lags + window] - energy[:, lags]  # sum_j x_{j+t}^2
    return np.maximum(energy[:, [window]] + shifted - 2.0 * cross, 0.0)


def f0_errors(f0_a: np.ndarray, voiced_a: np.ndarray, f0_b: np.ndarray, voiced_b: np.ndarray,
              pairs: np.ndarray) -> tuple[float, float]:
    """(log-F0 RMSE in cents over the pairs voiced in both, NaN when none is; voicing error:
    share of pairs whose decisions differ). ``pairs`` int [P, 2] index frames of a and b."""
    i = np.minimum(pairs[:, 0], len(f0_a) - 1)
    j = np.minimum(pairs[:, 1], len(f0_b) - 1)
    va, vb = voiced_a[i], voiced_b[j]
    both = va & vb
    voicing = float((va != vb).mean()) if len(pairs) else float("nan")
    if not both.any():
        return float("nan"), voicing
    cents = 1200.0 * np.log2(f0_a[i[both]] / f0_b[j[both]])
    return float(np.sqrt(np.mean(cents ** 2))), voicing
