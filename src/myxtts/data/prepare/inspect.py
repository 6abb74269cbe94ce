"""``inspect-data``: what a dataset holds and what is wrong with it, before any training.

Reads the dataset like training would (same readers, same config) and every clip's
header (not its samples, so 10k clips take seconds), then summarises: utterances per
split, hours, per-speaker totals, a duration histogram, sample rates and every problem
grouped by reason with the file and line to fix. Problems are a report, not a failure:
the usable rest can still be trained on. What only the samples show (silence, a DC
offset, clipping, a truncated file) is checked on a seeded sample of ``DECODED_CLIPS``
clips decoded as prepare decodes them (``Inspection.decoded``: how many, how many failed):
a dataset that prepare would reject entirely shows it here, in seconds.
"""

from __future__ import annotations

import math
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from myxtts.audio.io import AudioError, AudioInfo, audio_info, load_audio
from myxtts.config import Config
from myxtts.data.prepare.readers import DatasetSplits, read_dataset
from myxtts.data.prepare.readers.languages import apply_language_fix
from myxtts.data.prepare.records import (
    TOO_LONG,
    TOO_SHORT,
    UNKNOWN_LANGUAGE,
    UNREADABLE_AUDIO,
    WRONG_SAMPLE_RATE,
    DataReport,
    DatasetError,
    LanguageFix,
    Utterance,
    speaker_label,
)
from myxtts.system import available_cpus

BAR_WIDTH = 40
MAX_SPEAKER_LINES = 40
DECODED_CLIPS = 64  # clips decoded (prepare decodes all): what a header cannot show


@dataclass
class Inspection:
    """Everything ``format_inspection`` prints; ``durations_s`` only has readable clips."""

    splits: DatasetSplits
    durations_s: dict[str, float] = field(default_factory=dict)  # utterance id -> seconds
    sample_rates: Counter = field(default_factory=Counter)  # Hz -> clips
    channels: Counter = field(default_factory=Counter)  # channel count -> clips
    language_fix: LanguageFix | None = None  # the setting the dataset was read under instead
    # Under the config as given, with ``language_fix`` set: the rows prepare and train would
    # drop for their language, and whether that is every row (prepare then stops).
    language_drops: int = 0
    drops_every_row: bool = False
    decoded: tuple[int, int] = (0, 0)  # (clips decoded as prepare decodes them, failed)

    @property
    def report(self) -> DataReport:
        return self.splits.report

    def hours(self, utts: list[Utterance]) -> float:
        return sum(self.durations_s.get(u.id, 0.0) for u in utts) / 3600.0


def _headers(utts: list[Utterance]) -> list[AudioInfo | AudioError]:
    """Header of every clip, in order; threads because this is file-system latency bound."""
    def one(u: Utterance) -> AudioInfo | AudioError:
        try:
            return audio_info(u.audio_path)
        except AudioError as e:
            return e

    if len(utts) < 256:
        return [one(u) for u in utts]
    with ThreadPoolExecutor(max_workers=min(16, 4 * available_cpus())) as pool:
        return list(pool.map(one, utts, chunksize=64))


