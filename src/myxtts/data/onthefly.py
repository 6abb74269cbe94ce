"""On-the-fly loading: the store's batches straight from raw audio, without ``prepare``.

Split of the work, and why:

* Loader workers (CPU processes) read, resample and trim the clips and the reference
  clips, and pad them into wav batches. With ``data.data_device='cpu'`` they also compute
  the batch's log-mels (``data.features.Featurizer``: clip by clip at each clip's length, one
  thread per worker), so feature extraction runs in parallel and the main process only
  receives finished batches. With ``'cuda:N'`` the mels are computed on that GPU by the
  data role's own thread and stream (``data.ring``): CUDA cannot be initialised in forked
  workers. Either way it is the ``MelSpectrogram`` module ``prepare`` uses, so features
  equal the store's (up to the store's float16 rounding).
* Training takes the batches through ``OnTheFlyLoader.device_feed`` (a ``feed.DeviceFeed``):
  a ring of pre-allocated slots on the training device filled by a producer thread, so the
  data role works while the model trains (two GPUs, two streams of one GPU, or the CPU).

Reference crops are taken in the waveform with a margin of ``ceil(n_fft / 2 / hop)``
frames around the wanted frames, so the crop's frames are bit-for-bit the full clip's
frames (the STFT window never reaches the cut, and at the clip's own edges the reflect
padding sees the same samples) while only ~ref_frames of audio are transformed. With
the same references (``choose_refs``, same seed) and the same hash as the store path,
an utterance gets the same reference crop on both paths.

Bucketing needs lengths before any audio is decoded: they come from the file headers
(untrimmed, so an upper bound of the trimmed length). A batch is padded to the bucket
the sampler drew it from, so shapes stay bounded; padding is somewhat higher than with
a store, whose lengths are exact. Clips outside ``data.min/max_duration_s`` by their
header length are left out. A clip that fails to load in a worker (prepare catches such
clips up front; here they surface late) is reported once and skipped from then on, and its
batch repeats another of its clips in its place: the batch keeps its bucket's shape.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from myxtts.audio.frames import n_frames_for
from myxtts.config import AudioConfig, Config, ConfigError, resolve_device
from myxtts.data.batch import Batch, RawBatch
from myxtts.data.buckets import ShapeTable
from myxtts.data.dataset import EpochBatches, mix64
from myxtts.data.features import Featurizer
from myxtts.data.feed import real_frames
from myxtts.data.loader import build_sampler, worker_init
from myxtts.data.plan import choose_refs, mel_mean_std, plan_texts
from myxtts.data.records import SPLITS
from myxtts.data.ring import SlotRing
from myxtts.data.sampler import BucketBatchSampler
from myxtts.data.store import FeatureStore, StoreError
from myxtts.system import available_cpus

log = logging.getLogger(__name__)


def crop_window(n_samples: int, start_frame: int, n_frames: int, cfg: AudioConfig) -> tuple[int, int, int]:
    """Samples ``[a, b)`` whose centered STFT contains the full clip's frames
    ``[start_frame, start_frame + n_frames)`` exactly, from crop frame ``first`` on."""
    half = cfg.n_fft // 2
    margin = -(-half // cfg.hop_length)  # frames whose window may reach the cut
    a = max(0, (start_frame - margin) * cfg.hop_length)
    last = start_frame + n_frames - 1
    b = min(n_samples, last * cfg.hop_length + half + 1)  # +1: the reflection needs half+1 samples
    return a, b, start_frame - a // cfg.hop_length


@dataclass
class RawSplit:
    """One split of a raw dataset, tokenized, with header lengths and references."""

    ids: list[str]
    paths: list[str]
    tokens: list[np.ndarray]  # int32 [L] each
    speaker_ids: np.ndarray  # int64 [N]
    language_ids: np.ndarray  # int64 [N]
    est_frames: np.ndarray  # int64 [N], upper bound of the mel frames (header, untrimmed)
    refs: np.ndarray  # int32 [N, refs_per_utterance], -1 = unused


class RawAudioDataset(Dataset):
    """Worker side: utterance index -> wav, tokens, reference wav crop (no features)."""

    def __init__(self, split: RawSplit, audio: AudioConfig, ref_frames: int, seed: int) -> None:
        self.split = split
        self.audio = audio
        self.ref_frames = int(ref_frames)
        self.seed = int(seed)
        # 1 = the clip failed to load once: reported then, skipped from then on. Shared
        # memory: every loader worker (forked or spawned) and the main process see one map.
        self.failed = torch.zeros(len(split.paths), dtype=torch.uint8).share_memory_()

    def __len__(self) -> int:
        return len(self.split.paths)

    def _load(self, i: int) -> np.ndarray | None:
        """The clip, or None when it cannot be used (said once per clip, across workers
        and epochs; a clip that failed is not read again)."""
        from myxtts.audio.io import AudioError, load_audio

        if self.failed[i]:
            return None
        try:
            return load_audio(self.split.paths[i], self.audio)  # float32 [samples]
        except AudioError as e:
            if not self.failed[i]:
                self.failed[i] = 1
                log.warning("on-the-fly: leaving out a clip that cannot be used (its batch "
                            "repeats another of its clips instead): %s", e)
            return None

    def item(self, i: int, epoch: int) -> dict[str, Any]:
        """The clip's fields; ``{"index": i}`` alone when it cannot be used."""
        wav = self._load(i)
        if wav is None:
            return {"index": i}
        h = mix64(self.seed, epoch, i)
        row = self.split.refs[i]
        refs = row[row >= 0]
        r = int(refs[h % len(refs)])
        ref_wav = wav if r == i else self._load(r)
        if ref_wav is None:
            ref_wav = wav  # a broken reference clip: clone from the utterance itself
        n_ref = n_frames_for(len(ref_wav), self.audio)
        want = min(self.ref_frames, n_ref)
        start = (h >> 32) % (n_ref - want + 1)
        a, b, first = crop_window(len(ref_wav), start, want, self.audio)
        return {"wav": wav, "tokens": self.split.tokens[i], "ref_wav": ref_wav[a:b],
                "ref_first": first, "ref_frames": want, "speaker_id": int(self.split.speaker_ids[i]),
                "language_id": int(self.split.language_ids[i]), "index": i}

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.item(int(i), 0)

    def __getitems__(self, indices: Any) -> list[dict[str, Any]]:
        epoch = 0
        if isinstance(indices, tuple) and len(indices) == 2 and not np.isscalar(indices[1]):
            epoch, indices = indices
        return [self.item(int(i), epoch) for i in indices]


