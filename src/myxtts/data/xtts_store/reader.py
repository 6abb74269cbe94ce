"""Reading an XTTS store: :class:`XttsStore`, one split as memory-mapped arrays.

Cheap to open (the index and ids are loaded, a few bytes per utterance), O(1) per
utterance (a slice of a memmap), and safe to hand to loader workers: a pickled store
carries only its path and split and maps its files again where it lands.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from myxtts.data.store.format import (
    AUDIO_DTYPE,
    AUDIO_FILE,
    AUDIO_SCALE,
    CODES_FILE,
    IDS_FILE,
    INDEX_FILE,
    SPLITS,
    TOKEN_DTYPE,
    TOKENS_FILE,
    VOCAB,
    StoreError,
)
from myxtts.data.store.mapped import map_file
from myxtts.data.xtts_store.format import CODE_DTYPE, INDEX_DTYPE, read_xtts_manifest

_REBUILD = "rebuild it with `myxtts prepare DATA --out STORE --xtts XTTS_DIR --force`"


class XttsStore:
    """Read-only view of one split of an XTTS store (``format``'s module doc)."""

    def __init__(self, root: Path, split: str, manifest: dict[str, Any]) -> None:
        self.root, self.split, self.manifest = Path(root), split, manifest
        folder = self.root / split
        try:
            index = np.load(folder / INDEX_FILE, allow_pickle=False)
            names = json.loads((folder / IDS_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise StoreError(f"{folder}: cannot read the {split} split ({e}); {_REBUILD}") from e
        if index.dtype != INDEX_DTYPE or index.ndim != 1:
            raise StoreError(f"{folder / INDEX_FILE}: unexpected index layout {index.dtype}; "
                             f"{_REBUILD}")
        self.ids: list[str] = list(names["ids"])
        self.speakers: list[str] = list(names["speakers"])
        if len(self.ids) != len(index):
            raise StoreError(f"{folder}: {IDS_FILE} and {INDEX_FILE} disagree on the number of "
                             f"utterances; {_REBUILD}")
        col = {name: index[name].astype(np.int64) for name in INDEX_DTYPE.names}
        self.token_offsets, self.text_lengths = col["token_offset"], col["token_length"]
        self.code_offsets, self.code_lengths = col["code_offset"], col["code_length"]
        self.audio_offsets, self.audio_lengths = col["audio_offset"], col["audio_length"]
        self.speaker_ids, self.language_ids = col["speaker_id"], col["language_id"]
        self._sizes = {TOKENS_FILE: (TOKEN_DTYPE, int(self.text_lengths.sum())),
                       CODES_FILE: (CODE_DTYPE, int(self.code_lengths.sum())),
                       AUDIO_FILE: (AUDIO_DTYPE, int(self.audio_lengths.sum()))}
        for name, (dtype, count) in self._sizes.items():
            f = folder / name
            size = f.stat().st_size if f.is_file() else None
            if size != count * dtype.itemsize:
                what = "missing" if size is None else f"{size} bytes, the index needs " \
                                                      f"{count * dtype.itemsize}"
                raise StoreError(f"{f}: {what} (damaged); {_REBUILD}")
        self._maps: dict[str, np.ndarray] = {}

    @classmethod
    def open(cls, root: str | Path, split: str = "train") -> XttsStore:
        """``split`` of the XTTS store at ``root``; a one-line StoreError when it is missing,
        interrupted, damaged or not an XTTS store."""
        if split not in SPLITS:
            raise StoreError(f"unknown split {split!r}; a store has {', '.join(SPLITS)}")
        return cls(Path(root), split, read_xtts_manifest(root))

    @staticmethod
    def vocab_path(root: str | Path) -> Path:
        """The ``vocab.json`` the store's tokens were made with (grown where the data has a
        language the model lacks): the vocabulary to train and speak with."""
        return Path(root) / VOCAB

    def __getstate__(self) -> dict[str, Any]:
        return {"root": str(self.root), "split": self.split}  # never the memmaps

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(Path(state["root"]), state["split"], read_xtts_manifest(state["root"]))

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def identity(self) -> dict[str, Any]:
        """The hashes of the base and the store's vocabulary, of ``dvae.pth`` and
        ``mel_stats.pth``, the languages and the model's ``number_text_tokens``."""
        return dict(self.manifest["identity"])

    @property
    def languages(self) -> list[str]:
        """The store's languages; ``language_ids`` index this list."""
        return list(self.manifest["identity"]["languages"])

    def _array(self, name: str) -> np.ndarray:
        if name not in self._maps:
            dtype, count = self._sizes[name]
            self._maps[name] = (np.zeros(0, dtype) if count == 0 else
                                map_file(self.root / self.split / name, dtype, (count,)))
        return self._maps[name]

    @property
    def token_array(self) -> np.ndarray:
        """The split's text ids back to back, int32 memmap (``text(i)`` slices it)."""
        return self._array(TOKENS_FILE)

    @property
    def code_array(self) -> np.ndarray:
        """The split's codes back to back, int16 memmap (``codes(i)`` slices it)."""
        return self._array(CODES_FILE)

    def text(self, i: int) -> np.ndarray:
        """int64 XTTS text ids of utterance ``i``: the language token, then the text (no
        [START]/[STOP])."""
        start = int(self.token_offsets[i])
        return self._array(TOKENS_FILE)[start:start + int(self.text_lengths[i])].astype(np.int64)

    def codes(self, i: int) -> np.ndarray:
        """int64 DVAE codes of utterance ``i``'s clip alone (``ceil(frames / 4)``)."""
        start = int(self.code_offsets[i])
        return self._array(CODES_FILE)[start:start + int(self.code_lengths[i])].astype(np.int64)

    def audio(self, i: int) -> np.ndarray:
        """float32 samples of utterance ``i`` at 22050 Hz (stored as int16)."""
        start = int(self.audio_offsets[i])
        raw = self._array(AUDIO_FILE)[start:start + int(self.audio_lengths[i])]
        return raw.astype(np.float32) / np.float32(AUDIO_SCALE)

    def __repr__(self) -> str:
        return f"XttsStore({str(self.root)!r}, split={self.split!r}, utterances={len(self)})"