def inspect_dataset(path: str | Path, cfg: Config) -> Inspection:
    """Read the dataset and all clip headers; header problems are added to the report.

    When another ``text.languages`` / ``text.default_language`` removes every language
    problem (``report.language_fix``), the dataset is shown as read under it (languages,
    speakers and hours as that setting would train them), and the summary names the
    ``--set`` that prepare and train need."""
    every = False
    try:
        splits = read_dataset(path, cfg)
        fix = splits.report.language_fix
    except DatasetError as e:
        fix = e.report.language_fix if e.report is not None else None
        if fix is None:
            raise
        every = True
    if fix is not None:
        splits = read_dataset(path, apply_language_fix(cfg, fix))
    ins = Inspection(splits, language_fix=fix, drops_every_row=every,
                     language_drops=fix.n_problems if fix is not None else 0)
    report, a, d = splits.report, cfg.audio, cfg.data
    if fix is not None:  # shown as the fix reads it, but under the config given they drop
        report.add(splits.root, None, None, UNKNOWN_LANGUAGE,
                   f"{fix.set_args} (pass it to prepare and train)",
                   f"{fix.n_problems} row(s) name a language text.languages "
                   f"{list(cfg.text.languages)} lacks: prepare and train as configured drop them")
    for u, info in zip(splits.all, _headers(splits.all)):
        if isinstance(info, AudioError):
            source, line = splits.origins.get(u.id, (str(u.audio_path), None))
            if line is None:  # a clip with no row of its own: the clip is the place to fix
                report.add(u.audio_path, None, u.id, UNREADABLE_AUDIO,
                           "re-export the clip as WAV/FLAC/OGG or remove it from the dataset", str(info))
            else:
                report.add(source, line, u.id, UNREADABLE_AUDIO,
                           f"re-export {Path(u.audio_path).name} as WAV/FLAC/OGG/MP3 or delete "
                           f"line {line} of {Path(source).name}", str(info))
            continue
        ins.sample_rates[info.sample_rate] += 1
        ins.channels[info.channels] += 1
        ins.durations_s[u.id] = info.duration_s
        if info.sample_rate != a.sample_rate and not a.resample:
            report.add(u.audio_path, None, u.id, WRONG_SAMPLE_RATE,
                       f"resample it to {a.sample_rate} Hz or pass --set audio.resample=true",
                       f"{info.sample_rate} Hz, audio.sample_rate is {a.sample_rate} Hz and resampling is off")
        if info.duration_s < d.min_duration_s:
            report.add(u.audio_path, None, u.id, TOO_SHORT,
                       f"remove it or lower data.min_duration_s ({d.min_duration_s})",
                       f"{info.duration_s:.2f} s; prepare will skip it")
        elif info.duration_s > d.max_duration_s:
            report.add(u.audio_path, None, u.id, TOO_LONG,
                       f"split it into shorter clips or raise data.max_duration_s ({d.max_duration_s})",
                       f"{info.duration_s:.2f} s; prepare will skip it")
    flagged = {p.utterance_id for p in report}  # (a clip reported already is not decoded)
    readable = [u for u in splits.all if u.id in ins.durations_s and u.id not in flagged]
    ins.decoded = _decode_sample(readable, cfg, report)
    return ins


def _decode_sample(utts: list[Utterance], cfg: Config, report: DataReport) -> tuple[int, int]:
    """Decode a seeded sample of ``DECODED_CLIPS`` of ``utts`` as prepare does
    (``audio.io.load_audio``); each clip it would reject is reported with its reason.
    Returns (decoded, failed)."""
    if len(utts) > DECODED_CLIPS:
        pick = np.random.default_rng(cfg.data.split_seed).choice(len(utts), DECODED_CLIPS,
                                                                  replace=False)
        utts = [utts[i] for i in sorted(pick)]

    def one(u: Utterance) -> AudioError | None:
        try:
            load_audio(u.audio_path, cfg.audio)
        except AudioError as e:
            return e
        return None

    with ThreadPoolExecutor(max_workers=min(8, 2 * available_cpus())) as pool:
        errors = list(pool.map(one, utts))
    for u, e in zip(utts, errors):
        if e is not None:
            what = str(e).split(": ", 1)[-1].rsplit("; ", 1)[0]  # (the path is the source)
            report.add(u.audio_path, None, u.id, e.reason, "re-record or re-export the clip, "
                       "or remove it from the dataset", f"{what}; prepare will skip it")
    return len(utts), sum(e is not None for e in errors)


# ---------------------------------------------------------------- formatting

def _median(values: list[float]) -> float:
    s = sorted(values)
    if not s:
        return math.nan
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else 0.5 * (s[mid - 1] + s[mid])