class WavCollator:
    """Worker side: pad wavs / reference wavs / tokens of a batch into a ``RawBatch``
    (``data.batch.RAW_FIELDS``; picklable); with a ``featurizer``, also compute the batch's
    features there (on the CPU) and return the ``Batch``."""

    def __init__(self, shape_table: ShapeTable, est_frames: np.ndarray,
                 featurizer: Featurizer | None = None) -> None:
        self.shape_table = shape_table
        self.est_frames = est_frames
        self.featurizer = featurizer

    def __call__(self, items: list[dict[str, Any]]) -> RawBatch | Batch | None:
        raw = self.pad(items)
        if raw is None or self.featurizer is None:
            return raw
        return self.featurizer(raw, torch.device("cpu"))

    def pad(self, items: list[dict[str, Any]]) -> RawBatch | None:
        """The padded batch of ``items``, always of the bucket the sampler drew them from:
        a clip that could not be used (``{"index": i}`` alone) is replaced by the next
        usable clip of the same batch, the way the sampler fills a bucket's last batch (a
        repeat counts like any utterance in loss and metrics). A batch of fewer utterances
        would have a shape no CUDA graph was captured for, and would run uncaptured beside
        the graphs' memory pool. None if no clip of the batch is usable."""
        # the bucket from every clip drawn, failed ones included: it is the sampler's shape
        n_frames, n_tokens = self.shape_table.shape_for(
            int(self.est_frames[[it["index"] for it in items]].max()))
        usable = [it for it in items if "wav" in it]
        if not usable:
            return None
        items = [it if "wav" in it else usable[k % len(usable)]
                 for k, it in enumerate(items)]
        index = np.array([it["index"] for it in items], np.int64)
        batch = len(items)
        wav_lens = np.array([len(it["wav"]) for it in items], np.int64)
        ref_lens = np.array([len(it["ref_wav"]) for it in items], np.int64)
        tok_lens = np.array([len(it["tokens"]) for it in items], np.int64)
        wav = np.zeros((batch, int(wav_lens.max())), np.float32)
        ref = np.zeros((batch, int(ref_lens.max())), np.float32)
        tokens = np.zeros((batch, max(n_tokens, int(tok_lens.max()))), np.int64)
        for i, it in enumerate(items):
            wav[i, :wav_lens[i]] = it["wav"]
            ref[i, :ref_lens[i]] = it["ref_wav"]
            tokens[i, :tok_lens[i]] = it["tokens"]
        as_long = lambda key: torch.tensor([it[key] for it in items], dtype=torch.long)  # noqa: E731
        return {"wav": torch.from_numpy(wav), "wav_lengths": torch.from_numpy(wav_lens),
                "ref_wav": torch.from_numpy(ref), "ref_wav_lengths": torch.from_numpy(ref_lens),
                "ref_first": as_long("ref_first"), "ref_frames": as_long("ref_frames"),
                "tokens": torch.from_numpy(tokens), "token_lengths": torch.from_numpy(tok_lens),
                "speaker_ids": as_long("speaker_id"), "language_ids": as_long("language_id"),
                "indices": torch.from_numpy(index), "n_frames": torch.tensor(n_frames)}


