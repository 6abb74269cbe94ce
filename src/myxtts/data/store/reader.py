"""Reading a prepared store: :class:`FeatureStore`, one split as memory-mapped arrays.

The format itself (file names, dtypes, manifest) is defined in ``store.format``; see
its docstring for why the store is a few large files rather than one per utterance.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from myxtts.data.store.audio import stores_audio
from myxtts.data.store.format import (
    AUDIO_DTYPE,
    AUDIO_FILE,
    AUDIO_INDEX_DTYPE,
    AUDIO_INDEX_FILE,
    IDS_FILE,
    INDEX_DTYPE,
    INDEX_FILE,
    MANIFEST,
    MEL_DTYPE,
    MEL_FILE,
    MIN_MEL_STD,
    REFS_FILE,
    SPLITS,
    TOKEN_DTYPE,
    TOKENS_FILE,
    VOCAB,
    StoreError,
    config_sections,
    diff_sections,
    read_manifest,
)
from myxtts.data.store.mapped import map_file
from myxtts.outputs import first_bad_name, name_problem

if TYPE_CHECKING:
    from myxtts.config import Config
    from myxtts.text.tokenizer import Tokenizer


class FeatureStore:
    """Read-only view of one split of a prepared store. Cheap to open, O(1) per utterance.

    Index arrays (lengths, ids, offsets) are loaded into memory (a few bytes per
    utterance); the mel, token and (optional) audio files are memory-mapped lazily on
    first access, and a pickled FeatureStore (DataLoader workers with spawn) carries only
    its path and re-maps in the receiving process, so memmaps are never pickled.
    """

    def __init__(self, path: Path, split: str, manifest: dict[str, Any]):
        self.path = Path(path)
        self.split = split
        self.manifest = manifest
        self.n_mels = int(manifest["audio"]["n_mels"])
        self.refs_per_utterance = int(manifest["refs_per_utterance"])
        split_dir = self.path / split
        index_path = split_dir / INDEX_FILE
        try:
            index = np.load(index_path, allow_pickle=False)
            self.ref_table = np.load(split_dir / REFS_FILE, allow_pickle=False)  # [N, R] int32
            ids = json.loads((split_dir / IDS_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise StoreError(f"{split_dir}: cannot read the {split} split ({e}); run "
                             f"`myxtts prepare --verify {self.path}` or rebuild with --force") from e
        if index.dtype != INDEX_DTYPE:
            raise StoreError(f"{index_path}: unexpected index layout {index.dtype}; rebuild the "
                             f"store with `myxtts prepare ... --force`")
        self.index = index
        self.mel_offsets = index["mel_offset"].astype(np.int64)
        self.mel_lengths = index["mel_length"].astype(np.int64)
        self.token_offsets = index["token_offset"].astype(np.int64)
        self.token_lengths = index["token_length"].astype(np.int64)
        self.speaker_ids = index["speaker_id"].astype(np.int64)
        self.language_ids = index["language_id"].astype(np.int64)
        self.durations_s = index["duration_s"].astype(np.float64)
        self.ids: list[str] = list(ids["ids"])
        self.speakers: list[str] = list(ids["speakers"])
        stats = manifest["mel_stats"]
        self.mel_mean = np.asarray(stats["mean"], dtype=np.float32)  # [n_mels]
        self.mel_std = np.asarray(stats["std"], dtype=np.float32)  # [n_mels]
        self.total_frames = int(self.mel_lengths.sum())
        self.total_tokens = int(self.token_lengths.sum())
        if len(self.ids) != len(index) or self.ref_table.shape[0] != len(index):
            raise StoreError(f"{split_dir}: {IDS_FILE}/{REFS_FILE}/{INDEX_FILE} disagree on the "
                             f"number of utterances; rebuild the store with --force")
        bad = first_bad_name(self.ids)
        if bad is not None:  # prepare never writes one: the file was changed by hand
            raise StoreError(f"{split_dir / IDS_FILE}: utterance {bad} "
                             f"{name_problem(self.ids[bad])}, and output files are named after "
                             f"ids; rebuild the store with `myxtts prepare ... --force`")
        self.has_audio = stores_audio(manifest)
        self._load_audio_index()
        self._check_sizes()
        self._mel: np.ndarray | None = None
        self._tokens: np.ndarray | None = None
        self._audio: np.ndarray | None = None
        self._tokenizer: Tokenizer | None = None

    # -- opening

    @classmethod
    def open(cls, path: str | Path, split: str = "train", cfg: Config | None = None) -> FeatureStore:
        """Open ``split`` of the store at ``path``; with ``cfg``, refuse a store whose features
        differ from what the config asks for (naming the keys and the fix)."""
        path = Path(path)
        if split not in SPLITS:
            raise StoreError(f"unknown split {split!r}; a store has {', '.join(SPLITS)}")
        manifest = read_manifest(path)
        if manifest.get("kind") is not None:  # data.xtts_store's: another model's data
            raise StoreError(f"{path} is a store for {manifest['kind']} (prepared with --xtts), "
                             f"not for myxtts's own model; prepare one without --xtts")
        if cfg is not None and manifest.get("feature_hash") != cfg.feature_hash():
            stored = {k: manifest.get(k, {}) for k in ("audio", "text")}
            diffs = diff_sections(stored, config_sections(cfg))
            what = "; ".join(diffs) if diffs else "feature hash differs"
            raise StoreError(
                f"{path} was prepared with other features than this config ({what}); leave "
                f"those settings out (the myxtts commands take a store's own), or prepare "
                f"another store with them: `myxtts prepare DATA --out NEW_STORE`")
        return cls(path, split, manifest)

    def __getstate__(self) -> dict[str, Any]:
        # Never pickle memmaps (or the arrays): the receiving process re-opens by path.
        return {"path": str(self.path), "split": self.split}

    def __setstate__(self, state: dict[str, Any]) -> None:
        path = Path(state["path"])
        self.__init__(path, state["split"], read_manifest(path))

    def _load_audio_index(self) -> None:
        """``audio_index.npy`` of a store with audio (empty arrays without: ``has_audio``
        says which, and ``audio_lengths`` refuses a store without)."""
        self.audio_offsets = self._audio_lengths = np.zeros(0, np.int64)
        self.total_samples = 0
        if not self.has_audio:
            return
        f = self.path / self.split / AUDIO_INDEX_FILE
        try:
            table = np.load(f, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise StoreError(f"{f}: cannot read the audio index ({e}); run `myxtts prepare "
                             f"--verify {self.path}` or rebuild with --force") from e
        if table.dtype != AUDIO_INDEX_DTYPE or table.shape != (len(self.ids), 2):
            raise StoreError(f"{f}: {table.dtype} {tuple(table.shape)}, expected "
                             f"{AUDIO_INDEX_DTYPE} ({len(self.ids)}, 2); rebuild the store with "
                             f"`myxtts prepare ... --audio --force`")
        self.audio_offsets = table[:, 0].astype(np.int64)
        self._audio_lengths = table[:, 1].astype(np.int64)
        self.total_samples = int(self._audio_lengths.sum())

    def _check_sizes(self) -> None:
        split_dir = self.path / self.split
        sizes = [(MEL_FILE, self.total_frames * self.n_mels * MEL_DTYPE.itemsize),
                 (TOKENS_FILE, self.total_tokens * TOKEN_DTYPE.itemsize)]
        if self.has_audio:
            sizes.append((AUDIO_FILE, self.total_samples * AUDIO_DTYPE.itemsize))
        for name, expected in sizes:
            f = split_dir / name
            try:
                size = f.stat().st_size
            except FileNotFoundError:
                raise StoreError(f"{f}: missing; the store is damaged, rebuild it with "
                                 f"`myxtts prepare ... --force`") from None
            if size != expected:
                raise StoreError(f"{f}: {size} bytes but the index needs {expected} (truncated or "
                                 f"damaged); rebuild the store with `myxtts prepare ... --force`")

    # -- lazily mapped arrays

    def _map(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        if int(np.prod(shape)) == 0:  # mmap cannot map an empty file
            return np.zeros(shape, dtype=dtype)
        return map_file(self.path / self.split / name, dtype, shape)

    @property
    def mel_array(self) -> np.ndarray:
        """The whole split's mels, float16 memmap [total_frames, n_mels]."""
        if self._mel is None:
            self._mel = self._map(MEL_FILE, MEL_DTYPE, (self.total_frames, self.n_mels))
        return self._mel

    @property
    def token_array(self) -> np.ndarray:
        """The whole split's tokens, int32 memmap [total_tokens]."""
        if self._tokens is None:
            self._tokens = self._map(TOKENS_FILE, TOKEN_DTYPE, (self.total_tokens,))
        return self._tokens

    @property
    def audio_array(self) -> np.ndarray:
        """The whole split's waveforms, int16 memmap [total_samples] (stores with audio)."""
        self.require_audio()
        if self._audio is None:
            self._audio = self._map(AUDIO_FILE, AUDIO_DTYPE, (self.total_samples,))
        return self._audio

    # -- per-utterance access

    def __len__(self) -> int:
        return len(self.ids)

    def check_statistics(self) -> None:
        """The per-band mel mean/std the model normalises with must be finite, and every std
        at least the floor prepare writes (``MIN_MEL_STD``): NaN statistics would train a
        model of NaNs, and a std of 1e-30 a loss in the thousands, with no other notice.
        The error names the manifest field and band."""
        for key, values in (("mean", self.mel_mean), ("std", self.mel_std)):
            bad = np.flatnonzero(~np.isfinite(values) | ((values < MIN_MEL_STD * 0.999)
                                                          if key == "std" else False))
            if bad.size:
                k = int(bad[0])
                rule = (f"a finite number, at least {MIN_MEL_STD:g} (the floor prepare writes)"
                        if key == "std" else "a finite number")
                raise StoreError(f"{self.path / MANIFEST}: mel_stats.{key} of band {k} is "
                                 f"{float(values[k]):g}, not {rule} ({bad.size} band(s) so): the "
                                 f"manifest was edited or damaged; rebuild the store with "
                                 f"`myxtts prepare ... --force`")

    def mel(self, i: int) -> np.ndarray:
        """float16 [T, n_mels] view into the memmap (zero-copy; do not write to it)."""
        start = int(self.mel_offsets[i])
        return self.mel_array[start:start + int(self.mel_lengths[i])]

    def tokens(self, i: int) -> np.ndarray:
        """int32 [L] view: ``[BOS, <lang>, chars..., EOS]``."""
        start = int(self.token_offsets[i])
        return self.token_array[start:start + int(self.token_lengths[i])]

    def audio(self, i: int) -> np.ndarray:
        """int16 [n_samples] view (zero-copy; do not write to it): utterance ``i``'s waveform
        at ``audio_sample_rate``, exactly the samples ``mel(i)`` was computed from (before
        int16 rounding; divide by 32767 for floats), so ``mel_lengths[i] == 1 + n_samples //
        hop_length`` (even n_fft). A store without audio raises the ``require_audio`` error."""
        array = self.audio_array  # raises first for a store without audio
        start = int(self.audio_offsets[i])
        return array[start:start + int(self._audio_lengths[i])]

    @property
    def audio_lengths(self) -> np.ndarray:
        """int64 [N]: samples per utterance (stores with audio)."""
        self.require_audio()
        return self._audio_lengths

    @property
    def audio_sample_rate(self) -> int:
        """Hz of ``audio(i)``: the store's ``audio.sample_rate``."""
        return int(self.manifest["audio"]["sample_rate"])

    def require_audio(self) -> None:
        """Raise a StoreError naming the store and the fix unless it holds audio (what a
        vocoder trainer calls first, so the user learns it before any model is built)."""
        if not self.has_audio:
            raise StoreError(f"{self.path} has no audio (prepared without --audio); re-run "
                             f"`myxtts prepare DATA --out {self.path} --audio --force` to add it")

    def refs(self, i: int) -> np.ndarray:
        """int64 indices (this split) of utterance ``i``'s reference clips, same speaker."""
        row = self.ref_table[i]
        return row[row >= 0].astype(np.int64)

    # -- metadata

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            # deferred: myxtts.text, ~10 ms of `myxtts --help` (cli.common reads stores)
            from myxtts.text.tokenizer import Tokenizer

            self._tokenizer = Tokenizer.load(self.path / VOCAB)
        return self._tokenizer

    @property
    def languages(self) -> list[str]:
        return list(self.manifest["languages"])

    @property
    def feature_hash(self) -> str:
        return str(self.manifest["feature_hash"])

    @property
    def sections(self) -> dict[str, dict[str, Any]]:
        """The ``audio`` and ``text`` config sections the store was prepared with."""
        return {"audio": self.manifest["audio"], "text": self.manifest["text"]}

    @property
    def hours(self) -> float:
        return float(self.durations_s.sum()) / 3600.0

    def __repr__(self) -> str:
        return (f"FeatureStore({str(self.path)!r}, split={self.split!r}, utterances={len(self)}, "
                f"frames={self.total_frames}, hours={self.hours:.2f})")


def require_audio(store: FeatureStore) -> FeatureStore:
    """``store`` when it holds audio, else the StoreError of ``FeatureStore.require_audio``."""
    store.require_audio()
    return store
