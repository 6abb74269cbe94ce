"""Dataset readers: turn a folder (or manifest file) into train/val ``Utterance`` lists.

One module per layout (``common_voice``, ``libritts``, ``ljspeech``, ``manifest``,
``speakers``; ``data.format``, ``auto`` detects them in that order), the shared pieces in
``common``; this module detects the layout, reads the parts, removes duplicate ids and makes
the split: the release's own (Common Voice, LibriTTS), ``train/`` + ``val/`` folders or
``train.<ext>`` + ``val.<ext>`` manifests, else a seeded, speaker-stratified one
(``split_train_val``). ``languages`` finds the ``text.languages`` setting that would fix
every language problem. The layouts are described in docs/data-and-store.md. Readers never
open audio (headers are inspect's and prepare's job), so reading takes well under a second
even for large corpora; a broken row becomes a ``Problem`` and reading goes on.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from myxtts.config import Config
from myxtts.data.prepare.readers.common import (
    LAYOUTS_HINT,
    MANIFEST_EXTS,
    Row,
    check_ids,
    check_transcripts,
)
from myxtts.data.prepare.readers.common_voice import (
    declared_languages as declared_common_voice,
)
from myxtts.data.prepare.readers.common_voice import (
    is_common_voice,
    read_common_voice,
    release_parts,
)
from myxtts.data.prepare.readers.languages import find_language_fix
from myxtts.data.prepare.readers.libritts import is_libritts, libritts_parts, read_libritts_subset
from myxtts.data.prepare.readers.ljspeech import is_ljspeech_csv, read_ljspeech
from myxtts.data.prepare.readers.manifest import manifests_in, read_manifest
from myxtts.data.prepare.readers.speakers import read_speakers, speaker_dirs, vctk_dirs
from myxtts.data.prepare.records import DUPLICATE_ID, DataReport, DatasetError, Utterance
from myxtts.data.store.format import MANIFEST as STORE_MANIFEST
from myxtts.data.store.format import MEL_FILE, SPLITS
from myxtts.system import path_kind


@dataclass
class DatasetSplits:
    """Result of ``read_dataset``. ``split`` says where the split came from:
    ``folders`` (train/ + val/), ``files`` (train.<ext> + val.<ext>), ``release`` (a
    downloaded corpus' own split), ``release-seeded`` (its train part, split seeded),
    ``seeded``."""

    train: list[Utterance]
    val: list[Utterance]
    report: DataReport
    format: str
    root: Path | None = None
    split: str = "seeded"
    note: str = ""  # which of a release's files were read and which left out
    origins: dict[str, tuple[str, int | None]] = field(default_factory=dict)  # id -> row's file, line

    @property
    def all(self) -> list[Utterance]:
        return self.train + self.val

    @property
    def speakers(self) -> list[str]:
        return sorted({u.speaker for u in self.all})


# ---------------------------------------------------------------- entry point

# A Common Voice release is one language's folder (with a few rows of others at most): more
# locales than this are no release's, and are not turned into that many language tokens.
MAX_DECLARED_LANGUAGES = 8


@dataclass(frozen=True)
class DeclaredLanguages:
    """The ``text.languages`` / ``text.default_language`` a downloaded corpus declares for
    its rows, and who declares them (for the line that says so)."""

    languages: tuple[str, ...]
    default_language: str
    source: str


def declared_languages(path: str | Path, cfg: Config) -> DeclaredLanguages | None:
    """The languages a corpus as downloaded declares (a Common Voice release: its rows'
    ``locale``), ordered as ``cfg`` lists them, then as they appear; the default stays
    ``cfg``'s when declared, else the first. None for a layout that declares none, or
    when they are ``cfg``'s already. Commands read a raw dataset under this setting when
    the user's config does not set ``text.languages`` itself (``cli.common``): a release
    of Persian and English rows then trains both, with no ``--set``."""
    path = Path(path).expanduser()
    try:
        if not _is(path, cfg.data.format, "common_voice", is_common_voice):
            return None
        found = declared_common_voice(path)
    except (DatasetError, OSError):
        return None  # reading the dataset says what is wrong with it
    if not found or len(found) > MAX_DECLARED_LANGUAGES:
        return None  # more than a release holds: each row is reported, with the setting
    languages = [x for x in cfg.text.languages if x in found]
    languages += [x for x in found if x not in languages]
    default = cfg.text.default_language if cfg.text.default_language in languages else languages[0]
    if languages == list(cfg.text.languages) and default == cfg.text.default_language:
        return None
    return DeclaredLanguages(tuple(languages), default,
                             f"the Common Voice release {path} (its locale column)")


def read_dataset(path: str | Path, cfg: Config) -> DatasetSplits:
    """Read a dataset in any supported layout; see the module docstring. When rows are
    reported for their language, ``report.language_fix`` holds the ``text.languages`` /
    ``text.default_language`` that would fix them all, if one does."""
    path = Path(path).expanduser()
    kind = path_kind(path)
    if kind == "nothing":
        raise DatasetError(f"dataset path {path} does not exist; {LAYOUTS_HINT}")
    if kind not in ("a file", "a folder"):  # never opened: reading a FIFO blocks
        raise DatasetError(f"dataset path {path} is {kind}, not a dataset folder or manifest "
                           f"file; {LAYOUTS_HINT}")
    if kind == "a folder" and any((path / split / MEL_FILE).is_file() for split in SPLITS):
        raise DatasetError(f"{path}: a feature store without its {STORE_MANIFEST} (copied or "
                           f"moved in part?); copy the whole store folder, or prepare the "
                           f"dataset again (`myxtts prepare DATA --out NEW_STORE`)")
    splits, empty_at = _read(path, cfg)
    report = splits.report
    report.language_fix = find_language_fix(cfg, report, lambda c: _read(path, c))
    if empty_at is not None:
        _raise_empty(empty_at, report)
    return splits


def _read(path: Path, cfg: Config) -> tuple[DatasetSplits, Path | None]:
    """The dataset's splits, and the path to name when nothing usable was found (else None)."""
    forced = cfg.data.format
    report = DataReport()
    default_speaker = _dataset_name(path)
    note = ""
    val_rows: list[Row] | None = None  # None: no val part, split train seeded
    if _is(path, forced, "common_voice", is_common_voice):
        release = release_parts(path)
        fmt, split_kind, where, note = "common_voice", "release", release.train, release.note
        rows = read_common_voice(release.train, path, cfg, report, default_speaker)
        if release.val is not None:
            val_rows = read_common_voice(release.val, path, cfg, report, default_speaker)
    elif _is(path, forced, "libritts", is_libritts):
        train_dirs, val_dirs, note = libritts_parts(path, report)
        fmt, split_kind, where = "libritts", "release", path
        rows = [r for d in train_dirs for r in read_libritts_subset(d, cfg, report)]
        if val_dirs:
            val_rows = [r for d in val_dirs for r in read_libritts_subset(d, cfg, report)]
    elif (parts := _split_parts(path, forced)) is not None:
        split_kind, where, val_path = parts
        fmt, rows = _read_part(where, forced, cfg, report, default_speaker)
        if val_path is not None:
            val_rows = _read_part(val_path, fmt, cfg, report, default_speaker)[1]
    else:
        split_kind, where = "seeded", path
        fmt, rows = _read_part(path, forced, cfg, report, default_speaker)
    train_rows, checked_val = _dedupe(check_ids(rows, report), check_ids(val_rows or [], report),
                                      report)
    train_rows = check_transcripts(train_rows, cfg.text, report)
    checked_val = check_transcripts(checked_val, cfg.text, report)
    origins = {u.id: (source, line) for u, source, line in train_rows + checked_val}
    train = [r[0] for r in train_rows]
    val = [r[0] for r in checked_val]
    if val_rows is None:  # no val part: split like an unsplit dataset
        train, val = split_train_val(train, cfg.data.val_fraction, cfg.data.min_val_utterances,
                                     cfg.data.split_seed)
        split_kind = "seeded" if split_kind != "release" else "release-seeded"
    splits = DatasetSplits(train, val, report, fmt, path, split_kind, note, origins)
    return splits, (where if not train else None)


def _is(path: Path, forced: str, fmt: str, detect) -> bool:
    """Whether ``path`` is read as ``fmt`` (forced, or detected under data.format=auto)."""
    if forced == fmt:
        if not detect(path):
            raise DatasetError(f"{path}: not a {_LAYOUT_NAMES[fmt]} folder (data.format={fmt} "
                               f"expects {_LAYOUT_SHAPES[fmt]})")
        return True
    return forced == "auto" and detect(path)


_LAYOUT_NAMES = {"common_voice": "Common Voice", "libritts": "LibriTTS"}
_LAYOUT_SHAPES = {
    "common_voice": "clips/ and train.tsv or validated.tsv with path and sentence columns",
    "libritts": "train-*/dev-* subsets of SPEAKER/CHAPTER/ID.wav with ID.normalized.txt",
}


def split_train_val(utterances: list[Utterance], val_fraction: float, min_val_utterances: int,
                    seed: int) -> tuple[list[Utterance], list[Utterance]]:
    """Deterministic, speaker-stratified train/val split.

    Size: ``max(round(val_fraction * N), min_val_utterances)`` validation utterances, but
    never more than half the dataset, and only taken from speakers with >= 2 utterances,
    each of which keeps at least one in train (every validation speaker is also a training
    speaker, so cloning from a train reference makes sense). ``val_fraction == 0`` gives
    no validation set. Speakers get shares proportional to their size (largest remainder).

    Which utterances: per speaker, its ids sorted then shuffled by ``Random(f"{seed}:{speaker}")``
    and the first ones taken. The split therefore depends only on the set of ids and the
    seed, not on file order, and adding one speaker does not reshuffle the others.
    Both lists keep the input order.
    """
    n = len(utterances)
    if val_fraction <= 0 or n < 2:
        return list(utterances), []
    by_speaker: dict[str, list[str]] = {}
    for u in utterances:
        by_speaker.setdefault(u.speaker, []).append(u.id)
    eligible = {s: ids for s, ids in by_speaker.items() if len(ids) >= 2}
    capacity = sum(len(ids) - 1 for ids in eligible.values())
    n_val = min(max(round(val_fraction * n), min_val_utterances), n // 2, capacity)
    if n_val <= 0:
        return list(utterances), []
    total = sum(len(ids) for ids in eligible.values())
    quota: dict[str, int] = {}
    remainders: list[tuple[float, str]] = []
    for s in sorted(eligible):
        exact = n_val * len(eligible[s]) / total
        quota[s] = min(int(exact), len(eligible[s]) - 1)
        remainders.append((-(exact - int(exact)), s))
    order = [s for _, s in sorted(remainders)]
    left = n_val - sum(quota.values())
    while left > 0:  # terminates: n_val <= capacity
        for s in order:
            if left and quota[s] < len(eligible[s]) - 1:
                quota[s] += 1
                left -= 1
    val_ids: set[str] = set()
    for s in sorted(eligible):
        ids = sorted(eligible[s])
        random.Random(f"{seed}:{s}").shuffle(ids)
        val_ids.update(ids[: quota[s]])
    train = [u for u in utterances if u.id not in val_ids]
    val = [u for u in utterances if u.id in val_ids]
    return train, val


# ---------------------------------------------------------------- layout detection

def _dataset_name(path: Path) -> str:
    """Default speaker name: the dataset folder's name (the manifest's folder for a file)."""
    p = path.resolve()
    if p.is_file():
        p = p.parent
    return p.name or "speaker"


def _split_parts(path: Path, forced: str) -> tuple[str, Path, Path | None] | None:
    """``(kind, train, val|None)`` when the dataset is pre-split, else None."""
    if not path.is_dir():
        return None
    if (path / "train").is_dir() and not (path / "metadata.csv").is_file():
        val = path / "val"
        return "folders", path / "train", (val if val.is_dir() else None)
    if forced in ("auto", "manifest"):
        for ext in MANIFEST_EXTS:
            train = path / f"train{ext}"
            if train.is_file():
                val = path / f"val{ext}"
                return "files", train, (val if val.is_file() else None)
    return None


def _detect(path: Path, forced: str) -> str:
    """Which reader handles ``path`` (raises DatasetError when none does)."""
    if path.is_file():
        if path.suffix.lower() not in MANIFEST_EXTS:
            raise DatasetError(f"{path} is not a dataset folder or a .csv/.tsv/.jsonl manifest; {LAYOUTS_HINT}")
        if forced == "speakers":
            raise DatasetError(f"{path} is a file but data.format=speakers expects a folder of speaker folders")
        if forced == "ljspeech" or (forced == "auto" and path.suffix.lower() == ".csv"
                                    and is_ljspeech_csv(path)):
            return "ljspeech"
        return "manifest"
    has_meta = (path / "metadata.csv").is_file()
    if forced == "ljspeech":
        if not has_meta:
            raise DatasetError(f"{path}: no metadata.csv (data.format=ljspeech expects metadata.csv "
                               f"with id|text[|normalized[|speaker[|language]]] rows and wavs/ID.wav)")
        return "ljspeech"
    if forced == "manifest":
        if not manifests_in(path):
            raise DatasetError(f"{path}: no .csv/.tsv/.jsonl manifest (data.format=manifest expects "
                               f"one with audio and text columns)")
        return "manifest"
    if forced == "speakers":
        if not (vctk_dirs(path) or speaker_dirs(path)):
            raise DatasetError(f"{path}: no speaker folders with audio (data.format=speakers expects "
                               f"SPEAKER/*.wav with transcripts, or VCTK's txt/ + wav48*/)")
        return "speakers"
    if has_meta and is_ljspeech_csv(path / "metadata.csv"):
        return "ljspeech"
    if manifests_in(path):
        return "manifest"
    if vctk_dirs(path) or speaker_dirs(path):
        return "speakers"
    raise DatasetError(f"{path}: no recognised dataset metadata; {LAYOUTS_HINT}")


def _read_part(path: Path, fmt: str, cfg: Config, report: DataReport,
               default_speaker: str) -> tuple[str, list[Row]]:
    fmt = _detect(path, fmt)
    if fmt == "ljspeech":
        root = path.parent if path.is_file() else path
        meta = path if path.is_file() else root / "metadata.csv"
        return fmt, read_ljspeech(meta, root, cfg, report, default_speaker)
    if fmt == "manifest":
        if path.is_dir():
            found = manifests_in(path)
            if len(found) > 1:
                names = ", ".join(p.name for p in found)
                raise DatasetError(f"{path}: several manifests ({names}); pass the one to use as the "
                                   f"dataset path, or name them train.<ext> and val.<ext>")
            path = found[0]
        return fmt, read_manifest(path, cfg, report, default_speaker)
    return fmt, read_speakers(path, cfg, report)


def _dedupe(train: list[Row], val: list[Row], report: DataReport) -> tuple[list[Row], list[Row]]:
    """Keep the first utterance of each id (train before val); report the others."""
    seen: dict[str, str] = {}
    out: tuple[list[Row], list[Row]] = ([], [])
    for k, rows in enumerate((train, val)):
        for utt, source, line in rows:
            where = f"{source}:{line}" if line is not None else source
            if utt.id in seen:
                report.add(source, line, utt.id, DUPLICATE_ID,
                           "give every utterance a unique id (rename or delete one of them)",
                           f"id {utt.id!r} already used at {seen[utt.id]}; this one is skipped")
                continue
            seen[utt.id] = where
            out[k].append((utt, source, line))
    return out


def _raise_empty(path: Path, report: DataReport) -> None:
    if report.language_fix is not None:
        fix = report.language_fix
        raise DatasetError(f"{path}: no usable utterances under text.languages; "
                           f"{fix.line()}", report)
    if len(report):
        first = report.problems[0].format()
        raise DatasetError(f"{path}: no usable utterances, all {len(report)} problem(s) must be fixed "
                           f"(first: {first})", report)
    raise DatasetError(f"{path}: no utterances found; {LAYOUTS_HINT}", report)
