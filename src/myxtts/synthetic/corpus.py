"""The generated demo corpus: random sentences of the demo language spoken by demo voices.

Why synthetic: the end-to-end path (prepare -> train -> clone a voice) must be testable
without downloading a corpus, and *learnable* quickly, so every design choice makes the
text -> mel mapping as simple as possible while keeping voice cloning non-trivial (the
sounds and voices are in ``synthetic.voices``):

* Words are consonant-vowel syllables (2-7 letters, e.g. "kalimo"), so the text never
  looks like an English abbreviation or number and the text cleaners leave it alone.
* Utterance lengths are 0.6-4.9 s *by construction*: the word count is chosen from the
  known letter durations before any audio exists; nothing is ever cut.

4 x 300 utterances take a few seconds. Everything is drawn from
``numpy.random.default_rng([seed, speaker, utterance])``: the same arguments give
byte-identical files, and the text of one utterance never depends on another.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from myxtts.audio.io import save_wav
from myxtts.synthetic.voices import (
    DEMO_ALPHABET,
    NOISE_FLOOR_DBFS,
    PEAK_DBFS,
    DemoSpeaker,
    demo_speaker,
    lead_silence,
    letter_phones,
    letter_table_lines,
    render,
    voice_tables,
)
from myxtts.system import atomic_write

VOWELS = "aeiou"
CONSONANTS = "mnlrsftkp"
CODAS = "nmsl"  # consonants allowed at the end of a word
MIN_DURATION_S = 0.6
MAX_DURATION_S = 4.9
_DEMO_WAV = re.compile(r"spk\d+_\d{4,}\.wav")


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


def _random_utterance(rng: np.random.Generator, spk: DemoSpeaker,
                      sample_rate: int) -> tuple[str, list[tuple[int, int]]]:
    """Text and phones whose total length lies in [MIN_DURATION_S, MAX_DURATION_S].

    The target length is skewed towards short clips (they train fastest); words are
    added until it is reached, never beyond the maximum.
    """
    target = int((MIN_DURATION_S + (4.5 - MIN_DURATION_S) * rng.random() ** 1.5) * sample_rate)
    limit = int(MAX_DURATION_S * sample_rate)
    phones = [lead_silence(sample_rate)]
    end = letter_phones(".", spk, rng, sample_rate)
    total = phones[0][1] + sum(n for _, n in end)
    text = ""
    while True:
        word = _random_word(rng)
        sep = "" if not text else (". " if rng.random() < 0.12 else " ")
        add = letter_phones(sep + word, spk, rng, sample_rate)
        n_add = sum(n for _, n in add)
        if text and total + n_add > limit:
            break
        text, total = text + sep + word, total + n_add
        phones += add
        if total >= target:
            break
    return text + ".", phones + end


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
        tables = voice_tables(spk, sample_rate)
        for k in range(utterances):
            rng = np.random.default_rng([seed, s, k])
            text, phones = _random_utterance(rng, spk, sample_rate)
            wav = render(phones, spk, rng, sample_rate, tables)
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
    atomic_write(out / "metadata.csv", "\n".join(rows) + "\n")
    atomic_write(out / "README.txt", _readme(speakers, utterances, seed, sample_rate, total_s))
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
    lines += letter_table_lines()
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
