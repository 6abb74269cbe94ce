"""`myxtts evaluate MODEL DATA`: a trained model scored on held-out utterances, beside the
ground truth.

Each utterance picked from DATA (its validation split, the one ``prepare`` makes with the
model's data settings, or every utterance with ``split="all"``) is spoken by the model in
the voice of ANOTHER clip of the same speaker (cloning, never copying the target), and three
clips are scored with every metric of ``metrics.scorer``:

    model           what the model says, through its vocoder (for ``myxtts train``'s
                    family a bundle's, --vocoder, or Griffin-Lim)
    truth, vocoded  the true clip through the same vocoder: what a perfect acoustic model
                    would get, so the vocoder's share of an error shows (left out, with a
                    note, for a family whose audio cannot be made from a true clip)
    truth           the true clip itself: the ceiling of this data (MCD 0, duration 1)

The model is any ``evaluate.speaking.SpeakingModel`` (``open_speaking_model`` picks the
family); this module knows only that protocol. DATA is a dataset in any layout ``prepare``
reads, or a store of ``myxtts prepare --audio`` (a store without audio holds no
ground-truth clips). ``evaluate.report`` summarises the scores per language and writes the
table, JSON and the per-utterance CSV.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import soxr

from myxtts.audio.io import AudioError, audio_info, load_audio, save_wav
from myxtts.config import Config
from myxtts.config.bounds import count
from myxtts.data.prepare.readers import read_dataset
from myxtts.data.prepare.records import UNKNOWN_LANGUAGE
from myxtts.data.store import MANIFEST, FeatureStore
from myxtts.data.store.format import SPLITS
from myxtts.evaluate.mel_speaking import training_record as training_record  # re-exported
from myxtts.evaluate.speaking import SpeakingModel, open_speaking_model
from myxtts.inference.errors import SynthesisError
from myxtts.metrics import EvaluationError
from myxtts.metrics.scorer import ClipScores, Scorer
from myxtts.metrics.truth import MAX_LENGTH_RATIO
from myxtts.outputs import safe_name

log = logging.getLogger(__name__)

VOCODED = "truth, vocoded"
ROWS = ("model", VOCODED, "truth")
SPLIT_CHOICES = ("val", "all")


MORE_REFERENCES = 3  # other clips of the speaker tried when a reference cannot be used


@dataclass
class Case:
    """One utterance to evaluate: its text, the true clip and another clip of its speaker
    (``load_truth`` / ``load_reference`` give float32 audio at the model's sample rate);
    ``more_references``: (id, loader) of further clips of the speaker, tried in turn when
    the reference is too short, silent or unreadable."""

    id: str
    text: str
    language: str
    speaker: str
    reference_id: str
    load_truth: Callable[[], np.ndarray]
    load_reference: Callable[[], np.ndarray]
    more_references: list[tuple[str, Callable[[], np.ndarray]]] = field(default_factory=list)


@dataclass
class Evaluation:
    """What ``evaluate`` measured: per utterance and row, the scores (a row the model cannot
    be measured on is absent: ``rows`` are those present, in ``ROWS`` order); ``notes`` say
    what was left out and why; ``training`` is the run's last evaluation in training, if any."""

    model: str
    data: str
    split: str
    vocoder: str
    asr: str
    device: str
    cases: list[Case] = field(default_factory=list)
    scores: dict[str, list[ClipScores]] = field(default_factory=dict)  # row -> per case
    notes: list[str] = field(default_factory=list)
    training: dict[str, Any] | None = None

    @property
    def rows(self) -> tuple[str, ...]:
        return tuple(r for r in ROWS if r in self.scores)


def evaluate(model: str | Path, data: str | Path, *, vocoder: str | Path | None = None,
             max_utterances: int = 20, split: str = "val", asr: str = "pocketsphinx",
             device: str = "auto", seed: int = 0, audio_dir: Path | None = None,
             progress: Callable[[int, int, str], None] | None = None) -> Evaluation:
    """Score ``model`` (a run folder, checkpoint or bundle) on up to ``max_utterances`` of
    ``data``'s ``split``. ``audio_dir``: keep each model clip and vocoded truth there."""
    if split not in SPLIT_CHOICES:
        raise EvaluationError(f"--split {split!r}: give one of {', '.join(SPLIT_CHOICES)}")
    return score(open_speaking_model(model, device, vocoder), str(model), data,
                 max_utterances=max_utterances, split=split, asr=asr, seed=seed,
                 audio_dir=audio_dir, progress=progress)


def score(speaking: SpeakingModel, name: str, data: str | Path, *, max_utterances: int = 20,
          split: str = "val", asr: str = "pocketsphinx", seed: int = 0,
          audio_dir: Path | None = None,
          progress: Callable[[int, int, str], None] | None = None) -> Evaluation:
    """``evaluate`` of a model already opened (not yet loaded), reported as ``name``."""
    if speaking.config.audio.sample_rate != speaking.sample_rate:
        raise ValueError(f"{type(speaking).__name__}: config.audio.sample_rate "
                         f"{speaking.config.audio.sample_rate} is not its sample_rate "
                         f"{speaking.sample_rate}; the clips it is given and gives must agree")
    cfg = speaking.config
    cases, notes = pick_cases(data, cfg, split, speaking.languages, max_utterances, seed)  # data errors first
    speaking.load()
    scorer = Scorer(cfg.audio, asr=asr, device=str(speaking.device))  # models load before work
    result = Evaluation(name, str(data), split, speaking.vocoder, scorer.recognizer.name
                        if scorer.recognizer else "none", str(speaking.device), notes=notes,
                        training=speaking.training_record, scores={r: [] for r in ROWS})
    warm, unstopped, unvocoded = False, 0, False
    for k, case in enumerate(cases):
        if progress is not None:
            progress(k, len(cases), case.id)
        try:
            case, voice = _with_usable_reference(speaking, case)
            if not warm:
                speaking.warm_up(case.text, voice, case.language, seed)
                warm = True
            clips = _clips(speaking, case, voice, seed, vocode=not unvocoded)
        except (AudioError, SynthesisError) as e:
            result.notes.append(f"{case.id} left out: {e}")
            continue
        if VOCODED in clips and clips[VOCODED][0] is None:
            unvocoded = True  # the family cannot voice a true clip: the row goes, for all
            del clips[VOCODED]
            result.scores.pop(VOCODED, None)
        if audio_dir is not None:
            for row, kept in (("model", "model"), (VOCODED, "vocoded")):
                if row in clips:
                    save_wav(audio_dir / safe_name(f"{case.id}.{kept}.wav"), clips[row][0],
                             speaking.sample_rate)
        unstopped += clips["unstopped"]
        text = speaking.scoring_text(case.text, case.language)
        ref = scorer.embed(clips["reference"][0])
        truth = clips["truth"][0]
        result.cases.append(case)
        for row in result.rows:
            wav, seconds = clips[row]
            scores = scorer.score(wav, text, case.language, truth, ref)
            scores.synthesis_s = seconds
            result.scores[row].append(scores)
    if progress is not None:
        progress(len(cases), len(cases), "")
    if not result.cases:
        raise EvaluationError(f"nothing could be evaluated in {data}: " + "; ".join(
            result.notes[-3:]) + ("; try --split all or another DATA" if split == "val" else ""))
    if unvocoded:
        result.notes.append(f"the {VOCODED!r} row is left out: this model's audio "
                            f"({speaking.vocoder}) cannot be made from a true clip, so the "
                            f"vocoder's share of the error is not measured")
    if unstopped:
        result.notes.append(f"{unstopped} of {count(len(result.cases), 'utterance')} did not stop: cut "
                            f"at {MAX_LENGTH_RATIO:g}x the true length or at "
                            f"{speaking.length_limit}, the smaller")
    for lang in sorted({c.language for c in result.cases}):
        if not scorer.speaks(lang) and scorer.recognizer is not None:
            result.notes.append(f"{lang}: no CER/WER: {scorer.recognizer.name} does not "
                                f"recognize {lang!r} (--asr whisper[:SIZE] does, with its "
                                f"weights on disk)")
    return result


def _with_usable_reference(speaking: SpeakingModel, case: Case) -> tuple[Case, Any]:
    """``case`` with the first of its references (the drawn one, then the others of its
    speaking) that conditions the model -- long enough, not silent, readable -- and the
    voice made of that reference (made once: its warnings are said once). A
    SynthesisError naming the first reference's problem when none does."""
    tried = [(case.reference_id, case.load_reference), *case.more_references]
    first = None
    for ref_id, load in tried:
        try:
            voice = speaking.voice_of(load(), ref_id)
        except (AudioError, SynthesisError) as e:
            first = first or e
            continue
        return dataclasses.replace(case, reference_id=ref_id, load_reference=load,
                                   more_references=[]), voice
    raise SynthesisError(f"no usable reference clip of speaker {case.speaker} among "
                         f"{len(tried)} tried ({first})")


def _clips(speaking: SpeakingModel, case: Case, voice: Any, seed: int,
           vocode: bool = True) -> dict[str, Any]:
    """The case's audio: (clip, seconds it took to make) for the model's utterance spoken in
    ``voice``, the vocoded truth (None where the model cannot make it; not asked for
    without ``vocode``) and the truth, and the reference clip; ``unstopped``: whether the
    model ran into the length cap instead of stopping."""
    truth, reference = case.load_truth(), case.load_reference()
    start = time.perf_counter()
    spoken, unstopped = speaking.say(case.text, voice, case.language, seed, len(truth))
    took = time.perf_counter() - start
    clips = {"model": (spoken, took), "truth": (truth, None), "reference": (reference, None),
             "unstopped": unstopped}
    if vocode:
        clips[VOCODED] = (speaking.vocoded_truth(truth), None)
    return clips


# ---------------------------------------------------------------- the utterances

def pick_cases(data: str | Path, cfg: Config, split: str, languages: list[str],
               max_utterances: int, seed: int) -> tuple[list[Case], list[str]]:
    """Up to ``max_utterances`` cases of ``data`` (a store or a dataset), a seeded choice
    in the data's order, each with a reference clip of its speaker drawn the same way;
    and notes on what could not be used."""
    path = Path(data)
    if not path.exists():
        raise EvaluationError(f"DATA {path} does not exist; pass a dataset folder or a store "
                              f"of `myxtts prepare --audio`")
    rows, notes = (_store_rows if (path / MANIFEST).is_file() else _dataset_rows)(path, cfg, split)
    known = [r for r in rows["chosen"] if r["language"] in languages]
    if len(known) < len(rows["chosen"]):
        other = sorted({r["language"] for r in rows["chosen"]} - set(languages))
        notes.append(f"{count(len(rows['chosen']) - len(known), 'utterance')} in {', '.join(other)} left "
                     f"out: the model speaks {', '.join(languages)}")
    rng = np.random.default_rng(seed)
    if len(known) > max_utterances:
        known = _spread(known, max_utterances, rng)
    by_speaker: dict[str, list[dict[str, Any]]] = {}
    for r in rows["pool"]:
        by_speaker.setdefault(r["speaker"], []).append(r)
    cases, alone = [], []
    for r in known:
        others = [o for o in by_speaker.get(r["speaker"], []) if o["id"] != r["id"]]
        if not others:
            alone.append(r["id"])
            continue
        order = rng.permutation(len(others))[:1 + MORE_REFERENCES]
        ref, more = others[int(order[0])], [others[int(i)] for i in order[1:]]
        cases.append(Case(r["id"], r["text"], r["language"], r["speaker"], ref["id"],
                          r["load"], ref["load"], [(o["id"], o["load"]) for o in more]))
    if alone:
        notes.append(f"{count(len(alone), 'utterance')} left out (e.g. {alone[0]}): their speaker has no "
                     f"other clip to clone the voice from")
    if not cases:
        raise EvaluationError(f"nothing to evaluate in {path} ({split} split): "
                              + ("; ".join(notes) or "it has no utterances")
                              + ("; try --split all" if split == "val" else ""))
    return cases, notes


def _spread(rows: list[dict[str, Any]], n: int, rng: np.random.Generator
            ) -> list[dict[str, Any]]:
    """``n`` of ``rows`` spread over their languages (each language's rows in a seeded
    order, taken one language after the other, so a split of 4 English and 16 Persian
    rows gives both at --max 4), in the rows' own order."""
    by_language: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by_language.setdefault(r["language"], []).append(i)
    queues = [list(rng.permutation(idx)) for _, idx in sorted(by_language.items())]
    chosen: list[int] = []
    while len(chosen) < n:
        for queue in queues:
            if queue and len(chosen) < n:
                chosen.append(int(queue.pop(0)))
    return [rows[i] for i in sorted(chosen)]


def _dataset_rows(path: Path, cfg: Config, split: str) -> tuple[dict[str, list], list[str]]:
    """A raw dataset's rows, with what ``prepare`` would leave out left out here too, each
    said in a note: rows in a language the model does not speak (the reader drops them),
    clips outside the duration limits (``data.min_duration_s`` / ``max_duration_s``); and a
    note on references recorded at too low a rate for the model's mel range."""
    splits = read_dataset(path, cfg)
    notes = []
    unspoken = sum(p.reason == UNKNOWN_LANGUAGE for p in splits.report)
    if unspoken:
        notes.append(f"{count(unspoken, 'utterance')} in {', '.join(sorted(splits.report.unknown_languages))}"
                     f" left out: the model speaks {', '.join(cfg.text.languages)}")
    lo, hi, fmax = cfg.data.min_duration_s, cfg.data.max_duration_s, cfg.audio.fmax
    rows: dict[str, list] = {}
    outside, low_rate = 0, 0
    for name, utts in (("train", splits.train), ("val", splits.val)):
        rows[name] = []
        for u in utts:
            info = audio_info(u.audio_path)
            if not lo <= info.duration_s <= hi:
                outside += 1
                continue
            low_rate += info.sample_rate / 2 < fmax
            rows[name].append({"id": u.id, "text": u.text, "language": u.language,
                               "speaker": u.speaker, "load": _file_loader(u.audio_path, cfg)})
    if outside:
        notes.append(f"{count(outside, 'clip')} outside data.min_duration_s..max_duration_s ({lo:g}.."
                     f"{hi:g} s) left out, as prepare leaves them out")
    if low_rate:
        notes.append(f"{count(low_rate, 'clip')} recorded below {2 * fmax:.0f} Hz: as references "
                     f"they hold nothing up to audio.fmax={fmax:.0f} Hz, so those voices may "
                     f"come out muffled")
    if split == "val" and not rows["val"]:
        raise EvaluationError(f"{path} has no validation utterances (data.val_fraction="
                              f"{cfg.data.val_fraction}); pass --split all to evaluate on all")
    pool = rows["train"] + rows["val"]
    return {"chosen": rows["val"] if split == "val" else pool, "pool": pool}, notes


def _file_loader(audio_path: Path, cfg: Config) -> Callable[[], np.ndarray]:
    return lambda: load_audio(audio_path, cfg.audio)  # trimmed and resampled as in training


def _store_rows(path: Path, cfg: Config, split: str) -> tuple[dict[str, list], list[str]]:
    stores = {s: FeatureStore.open(path, s) for s in SPLITS}
    if not stores["train"].has_audio:
        raise EvaluationError(f"the store {path} has no audio (prepared without --audio), so "
                              f"no ground-truth clips: pass the dataset it was prepared from as "
                              f"DATA, or prepare it again with --audio")
    notes = []
    rate, fmax = stores["train"].audio_sample_rate, cfg.audio.fmax
    if rate / 2 < fmax:
        notes.append(f"the store's audio is at {rate} Hz: as references its clips hold nothing "
                     f"up to audio.fmax={fmax:.0f} Hz, so the voices may come out muffled")
    rows: dict[str, list] = {}
    for name, store in stores.items():
        tok = store.tokenizer
        rows[name] = [{"id": store.ids[i], "text": tok.decode(store.tokens(i)),
                       "language": tok.languages[int(store.language_ids[i])],
                       "speaker": store.speakers[int(store.speaker_ids[i])],
                       "load": _store_loader(store, i, cfg)} for i in range(len(store))]
    if split == "val" and not rows["val"]:
        raise EvaluationError(f"the store {path} has no validation utterances; pass --split all")
    pool = rows["train"] + rows["val"]
    return {"chosen": rows["val"] if split == "val" else pool, "pool": pool}, notes


def _store_loader(store: FeatureStore, i: int, cfg: Config) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        wav = store.audio(i).astype(np.float32) / 32767.0
        if store.audio_sample_rate != cfg.audio.sample_rate:
            wav = soxr.resample(wav, store.audio_sample_rate, cfg.audio.sample_rate)
        return np.ascontiguousarray(wav, dtype=np.float32)
    return load
