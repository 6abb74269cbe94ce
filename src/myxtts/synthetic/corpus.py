"""The generated demo corpus: random sentences of the demo languages spoken by demo voices.

Why synthetic: prepare -> train -> clone must be testable without downloading a corpus, and
learnable quickly, so the text -> mel mapping is as simple as possible while cloning stays
non-trivial (sounds and voices: ``synthetic.voices``). Words are consonant-vowel syllables,
so the cleaners leave them alone; utterances are 0.6-4.9 s by construction (the word count
comes from the letter durations; nothing is cut). 4 x 300 utterances take a few seconds; all
draws come from ``default_rng([seed, speaker, utterance])``, so the same arguments give
byte-identical files. ``speaker_languages`` decides who speaks which language (the second is
``synthetic.persian_demo``), so a voice can be asked to speak a language it never spoke.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from myxtts.audio.io import save_wav
from myxtts.synthetic.persian_demo import FA_CODAS, FA_CONSONANTS, FA_DEMO_SENTENCE, FA_VOWELS
from myxtts.synthetic.voices import (
    DEMO_ALPHABET,
    DEMO_ALPHABETS,
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
from myxtts.system import FolderError, atomic_write, writable_folder

VOWELS = "aeiou"
CONSONANTS = "mnlrsftkp"
CODAS = "nmsl"  # consonants allowed at the end of a word
# language -> (vowels, consonants, codas) of its words
_INVENTORY = {"en": (VOWELS, CONSONANTS, CODAS), "fa": (FA_VOWELS, FA_CONSONANTS, FA_CODAS)}
DEMO_LANGUAGES = tuple(_INVENTORY)
_DEMO_SENTENCES = {"en": "lamo tesi kunapo. miresu.", "fa": FA_DEMO_SENTENCE}
MIN_DURATION_S = 0.6
MAX_DURATION_S = 4.9
_DEMO_FILE = re.compile(r"wavs/spk\d+_\d{4,}\.wav|metadata\.csv|README\.txt")
DEMO_MARKER = ".myxtts-demo"  # the files make_demo_data wrote in its folder, one a line


def demo_sentence(language: str = "en") -> str:
    """A fixed two-sentence line of the demo ``language`` (for ``myxtts demo`` and tests)."""
    if language not in _DEMO_SENTENCES:
        raise ValueError(f"no demo language {language!r}; the demo languages are {list(DEMO_LANGUAGES)}")
    return _DEMO_SENTENCES[language]


def speaker_languages(speakers: int, languages: tuple[str, ...] | list[str] = ("en",)
                      ) -> dict[str, list[str]]:
    """Which demo languages each voice speaks: ``{"spk0": ["en"], ...}``.

    One language: everybody speaks it. Two languages (L1, L2), in speaker order: the
    first ``ceil(n/3)`` voices speak only L1, the last ``max(1, floor(n/3))`` only L2 and
    the ones between both (8 voices: spk0-2 L1, spk3-5 both, spk6-7 L2; 3 voices: one of
    each; 2 voices: one L1, one L2; 1 voice: both). Why contiguous groups: the rule is
    easy to state and to remember, independent of the seed, and every count from 3 up
    has a voice of each kind, so there is always a voice that never spoke L2 and a
    bilingual one that ties the languages together. A bilingual voice alternates
    languages utterance by utterance (even utterances L1, odd L2).
    """
    langs = list(languages)
    bad = [lang for lang in langs if lang not in _INVENTORY]
    if not langs or bad or len(set(langs)) != len(langs) or len(langs) > 2:
        raise ValueError(f"languages must be one or two distinct demo languages of "
                         f"{list(DEMO_LANGUAGES)}, got {langs}")
    if speakers < 1:
        raise ValueError(f"need at least 1 speaker, got {speakers}")
    names = [f"spk{s}" for s in range(speakers)]
    if len(langs) == 1 or speakers == 1:
        return {name: list(langs) for name in names}
    first_only = -(-speakers // 3)
    second_only = max(1, speakers // 3)
    return {name: ([langs[0]] if s < first_only else
                   [langs[1]] if s >= speakers - second_only else list(langs))
            for s, name in enumerate(names)}


def _random_word(rng: np.random.Generator, language: str = "en") -> str:
    vowels, consonants, codas = _INVENTORY[language]
    n_syll = int(rng.choice([1, 2, 3], p=[0.3, 0.45, 0.25]))
    word = []
    for k in range(n_syll):
        if not (k == 0 and rng.random() < 0.15):  # sometimes start on a bare vowel
            word.append(consonants[rng.integers(len(consonants))])
        word.append(vowels[rng.integers(len(vowels))])
    if len(word) < 2 or rng.random() < 0.3:
        word.append(codas[rng.integers(len(codas))])
    return "".join(word)


def _random_utterance(rng: np.random.Generator, spk: DemoSpeaker, sample_rate: int,
                      language: str = "en") -> tuple[str, list[tuple[int, int]]]:
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
        word = _random_word(rng, language)
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
                   sample_rate: int = 22050, languages: tuple[str, ...] | list[str] = ("en",)) -> Path:
    """Write the demo corpus (``utterances`` per speaker) in LJSpeech layout with a speaker
    column: ``metadata.csv`` (``id|text|text|speaker``), ``wavs/ID.wav`` (16-bit PCM mono),
    ``README.txt``. Returns ``out_dir``. Same arguments -> byte-identical files.

    With two ``languages`` (e.g. ``("en", "fa")``) voices speak them as
    ``speaker_languages`` says and every row gets a fifth column, its language
    (``id|text|text|speaker|language``); one language keeps the four-column layout (the
    default corpus has no language column).
    """
    if speakers < 1 or utterances < 1:
        raise ValueError(f"need at least 1 speaker and 1 utterance, got {speakers} and {utterances}")
    spoken = speaker_languages(speakers, languages)
    multilingual = len(languages) > 1
    if sample_rate < 16000:
        raise ValueError(f"sample_rate must be >= 16000 Hz (the 's' band reaches 8 kHz), got {sample_rate}")
    out = writable_folder(out_dir, "output folder")
    earlier = _earlier_demo_files(out)
    planned = {f"wavs/{demo_speaker(s, speakers).name}_{k:04d}.wav"
               for s in range(speakers) for k in range(utterances)} | {"metadata.csv", "README.txt"}
    # Recorded before any clip is written: a run killed half-way leaves a folder a re-run
    # may still replace.
    atomic_write(out / DEMO_MARKER, "\n".join(sorted(earlier | planned)) + "\n")
    wav_dir = out / "wavs"
    wav_dir.mkdir(parents=True, exist_ok=True)
    rows: list[str] = []
    total_s = 0.0
    for s in range(speakers):
        spk = demo_speaker(s, speakers)
        tables = voice_tables(spk, sample_rate)
        langs = spoken[spk.name]
        for k in range(utterances):
            rng = np.random.default_rng([seed, s, k])
            lang = langs[k % len(langs)]
            text, phones = _random_utterance(rng, spk, sample_rate, lang)
            wav = render(phones, spk, rng, sample_rate, tables)
            uid = f"{spk.name}_{k:04d}"
            save_wav(wav_dir / f"{uid}.wav", wav, sample_rate)
            rows.append(f"{uid}|{text}|{text}|{spk.name}" + (f"|{lang}" if multilingual else ""))
            total_s += wav.size / sample_rate
    # A re-run with fewer utterances into the same folder: drop the old corpus's other
    # clips (only files an earlier make_demo_data recorded), so every clip in wavs/ is
    # listed in metadata.csv.
    for rel in sorted(earlier - planned):
        (out / rel).unlink(missing_ok=True)
    atomic_write(out / "metadata.csv", "\n".join(rows) + "\n")
    atomic_write(out / "README.txt", _readme(speakers, utterances, seed, sample_rate, total_s, spoken,
                                             list(languages)))
    atomic_write(out / DEMO_MARKER, "\n".join(sorted(planned)) + "\n")
    return out


def _earlier_demo_files(out: Path) -> set[str]:
    """The files an earlier ``make_demo_data`` recorded in ``out`` (empty for an empty
    folder); FolderError if ``out`` holds anything else, which is never replaced."""
    found = sorted(p for p in out.rglob("*") if p.name != DEMO_MARKER or p.parent != out)
    if not found:
        return set()
    marker = out / DEMO_MARKER
    try:
        recorded = set(marker.read_text(encoding="utf-8").split("\n")) - {""}
    except (OSError, UnicodeDecodeError):
        raise FolderError(f"{out} holds files that make-demo-data did not write (e.g. {found[0]}); "
                          f"choose a new or empty folder") from None
    recorded = {r for r in recorded if _DEMO_FILE.fullmatch(r)}
    for p in found:
        rel = p.relative_to(out).as_posix()
        if not (rel in recorded or (rel == "wavs" and p.is_dir() and not p.is_symlink())):
            raise FolderError(f"{out} holds {p}, which make-demo-data did not write; move it out "
                              f"or choose a new or empty folder (only an earlier demo corpus is "
                              f"replaced)")
    return recorded


def _readme(speakers: int, utterances: int, seed: int, sample_rate: int, total_s: float,
            spoken: dict[str, list[str]], languages: list[str]) -> str:
    multilingual = len(languages) > 1
    lang_flag = f" --languages {','.join(languages)}" if languages != ["en"] else ""
    layout = ("metadata.csv rows `id|text|text|speaker|language`" if multilingual
              else "metadata.csv rows `id|text|text|speaker`")
    lines = [
        "myxtts demo corpus (synthetic)",
        "==============================",
        "",
        f"Generated by `myxtts make-demo-data OUT --speakers {speakers} --utterances {utterances} "
        f"--seed {seed} --sample-rate {sample_rate}{lang_flag}`",
        "(the same arguments always produce byte-identical files).",
        "",
        f"{speakers} speakers x {utterances} utterances = {speakers * utterances} clips, "
        f"{total_s / 3600:.2f} h, 16-bit PCM mono WAV at {sample_rate} Hz.",
        f"Layout (LJSpeech + speaker column): {layout}, clips at wavs/ID.wav.",
        f"Clips last {MIN_DURATION_S}-{MAX_DURATION_S} s (by construction), peak {PEAK_DBFS:.0f} dBFS, "
        f"noise floor {NOISE_FLOOR_DBFS:.0f} dBFS.",
        "",
    ]
    for lang in languages:
        lines += _language_lines(lang, multilingual)
    lines += [
        "  ' ' pause 60 ms;  '.' pause 150 ms",
        "Formant and noise-band frequencies are multiplied by the speaker's formant scale.",
        "",
        "Speakers (pitch varies per utterance by ~4 %, with declination and a slow wobble):",
    ]
    for s in range(speakers):
        spk = demo_speaker(s, speakers)
        lines.append(f"  {spk.name:<6} f0 {spk.f0_hz:5.1f} Hz  formant scale {spk.formant_scale:.3f}  "
                     f"tilt {spk.tilt_db_per_octave:+.1f} dB/oct  rate x{spk.rate:.3f}"
                     + (f"  speaks {'+'.join(spoken[spk.name])}" if multilingual else ""))
    if multilingual:
        lines += ["Who speaks what: the first ceil(n/3) voices only the first language, the last "
                  "max(1, floor(n/3)) only the second,",
                  "the rest both (alternating: even utterances the first language, odd the second)."]
    lines += ["", "Train on it: myxtts inspect-data OUT; see the project README for the demo run.", ""]
    return "\n".join(lines)


def _language_lines(language: str, multilingual: bool) -> list[str]:
    """The README's description of one language's letters and sounds."""
    if language == "en":
        name = "Language en" if multilingual else "The language"
        return [f"{name}: words of consonant-vowel syllables over the letters "
                f"'{DEMO_ALPHABET}', separated by ' ', sentences end with '.'.",
                "Each letter is one fixed sound (durations before the speaker's rate factor, +-5 % jitter):",
                *letter_table_lines("en")]
    return ["Language fa (made up, in Persian letters; no case, no zero-width joiners): words of "
            "consonant-vowel syllables over",
            f"the letters '{DEMO_ALPHABETS['fa']}', separated by ' ', sentences end with '.'.",
            "It shares the vowels u i and the consonants m n l r s f t k p with en (same sounds), "
            "has no a e o, and adds",
            "a long open vowel aa and the fricatives sh, kh and z (voiced). Per letter: a Latin "
            "name, kind, duration, shared or not, sound:",
            *letter_table_lines("fa")]