class OnTheFlyLoader:
    """Iterates batches (``data.batch.Batch``) with features computed on ``device``
    (``data.data_device``): by the loader workers when it is the CPU, else by the caller's
    thread on that GPU. Training uses :meth:`device_feed` instead, which overlaps the data
    role with the step.

    ``mel_mean`` / ``mel_std`` (float32 [n_mels]) come from ``mel_stats`` or, when none was
    given, from one pass over this loader's split on first access.
    """

    def __init__(self, loader: DataLoader, sampler: BucketBatchSampler, cfg: Config,
                 device: torch.device,
                 tokenizer: Any, speakers: list[str], raw: RawSplit,
                 mel_stats: tuple[np.ndarray, np.ndarray] | None) -> None:
        self.loader, self.sampler, self.device, self.cfg = loader, sampler, device, cfg
        self.tokenizer, self.speakers, self.raw = tokenizer, speakers, raw
        self.languages = tokenizer.languages
        self.n_mels, self.ref_frames = cfg.audio.n_mels, cfg.data.ref_frames
        self.featurizer = Featurizer(cfg.audio, cfg.data.ref_frames)
        self._stats = mel_stats

    @property
    def workers_featurize(self) -> bool:
        """The collate function already returns features (the data role is the CPU)."""
        return self.loader.collate_fn.featurizer is not None

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Batch]:
        for batch in self.loader:
            if batch is not None:
                yield batch if self.workers_featurize else self.featurizer(batch, self.device)

    def device_feed(self, device: torch.device, *, hold: int = 1,
                    copy_log: list | None = None) -> SlotRing:
        """The trainer's ``feed.DeviceFeed``: batches delivered on ``device`` through a ring
        of ``data.ring_slots`` slots, features made beside the training step (``data.ring``).
        ``hold``: batches the trainer keeps at once (gradient accumulation); ``copy_log``:
        see ``SlotRing``. Real frames are counted on the host batch: the finished ``Batch``
        when the workers featurize, else the ``RawBatch`` (``Featurizer.real_frames``)."""
        raw = not self.workers_featurize
        return SlotRing(self.loader, device, slots=self.cfg.data.ring_slots, hold=hold,
                        transform=self.featurizer if raw else None, data_device=self.device,
                        copy_log=copy_log, frames=self.featurizer.real_frames if raw else real_frames)

    def largest_raw_batch(self) -> RawBatch:
        """A ``WavCollator`` batch of the bucket with the most audio, every clip at the
        bucket's full length (silence): what the data role's peak memory is checked on."""
        a = self.cfg.audio
        b, l_text, frames = max(self.sampler.shapes(), key=lambda s: s[0] * s[2])
        margin = -(-(a.n_fft // 2) // a.hop_length)
        n_wav = (frames - 1) * a.hop_length
        n_ref = (self.ref_frames - 1 + 2 * margin) * a.hop_length + 1
        full = lambda n: torch.full((b,), n, dtype=torch.long)  # noqa: E731
        zeros = lambda: torch.zeros(b, dtype=torch.long)  # noqa: E731
        return {"wav": torch.zeros(b, n_wav), "wav_lengths": full(n_wav),
                "ref_wav": torch.zeros(b, n_ref), "ref_wav_lengths": full(n_ref),
                "ref_first": full(margin), "ref_frames": full(self.ref_frames),
                "tokens": torch.ones(b, l_text, dtype=torch.long), "token_lengths": full(l_text),
                "speaker_ids": zeros(), "language_ids": zeros(), "indices": zeros(),
                "n_frames": torch.tensor(frames)}

    @property
    def mel_mean(self) -> np.ndarray:
        return self.mel_stats()[0]

    @property
    def mel_std(self) -> np.ndarray:
        return self.mel_stats()[1]

    def mel_stats(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-band mean/std (float32 [n_mels]) of this split's real frames, cached.

        One pass over EVERY utterance of the split exactly once (its own unshuffled,
        single-rank sampler: fill repeats and a rank's share would bias the statistics,
        and all ranks must agree on them).
        """
        if self._stats is None:
            sampler = build_sampler(self.raw.est_frames, np.array([len(t) for t in self.raw.tokens]),
                                    self.cfg, shuffle=False)
            collate = WavCollator(sampler.shape_table(), self.raw.est_frames,
                                  self.loader.collate_fn.featurizer)
            loader = DataLoader(self.loader.dataset, batch_sampler=sampler, collate_fn=collate,
                                num_workers=self.loader.num_workers,
                                worker_init_fn=worker_init if self.loader.num_workers else None,
                                generator=torch.Generator().manual_seed(0))
            total = torch.zeros(self.n_mels, dtype=torch.float64)
            total_sq = torch.zeros(self.n_mels, dtype=torch.float64)
            frames = 0
            seen: set[int] = set()
            for batch in loader:
                if batch is None:
                    continue
                if collate.featurizer is None:
                    batch = self.featurizer(batch, self.device)
                first = []
                for i in batch["indices"].tolist():
                    first.append(i not in seen)
                    seen.add(i)
                keep = torch.tensor(first, device=batch["mel"].device)
                real = torch.arange(batch["mel"].shape[1], device=keep.device)[None, :] \
                    < batch["mel_lengths"][:, None]  # [B, T]
                m = batch["mel"][real & keep[:, None]].double().cpu()  # [frames, n_mels]
                total += m.sum(0)
                total_sq += (m * m).sum(0)
                frames += m.shape[0]
            mean, std = mel_mean_std(total.numpy(), total_sq.numpy(), frames)
            self._stats = (mean.astype(np.float32), std.astype(np.float32))
        return self._stats


def read_raw_splits(data: str | Path, cfg: Config, tokenizer: Any = None
                    ) -> tuple[dict[str, RawSplit], Any, list[str]]:
    """Read + clean + tokenize ``data`` (as prepare does) and read every clip's header.

    Returns ``({split: RawSplit}, tokenizer, speakers)``.
    """
    from myxtts.audio.io import AudioError, audio_info

    planned, tokenizer, _, _ = plan_texts(Path(data), cfg, tokenizer)
    a = cfg.audio
    kept: dict[str, list[tuple[Any, int]]] = {s: [] for s in SPLITS}
    for split in SPLITS:
        for u in planned[split]:
            try:
                info = audio_info(u.audio_path)
            except AudioError as e:
                log.warning("on-the-fly: skipping %s", e)
                continue
            if not cfg.data.min_duration_s <= info.duration_s <= cfg.data.max_duration_s:
                continue
            # +1 sample: resampling may round up; never underestimate (the bucket must hold it).
            n = math.ceil(info.n_samples * a.sample_rate / info.sample_rate) + 1
            kept[split].append((u, n_frames_for(n, a)))
    if not kept["train"]:
        raise StoreError(f"{data}: no training utterance is usable on the fly (lengths outside "
                         f"data.min/max_duration_s, unreadable or rejected texts); run "
                         f"`myxtts prepare {data} --out STORE` to see the reasons in report.json")
    speakers = sorted({u.speaker for s in SPLITS for u, _ in kept[s]})
    speaker_index = {s: i for i, s in enumerate(speakers)}
    out: dict[str, RawSplit] = {}
    for split_no, split in enumerate(SPLITS):
        rows = kept[split]
        spk = np.array([speaker_index[u.speaker] for u, _ in rows], np.int64)
        out[split] = RawSplit(
            ids=[u.id for u, _ in rows], paths=[u.audio_path for u, _ in rows],
            tokens=[np.asarray(u.tokens, np.int32) for u, _ in rows], speaker_ids=spk,
            language_ids=np.array([tokenizer.language_id(u.language) for u, _ in rows], np.int64),
            est_frames=np.array([f for _, f in rows], np.int64),
            refs=choose_refs(spk, cfg.data.refs_per_utterance, [cfg.data.split_seed, split_no]))
    return out, tokenizer, speakers


def default_onthefly_workers(cpus: int | None = None) -> int:
    """Decoding audio is the heavy part here: every CPU but the main process's."""
    cpus = available_cpus() if cpus is None else cpus
    return max(1, cpus - 1)


def build_onthefly_loader(data: str | Path, cfg: Config, *, split: str = "train",
                          tokenizer: Any = None,
                          mel_stats: FeatureStore | tuple[np.ndarray, np.ndarray] | None = None,
                          rank: int = 0, world_size: int = 1, seed: int | None = None,
                          shuffle: bool = True, num_workers: int | None = None,
                          raw_splits: tuple[dict[str, RawSplit], Any, list[str]] | None = None,
                          batch_sizes: list[int] | None = None, max_utterances: int = 0
                          ) -> tuple[OnTheFlyLoader, BucketBatchSampler]:
    """Like ``build_loader`` but over a raw dataset; features on ``cfg.data.data_device``.

    ``tokenizer``: reuse a vocabulary (e.g. a checkpoint's); default: built from the
    dataset's cleaned texts, like prepare. ``mel_stats``: a FeatureStore or ``(mean, std)``;
    default: computed by one pass on first use of ``loader.mel_mean``. ``raw_splits``:
    the result of :func:`read_raw_splits`, to build the train and val loaders from one read.
    ``batch_sizes``, ``max_utterances``: as in ``build_loader``.
    Returns ``(loader, sampler)``.
    """
    if split not in SPLITS:
        raise StoreError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
    device = resolve_device(cfg.data.data_device, "data.data_device")
    splits, tokenizer, speakers = raw_splits or read_raw_splits(data, cfg, tokenizer)
    raw = splits[split]
    if not raw.paths:
        raise ConfigError(f"{data}: the {split} split is empty; set data.val_fraction > 0")
    seed = cfg.data.shuffle_seed if seed is None else int(seed)
    text_lengths = np.array([len(t) for t in raw.tokens], np.int64)
    sampler = build_sampler(raw.est_frames, text_lengths, cfg, rank=rank, world_size=world_size,
                            seed=seed, shuffle=shuffle, batch_sizes=batch_sizes,
                            max_utterances=max_utterances)
    if isinstance(mel_stats, FeatureStore):
        mel_stats = (mel_stats.mel_mean, mel_stats.mel_std)
    workers = cfg.data.num_workers if num_workers is None else int(num_workers)
    if workers < 0:
        workers = default_onthefly_workers()
    extra: dict[str, Any] = {}
    if workers > 0:
        extra = dict(persistent_workers=True, prefetch_factor=2, worker_init_fn=worker_init)
    # The CPU data role computes features in the workers; a GPU data role in its own thread.
    featurizer = Featurizer(cfg.audio, cfg.data.ref_frames) if device.type == "cpu" else None
    # pinned host memory for an asynchronous copy to a GPU (features or training); a CPU run
    # on a GPU machine starts no CUDA
    pin = torch.cuda.is_available() and (device.type == "cuda" or cfg.train.device != "cpu")
    loader = DataLoader(RawAudioDataset(raw, cfg.audio, cfg.data.ref_frames, seed),
                        batch_sampler=EpochBatches(sampler),
                        collate_fn=WavCollator(sampler.shape_table(), raw.est_frames,
                                               featurizer),
                        num_workers=workers, pin_memory=pin,
                        generator=torch.Generator().manual_seed(seed), **extra)
    return OnTheFlyLoader(loader, sampler, cfg, device, tokenizer, speakers, raw, mel_stats), sampler
