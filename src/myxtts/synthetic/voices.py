"""The sound of the demo languages: their letters as phones, the demo voices, and rendering.

Source-filter synthesis of a made-up language of 14 letters (``DEMO_ALPHABET``), space and
'.', and of the Persian-letter one (``persian_demo``); ``DEMO_ALPHABETS`` has both. Every
letter is one fixed sound (harmonic vowels with formants, voiced m n l r, noise bands s f,
closure + burst t k p), cross-faded over ~8 ms. Speakers differ in pitch, formant scale,
spectral tilt and rate; a letter's spectrum is the same across speakers up to that scaling,
so one mapping fits everybody and the voice must come from the reference clip. Each
utterance gets its own pitch offset, declining intonation and wobble, so f0 cannot be
memorised per speaker and letter. Synthesis runs in the STFT domain: milliseconds a clip.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from myxtts.synthetic.persian_demo import (
    FA_ALPHABET,
    FA_LETTER_KIND,
    FA_LETTER_NAMES,
    FA_LETTERS,
    FA_NOISE,
    FA_PHONES,
    FA_VOICED,
)

DEMO_ALPHABET = "aeioumnlrsftkp"
DEMO_ALPHABETS = {"en": DEMO_ALPHABET, "fa": FA_ALPHABET}  # language -> its letters
LEAD_SILENCE_S = 0.04
PEAK_DBFS = -3.0
NOISE_FLOOR_DBFS = -60.0
CROSSFADE_S = 0.008

# ------------------------------------------------------------- the sound inventory
# Phones are what gets synthesised; a letter is one phone, or two for the stops
# (closure + burst). Phone 0 is silence (no voiced and no noise energy). fa's own phones
# come last, so en phone ids are those of an en-only inventory (en corpora stay the same bytes).
_PHONES = ["sil", "a", "e", "i", "o", "u", "m", "n", "l", "r", "s", "f", "t", "k", "p", *FA_PHONES]
_P = {name: i for i, name in enumerate(_PHONES)}

# Voiced phones: formants (Hz, at formant scale 1.0), formant gains (dB), level (dB RMS).
_VOICED = {
    "a": ((750, 1150, 2500), (0, -4, -10), 0.0),
    "e": ((480, 1900, 2550), (0, -4, -9), -1.0),
    "i": ((290, 2250, 3000), (0, -6, -8), -2.0),
    "o": ((520, 850, 2450), (0, -3, -14), -1.0),
    "u": ((320, 800, 2250), (0, -6, -16), -2.0),
    "m": ((260, 1100, 2200), (0, -20, -24), -9.0),
    "n": ((260, 1700, 2600), (0, -14, -16), -9.0),
    "l": ((380, 1250, 2800), (0, -8, -14), -6.0),
    "r": ((450, 1150, 1650), (0, -5, -6), -5.0),
} | FA_VOICED
_BANDWIDTHS_HZ = (120.0, 150.0, 210.0)
# Noise phones: band centre (Hz), band width (Hz, gaussian sigma), level (dB RMS).
_NOISE = {
    "s": (6300.0, 900.0, -12.0),
    "f": (3000.0, 450.0, -13.0),
    "t": (4300.0, 800.0, -8.0),
    "k": (1900.0, 300.0, -8.0),
    "p": (800.0, 300.0, -10.0),
} | FA_NOISE
# Letter -> [(phone, base duration in ms)]; ' ' and '.' are pauses.
_LETTERS: dict[str, list[tuple[str, float]]] = {
    "a": [("a", 150)], "e": [("e", 130)], "i": [("i", 110)], "o": [("o", 140)], "u": [("u", 120)],
    "m": [("m", 80)], "n": [("n", 75)], "l": [("l", 70)], "r": [("r", 70)],
    "s": [("s", 100)], "f": [("f", 90)],
    "t": [("sil", 35), ("t", 30)], "k": [("sil", 40), ("k", 35)], "p": [("sil", 40), ("p", 25)],
    " ": [("sil", 60)], ".": [("sil", 150)],
} | FA_LETTERS
_HAS_NOISE = np.array([name in _NOISE for name in _PHONES], dtype=np.float32)  # [P]
_LETTER_KIND = {
    "a": "vowel", "e": "vowel", "i": "vowel", "o": "vowel", "u": "vowel",
    "m": "nasal", "n": "nasal", "l": "liquid", "r": "liquid",
    "s": "fricative", "f": "fricative", "t": "stop", "k": "stop", "p": "stop",
} | FA_LETTER_KIND


@dataclass(frozen=True)
class DemoSpeaker:
    """One synthetic voice. ``tilt_db_per_octave`` shapes the voiced spectrum (brightness)."""

    index: int
    f0_hz: float
    formant_scale: float
    tilt_db_per_octave: float
    rate: float  # duration multiplier: > 1 speaks slower

    @property
    def name(self) -> str:
        return f"spk{self.index}"


def demo_speaker_f0(speaker_index: int, speakers: int) -> float:
    """Mean f0 (Hz) of demo speaker ``speaker_index``: log-spaced from 90 to 260 Hz."""
    if speakers <= 1:
        return math.sqrt(90.0 * 260.0)
    return 90.0 * (260.0 / 90.0) ** (speaker_index / (speakers - 1))


def demo_speaker(speaker_index: int, speakers: int) -> DemoSpeaker:
    """Voice parameters (independent of the seed, so a speaker sounds the same in every corpus)."""
    if not 0 <= speaker_index < speakers:
        raise ValueError(f"speaker_index {speaker_index} out of range for {speakers} speakers")
    pos = speaker_index / (speakers - 1) if speakers > 1 else 0.5
    golden = (speaker_index * 0.6180339887) % 1.0  # spreads tilt/rate unlike pitch
    return DemoSpeaker(
        index=speaker_index,
        f0_hz=demo_speaker_f0(speaker_index, speakers),
        formant_scale=0.85 + 0.35 * pos,
        tilt_db_per_octave=-1.0 - 5.0 * golden,
        rate=0.9 + 0.2 * ((golden + 0.5) % 1.0),
    )


def letter_phones(text: str, spk: DemoSpeaker, rng: np.random.Generator,
                   sample_rate: int) -> list[tuple[int, int]]:
    """``[(phone id, n_samples)]`` for ``text``, with +-5 % per-phone duration jitter."""
    out = []
    for ch in text:
        for phone, ms in _LETTERS[ch]:
            jitter = 1.0 + 0.05 * (2.0 * rng.random() - 1.0)
            out.append((_P[phone], int(round(ms * 1e-3 * spk.rate * jitter * sample_rate))))
    return out


# ------------------------------------------------------------- synthesis

def lead_silence(sample_rate: int) -> tuple[int, int]:
    """The ``(phone, n_samples)`` of silence every clip starts with."""
    return _P["sil"], int(LEAD_SILENCE_S * sample_rate)


def voice_tables(spk: DemoSpeaker, sample_rate: int) -> tuple[np.ndarray, np.ndarray]:
    """The per-phone spectra of ``spk`` (what ``render`` needs; compute once per voice)."""
    return _envelopes(spk, sample_rate, _stft_size(sample_rate)[0])


def _stft_size(sample_rate: int) -> tuple[int, int]:
    n_fft = 2 ** int(round(math.log2(0.023 * sample_rate)))  # ~23 ms window
    return n_fft, n_fft // 4


def _envelopes(spk: DemoSpeaker, sample_rate: int, n_fft: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-phone magnitude responses ``(voiced [P, B], noise [P, B])``, level-calibrated.

    Each row is scaled so that the phone, sustained on its own, has its table RMS level:
    voiced rows for a sawtooth at the speaker's f0 (harmonic k has amplitude 2/(pi k)),
    noise rows for unit-variance white noise. So loudness is equal across speakers and
    only the spectral shape carries timbre.
    """
    freqs = np.fft.rfftfreq(n_fft, 1.0 / sample_rate)  # [B]
    n_bins = freqs.size
    voiced = np.zeros((len(_PHONES), n_bins))
    noise = np.zeros((len(_PHONES), n_bins))
    a = spk.formant_scale
    tilt = (np.maximum(freqs, 100.0) / 1000.0) ** (spk.tilt_db_per_octave / (20 * math.log10(2)))
    harmonics = np.arange(1, int(sample_rate / 2 / spk.f0_hz)) * spk.f0_hz
    saw_amp = 2.0 / (math.pi * np.arange(1, harmonics.size + 1))
    for name, (formants, gains_db, level_db) in _VOICED.items():
        h = np.full(n_bins, 10 ** (-45 / 20))  # floor between formants
        for f, g, bw in zip(formants, gains_db, _BANDWIDTHS_HZ):
            h += 10 ** (g / 20) / (1.0 + ((freqs - a * f) / (0.5 * a * bw)) ** 2)
        h *= tilt
        power = np.sum((saw_amp * np.interp(harmonics, freqs, h)) ** 2) / 2
        voiced[_P[name]] = h * 10 ** (level_db / 20) / math.sqrt(power)
    for name, (centre, width, level_db) in _NOISE.items():
        h = np.exp(-0.5 * ((freqs - a * centre) / (a * width)) ** 2)
        noise[_P[name]] = h * 10 ** (level_db / 20) / math.sqrt(np.mean(h**2))
    return voiced.astype(np.float32), noise.astype(np.float32)


