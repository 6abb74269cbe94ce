"""Mel cepstra and mel-cepstral distortion (MCD), the spectral distance TTS papers report.

The cepstra are those of the log-amplitude envelope sampled at the N bands of the project's
log-mel (``audio.mel``: natural log of the Slaney mel magnitude, bands equally spaced on the
warped axis): ``log|X(w)| = c0 + 2 sum_k c_k cos(k w)`` gives
``c_k = 1/N sum_n x_n cos(pi k (2n + 1) / 2N)``, a DCT-II at the scale the usual MCD formula
assumes. Coefficients 1..``order`` are compared (c0, the frame's loudness, is left out, so a
gain change costs nothing). The distortion of two frames is
``10 / ln 10 * sqrt(2 * sum_k (c_k - c'_k)^2)`` dB; the utterances are aligned by DTW on
that distance and the MCD is its mean over the aligned frame pairs.

Papers mostly compute MCD from SPTK/WORLD mel-generalised cepstra, so their figures are not
digit-for-digit comparable with these; within this tool (a model against ground truth, a
run against another) the numbers compare like with like.
"""

from __future__ import annotations

import math

import numpy as np

from myxtts.metrics.dtw import pairwise, path

MCD_ORDER = 24  # cepstral coefficients compared (c1..c24), as in most MCD reports
_DB = 10.0 / math.log(10.0) * math.sqrt(2.0)  # MCD's constant: (10 / ln 10) * sqrt(2)


def cepstrum_matrix(n_in: int, n_out: int) -> np.ndarray:
    """[n_in, n_out] basis: ``log_mel [.., n_in] @ basis`` gives c_0..c_{n_out - 1}, the
    DCT-II divided by 2 N (``scipy.fft.dct(x, type=2)[:n_out] / (2 * n_in)``)."""
    k = np.arange(n_out)[None, :]
    n = np.arange(n_in)[:, None]
    return np.cos(np.pi * k * (2 * n + 1) / (2 * n_in)) / n_in


def mel_cepstra(log_mel: np.ndarray, order: int = MCD_ORDER) -> np.ndarray:
    """[frames, order] cepstral coefficients c1..c_order of a log-mel [frames, n_mels]."""
    log_mel = np.asarray(log_mel, dtype=np.float64)
    n_mels = log_mel.shape[-1]
    if order >= n_mels:
        raise ValueError(f"MCD order {order} needs more than {order} mel bands, got {n_mels}")
    return (log_mel @ cepstrum_matrix(n_mels, order + 1))[:, 1:]


def mcd(cep_a: np.ndarray, cep_b: np.ndarray) -> tuple[float, np.ndarray]:
    """(MCD in dB of cepstra ``cep_a`` [N, K] against ``cep_b`` [M, K] along their DTW
    alignment, the aligned frame pairs int [P, 2]). Identical inputs give 0."""
    cost = _DB * pairwise(cep_a, cep_b, "l2")  # [N, M] frame-pair distortion in dB
    _, pairs = path(cost)
    return float(cost[pairs[:, 0], pairs[:, 1]].mean()), pairs
