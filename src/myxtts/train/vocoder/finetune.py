"""Fine-tuning the vocoder on a TTS model's own mels (``vocoder.tts_checkpoint``).

Why: a vocoder trained on ground-truth mels meets slightly different mels at synthesis
(smoother, a little off in level); XTTS-style decoders are therefore fine-tuned on the
acoustic model's *teacher-forced* output, which is frame-aligned with the recorded audio
(the model is fed the true previous frames, so frame j still belongs to sample j * hop).
Here the TTS model predicts every training utterance once (postnet output, raw log-mel,
no prenet dropout) into a float16 array laid out like the store's ``mel.f16``, cached in
the vocoder run folder and keyed by the TTS checkpoint and the store, so a resumed run
reuses it. ``train.vocoder.data.SegmentBatches`` then reads segments from it instead of
the store's mels, against the same audio.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.artifacts.runs import resolve_checkpoint
from myxtts.artifacts.vocoder import mel_hash
from myxtts.config import config_from_dict
from myxtts.data.feed.dataset import StoreBatches
from myxtts.data.store import FeatureStore
from myxtts.model.xtts import build_model
from myxtts.system import atomic_write
from myxtts.train.errors import TrainError

log = logging.getLogger(__name__)
BATCH = 16


def _key(tts_file: Path, store: FeatureStore) -> str:
    stat = tts_file.stat()
    blob = json.dumps([str(tts_file.resolve()), stat.st_size, stat.st_mtime_ns,
                       str(store.path.resolve()), store.split, store.feature_hash,
                       int(store.total_frames)])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def teacher_forced_mels(tts_path: str | Path, store: FeatureStore, cache_dir: Path,
                        device: torch.device) -> np.ndarray:
    """float16 [total_frames, n_mels] memmap: the TTS model's teacher-forced log-mels of every
    utterance of ``store``, indexed like ``store.mel_array``."""
    tts_file = resolve_checkpoint(tts_path)
    state = ck.load(tts_file)
    if state.get("kind") == "vocoder":
        raise TrainError(f"vocoder.tts_checkpoint={tts_path} is a vocoder run; name a TTS run")
    cfg = config_from_dict(state[ck.CONFIG])
    if mel_hash(cfg.audio) != mel_hash(store.manifest["audio"]):
        raise TrainError(f"TTS checkpoint {tts_file} uses another mel definition than the store "
                         f"{store.path}; fine-tune on a store prepared with the TTS run's config")
    if state[ck.VOCAB] != store.tokenizer.to_dict():
        raise TrainError(f"TTS checkpoint {tts_file} was trained with another vocabulary than the "
                         f"store {store.path}; fine-tune on the store the TTS model trained on")
    key = _key(tts_file, store)
    path = cache_dir / f"tts_mels_{store.split}_{key}.f16"
    shape = (int(store.total_frames), store.n_mels)
    if path.is_file() and path.stat().st_size == shape[0] * shape[1] * 2:
        return np.memmap(path, dtype=np.float16, mode="r", shape=shape)
    log.info("computing the TTS model's teacher-forced mels of %d utterances (once)", len(store))
    model = build_model(cfg, store.tokenizer.vocab_size, len(store.languages),
                        state[ck.MEL_MEAN], state[ck.MEL_STD])
    model.load_state_dict(state[ck.MODEL])
    model = model.to(device).eval()
    out = np.empty(shape, np.float16)
    batches = StoreBatches(store, None, cfg.data.ref_frames, seed=0)  # padded to each batch
    order = np.argsort(store.mel_lengths, kind="stable")  # similar lengths: little padding
    with torch.inference_mode():
        for a in range(0, len(order), BATCH):
            idx = order[a:a + BATCH].tolist()
            batch = {k: v.to(device) for k, v in batches.batch(0, idx).items()}
            pred = model(batch, prenet_dropout=False)["mel_post"]  # [B, T, n] normalised
            mel = model.denormalize(pred).float().cpu().numpy()
            for j, i in enumerate(idx):
                off, n = int(store.mel_offsets[i]), int(store.mel_lengths[i])
                out[off:off + n] = mel[j, :n]
    cache_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(path, out.tobytes())
    return np.memmap(path, dtype=np.float16, mode="r", shape=shape)