def histogram_lines(values: list[float], unit: str = "s", max_bins: int = 24) -> list[str]:
    """ASCII histogram with the smallest "nice" bin width giving at most ``max_bins`` bins."""
    if not values:
        return ["  (no readable clips)"]
    lo_v, hi_v = min(values), max(values)
    for width in (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0):
        lo = math.floor(lo_v / width) * width
        n_bins = max(1, math.floor((hi_v - lo) / width) + 1)
        if n_bins <= max_bins:
            break
    counts = [0] * n_bins
    for v in values:
        counts[min(n_bins - 1, int((v - lo) // width))] += 1
    top = max(counts)
    digits = 2 if width < 1 else 0
    label_w = len(f"{lo + n_bins * width:.{digits}f}")
    lines = [f"clip durations ({width:g} {unit} bins):"]
    for i, c in enumerate(counts):
        a, b = lo + i * width, lo + (i + 1) * width
        bar = "#" * (round(BAR_WIDTH * c / top) if c else 0)
        if c and not bar:
            bar = "."
        lines.append(f"  {a:>{label_w}.{digits}f}-{b:>{label_w}.{digits}f} {unit} |{bar:<{BAR_WIDTH}}| {c}")
    return lines


def _speaker_lines(ins: Inspection) -> list[str]:
    stats: dict[str, list[float]] = {}  # speaker -> [utts, seconds, train, val]
    for k, utts in enumerate((ins.splits.train, ins.splits.val)):
        for u in utts:
            s = stats.setdefault(u.speaker, [0, 0.0, 0, 0])
            s[0] += 1
            s[1] += ins.durations_s.get(u.id, 0.0)
            s[2 + k] += 1
    names = sorted(stats)
    shown = names
    if len(names) > MAX_SPEAKER_LINES:  # most and least audio: the extremes matter most
        by_audio = sorted(names, key=lambda n: (-stats[n][1], n))
        shown = by_audio[: MAX_SPEAKER_LINES - 10] + by_audio[-10:]
    w = max(len(speaker_label(n)) for n in names)
    lines = [f"speakers: {len(names)} (utterances, minutes of audio, train/val)"]
    for i, n in enumerate(shown):
        if len(shown) < len(names) and i == MAX_SPEAKER_LINES - 10:
            lines.append(f"  ... {len(names) - len(shown)} more speakers ...")
        u, sec, tr, va = stats[n]
        lines.append(f"  {speaker_label(n):<{w}} {int(u):6d} utts {sec / 60:8.2f} min  "
                     f"({int(tr)}/{int(va)})")
    return lines


def format_inspection(ins: Inspection, cfg: Config, max_per_reason: int = 5) -> str:
    sp = ins.splits
    all_utts = sp.all
    seeded = f"seeded (data.val_fraction {cfg.data.val_fraction}, data.split_seed {cfg.data.split_seed})"
    split_how = {"folders": "from train/ and val/ folders", "files": "from train/val manifest files",
                 "release": "the release's own", "release-seeded": f"of the release's train part {seeded}",
                 "seeded": seeded}[sp.split]
    durs = [ins.durations_s[u.id] for u in all_utts if u.id in ins.durations_s]
    lines = [
        f"dataset: {sp.root} (format {sp.format}, split {split_how})",
        *([sp.note] if sp.note else []),
        f"utterances: {len(all_utts)} (train {len(sp.train)}, val {len(sp.val)})",
        f"audio: {ins.hours(all_utts):.2f} h total (train {ins.hours(sp.train):.2f} h, "
        f"val {ins.hours(sp.val):.2f} h)",
    ]
    if durs:
        lines.append(f"clip duration: min {min(durs):.2f} s, median {_median(durs):.2f} s, "
                     f"max {max(durs):.2f} s")
    chars = [len(u.text) for u in all_utts]
    rates = [len(u.text) / ins.durations_s[u.id] for u in all_utts
             if ins.durations_s.get(u.id, 0.0) > 0]
    text_line = f"text: min {min(chars)}, median {_median(chars):.0f}, max {max(chars)} characters"
    if rates:
        text_line += f"; median {_median(rates):.1f} characters per second"
    lines.append(text_line)
    langs = Counter(u.language for u in all_utts)
    lines.append("languages: " + ", ".join(f"{k} {v}" for k, v in sorted(langs.items())))
    if ins.language_fix is not None:
        fix = ins.language_fix
        lines.append(f"  read with {fix.set_args}: text.languages {cfg.text.languages} reports "
                     f"{fix.n_problems} row(s) for their language; pass it to prepare and train")
    lines.append("")
    lines += _speaker_lines(ins)
    lines.append("")
    lines += histogram_lines(durs)
    lines.append("")
    rates_seen = ", ".join(f"{sr} Hz ({n} clips)" for sr, n in sorted(ins.sample_rates.items()))
    lines.append(f"sample rates: {rates_seen or 'none readable'}")
    target = cfg.audio.sample_rate
    other = {sr: n for sr, n in ins.sample_rates.items() if sr != target}
    if other:
        n_other = sum(other.values())
        if cfg.audio.resample:
            lines.append(f"  note: {n_other} clip(s) not at audio.sample_rate {target} Hz will be "
                         f"resampled when prepared")
        else:
            lines.append(f"  error: {n_other} clip(s) not at audio.sample_rate {target} Hz and "
                         f"audio.resample is false: prepare will reject them")
    multi = sum(n for ch, n in ins.channels.items() if ch > 1)
    if multi:
        lines.append(f"  note: {multi} clip(s) have more than one channel; they are mixed down to mono")
    decoded, failed = ins.decoded
    if decoded:
        lines.append(f"decoded as prepare decodes them: {decoded} clip(s)"
                     + ("" if decoded == len(all_utts) else " (a seeded sample)")
                     + (f", {failed} of them would be skipped (listed below)" if failed
                        else ", all usable"))
    lines.append("")
    lines.append(ins.report.format(max_per_reason) if len(ins.report) else "problems: none")
    return "\n".join(lines)
