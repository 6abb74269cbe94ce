"""``myxtts prepare --verify`` of an XTTS store: beyond the file table (sizes, sha256, which
``data.store.verify`` checks for every store), the invariants training relies on."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from myxtts.data.store.format import SPLITS, StoreError
from myxtts.data.xtts_store.reader import XttsStore

N_CODES = 1024  # the DVAE's codebook (codes the GPT predicts)


def xtts_problems(root: str | Path) -> list[str]:
    """Every problem of the XTTS store at ``root`` past its file table: offsets contiguous,
    lengths positive, ids in range, tokens inside the vocabulary, codes inside the codebook,
    the split counts the manifest records."""
    out: list[str] = []
    for split in SPLITS:
        try:
            store = XttsStore.open(root, split)
        except StoreError as e:
            out.append(str(e))
            continue
        where = f"{store.root / split}"
        recorded = store.manifest.get("splits", {}).get(split, {}).get("utterances")
        if recorded != len(store):
            out.append(f"{where}: {len(store)} utterances but the manifest says {recorded}")
        for name, offsets, lengths in (("token", store.token_offsets, store.text_lengths),
                                       ("code", store.code_offsets, store.code_lengths),
                                       ("audio", store.audio_offsets, store.audio_lengths)):
            if len(lengths) and (lengths <= 0).any():
                out.append(f"{where}: {int((lengths <= 0).sum())} utterances with no {name}s")
            if len(lengths) and not np.array_equal(offsets, np.cumsum(lengths) - lengths):
                out.append(f"{where}: {name}_offset not contiguous from 0")
        for name, ids, limit in (("speaker_id", store.speaker_ids, len(store.speakers)),
                                 ("language_id", store.language_ids, len(store.languages))):
            if len(ids) and ((ids < 0) | (ids >= limit)).any():
                out.append(f"{where}: {name} outside [0, {limit})")
        n_tokens = int(store.identity["number_text_tokens"])
        for name, limit, values in (("token", n_tokens, store.token_array),
                                    ("code", N_CODES, store.code_array)):
            if len(values) and (int(values.min()) < 0 or int(values.max()) >= limit):
                out.append(f"{where}: {name} ids outside [0, {limit})")
    return out
