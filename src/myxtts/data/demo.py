"""Synthetic multi-speaker demo corpus that a tiny TTS learns on a CPU in minutes.

Why synthetic: the end-to-end path (prepare -> train -> clone a voice) must be testable
without downloading a corpus, and *learnable* quickly, so every design choice here makes
the text -> mel mapping as simple as possible while keeping voice cloning non-trivial:

* A made-up language of 14 letters (``DEMO_ALPHABET``), space and '.'. Every letter is
  one fixed sound (source-filter synthesis): vowels a e i o u are harmonic sounds at the
  speaker's f0 shaped by three formants of their own (90-160 ms); m n l r are quieter
  voiced sounds with their own formants; s and f are noise bands (s high, f mid); t k p
  are a short closure followed by a noise burst in a distinct band. Space is 60 ms and
  '.' 150 ms of near-silence. Letter sounds cross-fade over ~8 ms, so no clicks.
* Words are consonant-vowel syllables (2-7 letters, e.g. "kalimo"), so the text never
  looks like an English abbreviation or number and the text cleaners leave it alone.
* Speakers differ in pitch (log-spaced 90-260 Hz), formant scale (0.85-1.2: "vocal tract
  length"), spectral tilt and speaking rate. A letter's spectrum is identical across
  speakers up to that pitch/formant scaling, so one mapping fits everybody and the voice
  must come from the reference clip. Each utterance gets its own pitch offset, a
  declining intonation and a slow wobble, so the model cannot just memorise f0 per
  speaker-and-letter.
* Utterance lengths are 0.6-4.9 s *by construction*: the word count is chosen from the
  known letter durations before any audio exists; nothing is ever cut.

Synthesis runs in the STFT domain (one forward transform per source, one inverse), so
4 x 300 utterances take a few seconds. Everything is drawn from
``numpy.random.default_rng([seed, speaker, utterance])``: the same arguments give
byte-identical files, and the text of one utterance never depends on another.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from myxtts.audio.io import save_wav
from myxtts.utils import atomic_write_text

DEMO_ALPHABET = "aeioumnlrsftkp"
VOWELS = "aeiou"
CONSONANTS = "mnlrsftkp"
CODAS = "nmsl"  # consonants allowed at the end of a word
MIN_DURATION_S = 0.6
MAX_DURATION_S = 4.9
LEAD_SILENCE_S = 0.04
PEAK_DBFS = -3.0
NOISE_FLOOR_DBFS = -60.0
CROSSFADE_S = 0.008
_DEMO_WAV = re.compile(r"spk\d+_\d{4,}\.wav")

# ------------------------------------------------------------- the sound inventory
# Phones are what gets synthesised; a letter is one phone, or two for the stops
# (closure + burst). Phone 0 is silence (no voiced and no noise energy).
_PHONES = ["sil", "a", "e", "i", "o", "u", "m", "n", "l", "r", "s", "f", "t", "k", "p"]
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
}
_BANDWIDTHS_HZ = (120.0, 150.0, 210.0)
# Noise phones: band centre (Hz), band width (Hz, gaussian sigma), level (dB RMS).
_NOISE = {
    "s": (6300.0, 900.0, -12.0),
    "f": (3000.0, 450.0, -13.0),
    "t": (4300.0, 800.0, -8.0),
    "k": (1900.0, 300.0, -8.0),
    "p": (800.0, 300.0, -10.0),
}
# Letter -> [(phone, base duration in ms)]; ' ' and '.' are pauses.
_LETTERS: dict[str, list[tuple[str, float]]] = {
    "a": [("a", 150)], "e": [("e", 130)], "i": [("i", 110)], "o": [("o", 140)], "u": [("u", 120)],
    "m": [("m", 80)], "n": [("n", 75)], "l": [("l", 70)], "r": [("r", 70)],
    "s": [("s", 100)], "f": [("f", 90)],
    "t": [("sil", 35), ("t", 30)], "k": [("sil", 40), ("k", 35)], "p": [("sil", 40), ("p", 25)],
    " ": [("sil", 60)], ".": [("sil", 150)],
}
_HAS_NOISE = np.array([name in _NOISE for name in _PHONES], dtype=np.float32)  # [P]
_LETTER_KIND = {
    "a": "vowel", "e": "vowel", "i": "vowel", "o": "vowel", "u": "vowel",
    "m": "nasal", "n": "nasal", "l": "liquid", "r": "liquid",
    "s": "fricative", "f": "fricative", "t": "stop", "k": "stop", "p": "stop",
}


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


# ------------------------------------------------------------- text

def _random_word(rng: np.random.Generator) -> str:
    n_syll = int(rng.choice([1, 2, 3], p=[0.3, 0.45, 0.25]))
    word = []
    for k in range(n_syll):
        if not (k == 0 and rng.random() < 0.15):  # sometimes start on a bare vowel
            word.append(CONSONANTS[rng.integers(len(CONSONANTS))])
        word.append(VOWELS[rng.integers(len(VOWELS))])
    if len(word) < 2 or rng.random() < 0.3:
        word.append(CODAS[rng.integers(len(CODAS))])
    return "".join(word)


def _letter_phones(text: str, spk: DemoSpeaker, rng: np.random.Generator,
                   sample_rate: int) -> list[tuple[int, int]]:
    """``[(phone id, n_samples)]`` for ``text``, with +-5 % per-phone duration jitter."""
    out = []
    for ch in text:
        for phone, ms in _LETTERS[ch]:
            jitter = 1.0 + 0.05 * (2.0 * rng.random() - 1.0)
            out.append((_P[phone], int(round(ms * 1e-3 * spk.rate * jitter * sample_rate))))
    return out


def _random_utterance(rng: np.random.Generator, spk: DemoSpeaker,
                      sample_rate: int) -> tuple[str, list[tuple[int, int]]]:
    """Text and phones whose total length lies in [MIN_DURATION_S, MAX_DURATION_S].

    The target length is skewed towards short clips (they train fastest); words are
    added until it is reached, never beyond the maximum.
    """
    target = int((MIN_DURATION_S + (4.5 - MIN_DURATION_S) * rng.random() ** 1.5) * sample_rate)
    limit = int(MAX_DURATION_S * sample_rate)
    phones = [(_P["sil"], int(LEAD_SILENCE_S * sample_rate))]
    end = _letter_phones(".", spk, rng, sample_rate)
    total = phones[0][1] + sum(n for _, n in end)
    text = ""
    while True:
        word = _random_word(rng)
        sep = "" if not text else (". " if rng.random() < 0.12 else " ")
        add = _letter_phones(sep + word, spk, rng, sample_rate)
        n_add = sum(n for _, n in add)
        if text and total + n_add > limit:
            break
        text, total = text + sep + word, total + n_add
        phones += add
        if total >= target:
            break
    return text + ".", phones + end


# ------------------------------------------------------------- synthesis

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


def _render(phones: list[tuple[int, int]], spk: DemoSpeaker, rng: np.random.Generator,
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
    """Speak ``text`` (letters of DEMO_ALPHABET, ' ' and '.') with a demo voice: float32 [T].

    For tests and experiments (e.g. a long vowel to measure pitch). A 40 ms lead silence
    is added, as in the corpus.
    """
    bad = sorted(set(text) - set(_LETTERS))
    if bad:
        raise ValueError(f"characters {bad} are not in the demo alphabet {DEMO_ALPHABET!r} + ' .'")
    spk = demo_speaker(speaker_index, speakers)
    rng = np.random.default_rng([seed, speaker_index, 1 << 30])
    phones = [(_P["sil"], int(LEAD_SILENCE_S * sample_rate))] + _letter_phones(text, spk, rng, sample_rate)
    return _render(phones, spk, rng, sample_rate, _envelopes(spk, sample_rate, _stft_size(sample_rate)[0]))


# ------------------------------------------------------------- corpus

def make_demo_data(out_dir: str | Path, speakers: int = 4, utterances: int = 300, seed: int = 0,
                   sample_rate: int = 22050) -> Path:
    """Write the demo corpus (``utterances`` per speaker) in LJSpeech layout with a speaker
    column: ``metadata.csv`` (``id|text|text|speaker``), ``wavs/ID.wav`` (16-bit PCM mono),
    ``README.txt``. Returns ``out_dir``. Same arguments -> byte-identical files."""
    if speakers < 1 or utterances < 1:
        raise ValueError(f"need at least 1 speaker and 1 utterance, got {speakers} and {utterances}")
    if sample_rate < 16000:
        raise ValueError(f"sample_rate must be >= 16000 Hz (the 's' band reaches 8 kHz), got {sample_rate}")
    out = Path(out_dir)
    wav_dir = out / "wavs"
    wav_dir.mkdir(parents=True, exist_ok=True)
    rows: list[str] = []
    total_s = 0.0
    for s in range(speakers):
        spk = demo_speaker(s, speakers)
        tables = _envelopes(spk, sample_rate, _stft_size(sample_rate)[0])
        for k in range(utterances):
            rng = np.random.default_rng([seed, s, k])
            text, phones = _random_utterance(rng, spk, sample_rate)
            wav = _render(phones, spk, rng, sample_rate, tables)
            uid = f"{spk.name}_{k:04d}"
            save_wav(wav_dir / f"{uid}.wav", wav, sample_rate)
            rows.append(f"{uid}|{text}|{text}|{spk.name}")
            total_s += wav.size / sample_rate
    # A re-run with fewer utterances into the same folder: drop clips of the old corpus
    # (only files named like ours), so every clip in wavs/ is listed in metadata.csv.
    keep = {row.split("|", 1)[0] + ".wav" for row in rows}
    for old in wav_dir.glob("spk*_*.wav"):
        if _DEMO_WAV.fullmatch(old.name) and old.name not in keep:
            old.unlink()
    atomic_write_text(out / "metadata.csv", "\n".join(rows) + "\n")
    atomic_write_text(out / "README.txt", _readme(speakers, utterances, seed, sample_rate, total_s))
    return out


def _readme(speakers: int, utterances: int, seed: int, sample_rate: int, total_s: float) -> str:
    lines = [
        "myxtts demo corpus (synthetic)",
        "==============================",
        "",
        f"Generated by `myxtts make-demo-data OUT --speakers {speakers} --utterances {utterances} "
        f"--seed {seed} --sample-rate {sample_rate}`",
        "(the same arguments always produce byte-identical files).",
        "",
        f"{speakers} speakers x {utterances} utterances = {speakers * utterances} clips, "
        f"{total_s / 3600:.2f} h, 16-bit PCM mono WAV at {sample_rate} Hz.",
        "Layout (LJSpeech + speaker column): metadata.csv rows `id|text|text|speaker`, clips at wavs/ID.wav.",
        f"Clips last {MIN_DURATION_S}-{MAX_DURATION_S} s (by construction), peak {PEAK_DBFS:.0f} dBFS, "
        f"noise floor {NOISE_FLOOR_DBFS:.0f} dBFS.",
        "",
        "The language: words of consonant-vowel syllables over the letters "
        f"'{DEMO_ALPHABET}', separated by ' ', sentences end with '.'.",
        "Each letter is one fixed sound (durations before the speaker's rate factor, +-5 % jitter):",
    ]
    for ch in DEMO_ALPHABET:
        parts = _LETTERS[ch]
        ms = sum(m for _, m in parts)
        if ch in _VOICED:
            f, _, level = _VOICED[ch]
            what = f"voiced, formants {f[0]}/{f[1]}/{f[2]} Hz, level {level:+.0f} dB"
        else:
            c, w, level = _NOISE[ch]
            what = f"noise band {c - 2 * w:.0f}-{c + 2 * w:.0f} Hz, level {level:+.0f} dB"
            if _LETTER_KIND[ch] == "stop":
                what = f"{parts[0][1]:.0f} ms closure + burst, " + what
        lines.append(f"  {ch}  {_LETTER_KIND[ch]:<9} {ms:4.0f} ms  {what}")
    lines += [
        "  ' ' pause 60 ms;  '.' pause 150 ms",
        "Formant and noise-band frequencies are multiplied by the speaker's formant scale.",
        "",
        "Speakers (pitch varies per utterance by ~4 %, with declination and a slow wobble):",
    ]
    for s in range(speakers):
        spk = demo_speaker(s, speakers)
        lines.append(f"  {spk.name:<6} f0 {spk.f0_hz:5.1f} Hz  formant scale {spk.formant_scale:.3f}  "
                     f"tilt {spk.tilt_db_per_octave:+.1f} dB/oct  rate x{spk.rate:.3f}")
    lines += ["", "Train on it: myxtts inspect-data OUT; see the project README for the demo run.", ""]
    return "\n".join(lines)
