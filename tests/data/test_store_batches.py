"""The store loader's batches against a straightforward construction from the store: per
utterance its frames, tokens, ids and the (seed, epoch, index)-hashed reference crop, padded
into zeroed tensors one field at a time. Every field, dtype and shape; reused batch buffers
(pooled once the consumer drops a batch) and batches a consumer keeps alike."""

import numpy as np
import pytest
import torch

from myxtts.config import load_config
from myxtts.data.batch import FIELDS
from myxtts.data.feed.dataset import mix64, mix64_many
from myxtts.data.feed.loader import build_loader
from myxtts.data.store import FeatureStore


def reference(store: FeatureStore, indices: list[int], epoch: int, seed: int, ref_frames: int,
              frames: int, text: int, half: bool) -> dict[str, torch.Tensor]:
    """The batch of ``indices`` padded to (``frames``, ``text``), built the obvious way."""
    b, m = len(indices), store.n_mels
    mel_dtype = torch.float16 if half else torch.float32
    out = {"tokens": torch.zeros(b, text, dtype=torch.int64),
           "mel": torch.zeros(b, frames, m, dtype=mel_dtype),
           "ref_mel": torch.zeros(b, ref_frames, m, dtype=mel_dtype),
           "stop_target": torch.zeros(b, frames)}
    for k in ("token_lengths", "mel_lengths", "ref_lengths", "speaker_ids", "language_ids",
              "indices"):
        out[k] = torch.zeros(b, dtype=torch.int64)
    for j, i in enumerate(indices):
        tokens = torch.from_numpy(store.tokens(i).astype(np.int64))
        mel = torch.from_numpy(store.mel(i).astype(np.float32)).to(mel_dtype)
        h = mix64(seed, epoch, i)
        refs = [r for r in store.ref_table[i].tolist() if r >= 0]
        ref = store.mel(refs[h % len(refs)])
        start = (h >> 32) % (len(ref) - ref_frames + 1) if len(ref) > ref_frames else 0
        crop = torch.from_numpy(ref[start:start + ref_frames].astype(np.float32)).to(mel_dtype)
        out["tokens"][j, :len(tokens)] = tokens
        out["mel"][j, :len(mel)] = mel
        out["ref_mel"][j, :len(crop)] = crop
        out["stop_target"][j, max(len(mel) - 1, 0):] = 1.0
        out["token_lengths"][j], out["mel_lengths"][j] = len(tokens), len(mel)
        out["ref_lengths"][j], out["indices"][j] = len(crop), i
        out["speaker_ids"][j] = int(store.speaker_ids[i])
        out["language_ids"][j] = int(store.language_ids[i])
    return out


def check(batch, store, indices, epoch, cfg, half=False):
    b, frames = batch["stop_target"].shape
    want = reference(store, indices, epoch, cfg.data.shuffle_seed, cfg.data.ref_frames, frames,
                     batch["tokens"].shape[1], half)
    assert set(batch) == set(FIELDS) == set(want)
    for k, t in want.items():
        assert batch[k].dtype == t.dtype and batch[k].shape == t.shape, k
        assert torch.equal(batch[k], t), k


@pytest.mark.parametrize("workers,device", [(0, None), (2, None), (0, "cuda")])
def test_batches_equal_the_reference_whether_kept_or_dropped(store_path, workers, device):
    cfg = load_config(overrides=["data.batch_frames=2000", "data.ref_frames=48"])
    store = FeatureStore.open(store_path)
    loader, sampler = build_loader(store_path, cfg, num_workers=workers, device=device)
    plan = [sampler.batches(e) for e in range(3)]
    for epoch in range(3):  # dropped at once: buffers are reused, their padding rewritten
        for batch, indices in zip(loader, plan[epoch], strict=True):
            check(batch, store, indices, epoch, cfg, half=device == "cuda")
    kept = [b for _ in range(3) for b in loader]  # kept: no buffer may be reused under them
    for batch, (epoch, indices) in zip(kept, [(e, b) for e in range(3, 6)
                                             for b in sampler.batches(e)], strict=True):
        check(batch, store, indices, epoch, cfg, half=device == "cuda")


def test_vectorised_hash_equals_mix64():
    idx = np.array([0, 1, 7, 2**31, 2**40 + 3, 2**62], np.int64)
    for seed, epoch in [(0, 0), (1234, 5), (-1, 2**40), (2**63 - 1, 3)]:
        assert mix64_many(seed, epoch, idx).tolist() == [mix64(seed, epoch, int(i)) for i in idx]