def _sawtooth(step: np.ndarray) -> np.ndarray:
    """Band-limited (polyBLEP) sawtooth in [-1, 1]; ``step`` = f0 / sample_rate per sample."""
    phase = np.cumsum(step)
    t = phase - np.floor(phase)
    saw = 2.0 * t - 1.0
    lo = np.flatnonzero(t < step)  # just after a wrap
    x = t[lo] / step[lo]
    saw[lo] -= x + x - x * x - 1.0
    hi = np.flatnonzero(t > 1.0 - step)  # just before a wrap
    x = (t[hi] - 1.0) / step[hi]
    saw[hi] -= x * x + x + x + 1.0
    return saw


def _f0_step(spk: DemoSpeaker, n: int, rng: np.random.Generator, sample_rate: int) -> np.ndarray:
    """Per-sample f0 / sample_rate: utterance offset (~4 %), declination, slow wobble.

    Computed on 64-sample blocks and held (a 3 ms staircase is inaudible and invisible
    in a mel, and saves two sines per sample).
    """
    block = 64
    t = np.arange(n // block + 1) * (block / sample_rate)  # block start times, s
    dur = n / sample_rate
    offset = math.exp(0.04 * rng.standard_normal())
    decl = 0.05 + 0.10 * rng.random()
    ph = rng.random(2) * 2 * math.pi
    f0 = spk.f0_hz * offset * (1.0 + decl * (0.5 - t / dur)) * (
        1.0 + 0.03 * np.sin(2 * math.pi * 1.3 * t + ph[0]) + 0.02 * np.sin(2 * math.pi * 2.9 * t + ph[1]))
    return np.repeat(f0 / sample_rate, block)[:n]


def _frame_weights(ids: np.ndarray, bounds: np.ndarray, centres: np.ndarray,
                   ramp: float) -> list[tuple[np.ndarray, np.ndarray]]:
    """``[(phone id [F], weight [F])]`` for the previous, current and next phone at each
    frame centre: a linear cross-fade over +-``ramp`` samples around every boundary."""
    n_ph = bounds.size - 1
    cur = np.clip(np.searchsorted(bounds, centres, side="right") - 1, 0, n_ph - 1)
    into = (centres - bounds[cur]) / (2 * ramp)
    left = (bounds[cur + 1] - centres) / (2 * ramp)
    w_prev = np.where(cur > 0, np.clip(0.5 - into, 0.0, 0.5), 0.0)
    w_next = np.where(cur < n_ph - 1, np.clip(0.5 - left, 0.0, 0.5), 0.0)
    w_cur = 1.0 - w_prev - w_next
    prev, nxt = np.maximum(cur - 1, 0), np.minimum(cur + 1, n_ph - 1)
    return [(ids[i], w.astype(np.float32)) for i, w in ((prev, w_prev), (cur, w_cur), (nxt, w_next))]


def _blend(table: np.ndarray, weights: list[tuple[np.ndarray, np.ndarray]],
           rows: np.ndarray | slice = slice(None)) -> np.ndarray:
    """Per-frame magnitude response: cross-faded rows of ``table`` [P, B] -> [F, B]."""
    return sum(table[phone[rows]] * w[rows, None] for phone, w in weights)


def render(phones: list[tuple[int, int]], spk: DemoSpeaker, rng: np.random.Generator,
            sample_rate: int, tables: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Audio for a phone sequence: float32 [T], peak at PEAK_DBFS plus a light noise floor."""
    n_fft, hop = _stft_size(sample_rate)
    ids = np.array([p for p, _ in phones])
    bounds = np.concatenate([[0], np.cumsum([n for _, n in phones])])  # [P+1] samples
    n = int(bounds[-1])
    step = _f0_step(spk, n, rng, sample_rate)
    pad = n_fft - hop
    n_frames = (n + pad) // hop + 1
    total = (n_frames - 1) * hop + n_fft
    window = 0.5 - 0.5 * np.cos(2 * math.pi * np.arange(n_fft) / n_fft)  # periodic Hann
    centres = np.arange(n_frames) * hop + n_fft // 2 - pad  # frame centres in clip samples
    voiced_table, noise_table = tables
    weights = _frame_weights(ids, bounds, centres, CROSSFADE_S * sample_rate)
    # Voiced part: STFT of the sawtooth, filtered frame by frame.
    x = np.zeros(total)
    x[pad:pad + n] = _sawtooth(step)
    frames = sliding_window_view(x, n_fft)[::hop] * window  # [F, n_fft]
    spec = np.fft.rfft(frames, axis=1)  # [F, B] complex128
    spec *= _blend(voiced_table, weights)
    # Noise part: drawn directly as the STFT of white noise, only in the frames where a
    # noise phone sounds. A complex gaussian per bin with E|X|^2 = 4 sum(w^2) makes the
    # windowed overlap-add below come out at unit variance (independent frames add in
    # power: sum(w^2)/n_fft * 4 * sum over frames of w^2 / 1.5^2 = 1 for Hann at 75 %).
    noisy = np.flatnonzero(sum(_HAS_NOISE[p] * w for p, w in weights) > 0)
    sigma = math.sqrt(2 * np.sum(window**2))
    noise = rng.standard_normal((noisy.size, 2 * spec.shape[1]), dtype=np.float32)
    noise = noise.view(np.complex64)  # [F_noisy, B]
    noise *= _blend(noise_table, weights, noisy) * sigma
    spec[noisy] += noise
    frames = np.fft.irfft(spec, n=n_fft, axis=1) * window  # [F, n_fft]
    y = np.zeros(total + n_fft)
    for k in range(n_fft // hop):  # overlap-add: hop divides n_fft
        seg = frames[:, k * hop:(k + 1) * hop].reshape(-1)
        y[k * hop:k * hop + seg.size] += seg
    y = y[pad:pad + n] / (np.sum(window**2) / hop)  # Hann^2 at 75 % overlap sums to 1.5
    y *= 10 ** (PEAK_DBFS / 20) / max(np.max(np.abs(y)), 1e-9)
    y += 10 ** (NOISE_FLOOR_DBFS / 20) * rng.standard_normal(n)
    return y.astype(np.float32)


def synthesize_demo(text: str, speaker_index: int, speakers: int, sample_rate: int = 22050,
                    seed: int = 0) -> np.ndarray:
    """Speak ``text`` (letters of DEMO_ALPHABETS, ' ' and '.') with a demo voice: float32 [T].

    For tests and experiments (e.g. a long vowel to measure pitch). A 40 ms lead silence
    is added, as in the corpus.
    """
    bad = sorted(set(text) - set(_LETTERS))
    if bad:
        raise ValueError(f"characters {bad} are not in the demo alphabet {DEMO_ALPHABET!r} "
                         f"(or the fa one {FA_ALPHABET!r}) + ' .'")
    spk = demo_speaker(speaker_index, speakers)
    rng = np.random.default_rng([seed, speaker_index, 1 << 30])
    phones = [lead_silence(sample_rate)] + letter_phones(text, spk, rng, sample_rate)
    return render(phones, spk, rng, sample_rate, voice_tables(spk, sample_rate))


def letter_table_lines(language: str = "en") -> list[str]:
    """One line per letter of ``language``: its kind, base duration and sound (for the
    corpus README). fa letters also say how they sound and which en letter shares it."""
    lines = []
    for ch in DEMO_ALPHABETS[language]:
        parts = _LETTERS[ch]
        ms = sum(m for _, m in parts)
        phone = parts[-1][0]
        sounds = []
        if phone in _VOICED:
            f, _, level = _VOICED[phone]
            sounds.append(f"voiced, formants {f[0]}/{f[1]}/{f[2]} Hz, level {level:+.0f} dB")
        if phone in _NOISE:
            c, w, level = _NOISE[phone]
            sounds.append(f"noise band {c - 2 * w:.0f}-{c + 2 * w:.0f} Hz, level {level:+.0f} dB")
        what = " + ".join(sounds)
        if _LETTER_KIND[ch] == "stop":
            what = f"{parts[0][1]:.0f} ms closure + burst, " + what
        if language == "en":
            lines.append(f"  {ch}  {_LETTER_KIND[ch]:<9} {ms:4.0f} ms  {what}")
            continue
        name = FA_LETTER_NAMES[ch]
        shared = f"= en '{phone}'" if phone in DEMO_ALPHABET else "fa only"
        lines.append(f"  {ch} {name:<2}  {_LETTER_KIND[ch]:<9} {ms:4.0f} ms  {shared:<9} {what}")
    return lines
