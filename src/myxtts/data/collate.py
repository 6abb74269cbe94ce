"""Batch assembly: per-utterance numpy items -> the padded batch dict the model consumes.

Why preallocate-and-fill: ``torch.tensor`` per item + ``pad_sequence`` allocates and
copies every item twice and creates B tiny tensors; here each batch allocates its
output arrays once (``np.zeros`` is a lazily zeroed calloc) and every item is one slice
assignment, which also converts float16 memmapped mels to float32 on the fly. The
tensors are wrapped with ``torch.from_numpy`` (no copy).

Why pad to the bucket's shape instead of the batch maximum: the sampler promises at
most ``num_buckets`` distinct shapes; padding to a batch's own maximum would make
nearly every batch a new shape (recompiles, allocator churn).

Batch dict (see HELPERS.md): tokens long[B, L], token_lengths long[B],
mel float32[B, T, n_mels], mel_lengths long[B], stop_target float32[B, T],
ref_mel float32[B, R, n_mels], ref_lengths long[B], speaker_ids / language_ids /
indices long[B].
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from myxtts.data.sampler import ShapeTable


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


class Collator:
    """Picklable ``collate_fn`` (lives in loader workers).

    ``shape_table``: pads each batch to its bucket's ``(T, L)``; ``None`` pads to the
    batch's own maxima rounded up to ``pad_multiple`` (mel) and 8 (text) -- for
    evaluation or on-the-fly data without a bucketed sampler.
    ``ref_frames``: reference mels are zero-padded to this; longer ones are cropped to
    their first ``ref_frames`` frames (a reference is a crop anyway).
    """

    def __init__(self, shape_table: ShapeTable | None, n_mels: int, ref_frames: int,
                 pad_multiple: int = 8) -> None:
        if n_mels < 1 or ref_frames < 1 or pad_multiple < 1:
            raise ValueError(f"n_mels, ref_frames and pad_multiple must be >= 1, got {n_mels}, "
                             f"{ref_frames}, {pad_multiple}")
        self.shape_table = shape_table
        self.n_mels = int(n_mels)
        self.ref_frames = int(ref_frames)
        self.pad_multiple = int(pad_multiple)

    def padded_shape(self, max_mel_frames: int, max_tokens: int) -> tuple[int, int]:
        """``(T, L)`` a batch with these maxima is padded to."""
        if self.shape_table is None:
            return _round_up(max(max_mel_frames, 1), self.pad_multiple), _round_up(max(max_tokens, 1), 8)
        n_frames, n_tokens = self.shape_table.shape_for(max_mel_frames)
        if max_tokens > n_tokens:
            raise ValueError(
                f"a batch has {max_tokens} text tokens but its bucket caps text at {n_tokens}; the "
                f"sampler was built from other text lengths than the dataset serves (stale store?) "
                f"-- rebuild the sampler from the store's lengths")
        return n_frames, n_tokens

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if not items:
            raise ValueError("Collator got an empty batch")
        batch = len(items)
        mel_lens = np.fromiter((it["mel"].shape[0] for it in items), np.int64, batch)
        tok_lens = np.fromiter((len(it["tokens"]) for it in items), np.int64, batch)
        n_frames, n_tokens = self.padded_shape(int(mel_lens.max()), int(tok_lens.max()))
        n_mels, n_ref = self.n_mels, self.ref_frames

        tokens = np.zeros((batch, n_tokens), np.int64)  # PAD = 0
        mel = np.zeros((batch, n_frames, n_mels), np.float32)
        stop = np.zeros((batch, n_frames), np.float32)
        ref = np.zeros((batch, n_ref, n_mels), np.float32)
        ref_lens = np.empty(batch, np.int64)
        speakers = np.empty(batch, np.int64)
        languages = np.empty(batch, np.int64)
        indices = np.empty(batch, np.int64)
        for i, it in enumerate(items):
            m = it["mel"]  # [T_i, n_mels], float16 or float32
            r = it["ref_mel"]  # [R_i, n_mels]
            if m.ndim != 2 or m.shape[1] != n_mels or r.ndim != 2 or r.shape[1] != n_mels:
                raise ValueError(
                    f"utterance {it.get('index')}: mel {tuple(m.shape)} / ref_mel {tuple(r.shape)} "
                    f"must be [frames, {n_mels}] (audio.n_mels); re-run prepare if the config changed")
            n, t = int(mel_lens[i]), int(tok_lens[i])
            tokens[i, :t] = it["tokens"]
            mel[i, :n] = m  # casts float16 -> float32 while copying
            stop[i, max(n - 1, 0):] = 1.0  # last real frame and all padding after it
            k = min(r.shape[0], n_ref)
            ref[i, :k] = r[:k]
            ref_lens[i] = k
            speakers[i] = it["speaker_id"]
            languages[i] = it["language_id"]
            indices[i] = it["index"]
        return {
            "tokens": torch.from_numpy(tokens),
            "token_lengths": torch.from_numpy(tok_lens),
            "mel": torch.from_numpy(mel),
            "mel_lengths": torch.from_numpy(mel_lens),
            "stop_target": torch.from_numpy(stop),
            "ref_mel": torch.from_numpy(ref),
            "ref_lengths": torch.from_numpy(ref_lens),
            "speaker_ids": torch.from_numpy(speakers),
            "language_ids": torch.from_numpy(languages),
            "indices": torch.from_numpy(indices),
        }
