"""On-the-fly loading: the store's batches straight from raw audio, without ``prepare``.

Loader workers (``data.feed.raw``) read, resample and trim the clips and reference crops and pad
them into wav batches; with ``data.data_device='cpu'`` they also compute the log-mels
(``features.Featurizer``, the ``MelSpectrogram`` prepare uses) and hand finished batches
over through reused shared-memory slots (``slots.SlotCollator``; a new segment per tensor
per batch costs ~5x the CPU); with ``'cuda:N'`` that GPU's producer thread computes them
(``data.feed.ring``). Training takes them through ``OnTheFlyLoader.device_feed``. Lengths for
bucketing come from the file headers (an upper bound), and every batch keeps the shape of
the bucket the sampler drew it from: a clip that fails to load is reported once, skipped
from then on, and replaced in its batch by another of the batch's clips. A new model's mel
statistics (:func:`split_mel_stats`) and the data role's heaviest batch
(:func:`feature_work`) come from the split and the batch plan alone, before the loader.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from myxtts.audio.frames import n_frames_for, samples_for_frames, window_margin
from myxtts.audio.io import AudioError, audio_info
from myxtts.config import Config, ConfigError, resolve_device
from myxtts.data.batch import Batch, RawBatch
from myxtts.data.feed.buckets import BucketPlan
from myxtts.data.feed.features import Featurizer
from myxtts.data.feed.loader import build_sampler, worker_count, worker_init
from myxtts.data.feed.protocol import FeatureWork, real_frames
from myxtts.data.feed.raw import RawAudioDataset, RawSplit, WavCollator
from myxtts.data.feed.ring import SlotRing
from myxtts.data.feed.sampler import BucketBatchSampler
from myxtts.data.feed.slots import PREFETCH_PER_WORKER, SlotCollator, Slots, slot_bytes
from myxtts.data.feed.stream import StreamPasses, WorkerStream
from myxtts.data.prepare.plan import choose_refs, plan_texts
from myxtts.data.prepare.records import SPLITS
from myxtts.data.store import FeatureStore, StoreError
from myxtts.data.store.format import mel_mean_std
from myxtts.system import available_cpus

log = logging.getLogger(__name__)


class _Pass:
    """Re-iterable: each ``iter`` starts a new pass of ``start()`` (a ring's source)."""

    def __init__(self, start: Any) -> None:
        self.start = start

    def __iter__(self) -> Iterator[Any]:
        return self.start()


class OnTheFlyLoader:
    """Iterates batches (``data.batch.Batch``) with features computed on ``device``
    (``data.data_device``): by the loader workers when it is the CPU, else by the caller's
    thread on that GPU. Training uses :meth:`device_feed` instead, which overlaps the data
    role with the step.

    ``loader``: the DataLoader of ``wav_collator``'s batches; with workers, its batch sampler
    is a ``stream.WorkerStream`` (the sampler's passes cut from it: ``passes``) and, where the
    workers featurize, its batches arrive through ``slots``. ``mel_mean`` / ``mel_std``
    (float32 [n_mels]) come from ``mel_stats`` or, when none was given, from one pass over
    the split on first access.
    """

    def __init__(self, loader: DataLoader, sampler: BucketBatchSampler, wav_collator: WavCollator,
                 slots: Slots | None, cfg: Config, device: torch.device, tokenizer: Any,
                 speakers: list[str], raw: RawSplit,
                 mel_stats: tuple[np.ndarray, np.ndarray] | None, pin: bool = False) -> None:
        self.loader, self.sampler, self.device, self.cfg = loader, sampler, device, cfg
        self.wav_collator, self.slots = wav_collator, slots
        # a new iteration of the DataLoader, as the host receives it (no reference to this
        # loader, so dropping it stops the workers at once: no cycle for the collector)
        self._receive = (functools.partial(slots.receive, loader, pin) if slots is not None
                         else loader.__iter__)
        self.passes = (StreamPasses(loader.batch_sampler, self._receive) if loader.num_workers
                       else None)
        self.pin = pin  # copy batches out of the workers' slots into pinned memory
        self.tokenizer, self.speakers, self.raw = tokenizer, speakers, raw
        self.languages = tokenizer.languages
        self.n_mels, self.ref_frames = cfg.audio.n_mels, cfg.data.ref_frames
        self.featurizer = Featurizer(cfg.audio, cfg.data.ref_frames)
        self._stats = mel_stats

    @property
    def workers_featurize(self) -> bool:
        """The collate function already returns features (the data role is the CPU)."""
        return self.wav_collator.featurizer is not None

    def host_batches(self) -> Iterator[Any]:
        """One pass (the sampler's next) as the host receives it: a worker's finished batches
        from its shared-memory slot (``slots``), taken from the workers' stream across
        epochs (``passes``); None for a batch no clip of which loaded."""
        return self.passes.one_pass() if self.passes is not None else self._receive()

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[Batch]:
        for batch in self.host_batches():
            if batch is not None:
                yield batch if self.workers_featurize else self.featurizer(batch, self.device)

    def device_feed(self, device: torch.device, *, hold: int = 1,
                    copy_log: list | None = None) -> SlotRing:
        """The trainer's ``feed.DeviceFeed``: batches delivered on ``device`` through a ring
        of ``data.ring_slots`` slots, features made beside the training step (``data.feed.ring``).
        ``hold``: batches the trainer keeps at once (gradient accumulation); ``copy_log``:
        see ``SlotRing``. Real frames are counted on the host batch: the finished ``Batch``
        when the workers featurize, else the ``RawBatch`` (``Featurizer.real_frames``)."""
        raw = not self.workers_featurize
        return SlotRing(_Pass(self.host_batches), device, slots=self.cfg.data.ring_slots, hold=hold,
                        transform=self.featurizer if raw else None, data_device=self.device,
                        copy_log=copy_log, frames=self.featurizer.real_frames if raw else real_frames)

    @property
    def num_workers(self) -> int:
        return self.loader.num_workers

    def feature_work(self) -> FeatureWork:
        """The features of :meth:`largest_raw_batch` on the data role's device."""
        return FeatureWork(self.device,
                           lambda: self.featurizer(dict(self.largest_raw_batch()), self.device))

    def largest_raw_batch(self) -> RawBatch:
        """:func:`largest_raw_batch` of this loader's plan."""
        return largest_raw_batch(self.sampler.plan, self.cfg)

    @property
    def mel_mean(self) -> np.ndarray:
        return self.mel_stats()[0]

    @property
    def mel_std(self) -> np.ndarray:
        return self.mel_stats()[1]

    def mel_stats(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-band mean/std (float32 [n_mels]) of this split's real frames, cached
        (:func:`split_mel_stats`, on this loader's workers)."""
        if self._stats is None:
            self._stats = split_mel_stats(self.raw, self.cfg, self.num_workers)
        return self._stats


def largest_raw_batch(plan: BucketPlan, cfg: Config) -> RawBatch:
    """A ``WavCollator`` batch of the bucket of ``plan`` with the most audio, every clip at the
    bucket's full length (silence): what the data role's peak memory is checked on."""
    a = cfg.audio
    shapes = sorted(set(zip(plan.batch_sizes, plan.text_caps, plan.boundaries)))
    b, l_text, frames = max(shapes, key=lambda s: s[0] * s[2])
    margin = window_margin(a)
    n_wav = samples_for_frames(frames, a)
    n_ref = samples_for_frames(cfg.data.ref_frames, a, margin)
    full = lambda n: torch.full((b,), n, dtype=torch.long)  # noqa: E731
    zeros = lambda: torch.zeros(b, dtype=torch.long)  # noqa: E731
    return {"wav": torch.zeros(b, n_wav), "wav_lengths": full(n_wav),
            "ref_wav": torch.zeros(b, n_ref), "ref_wav_lengths": full(n_ref),
            "ref_first": full(margin), "ref_frames": full(cfg.data.ref_frames),
            "tokens": torch.ones(b, l_text, dtype=torch.long), "token_lengths": full(l_text),
            "speaker_ids": zeros(), "language_ids": zeros(), "indices": zeros(),
            "n_frames": torch.tensor(frames)}


def feature_work(plan: BucketPlan, cfg: Config) -> FeatureWork:
    """The data role's heaviest batch of feature work for a batch plan (before its loader
    exists: what the trainer's auto batch sizes keep room for on a shared GPU)."""
    device = resolve_device(cfg.data.data_device, "data.data_device")
    featurizer = Featurizer(cfg.audio, cfg.data.ref_frames)
    return FeatureWork(device, lambda: featurizer(dict(largest_raw_batch(plan, cfg)), device))


def _workers(cfg: Config, num_workers: int | None) -> int:
    """Loader workers: ``num_workers`` or ``data.num_workers`` (-1: every CPU but one)."""
    workers = worker_count(cfg.data.num_workers if num_workers is None else int(num_workers))
    return default_onthefly_workers() if workers < 0 else workers


def split_mel_stats(raw: RawSplit, cfg: Config, num_workers: int | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Per-band mean/std (float32 [n_mels]) of a split's real frames, on the data role's
    device (``num_workers``: as ``build_onthefly_loader`` takes it).

    One pass over EVERY utterance of the split exactly once (its own unshuffled,
    single-rank sampler: fill repeats and a rank's share would bias the statistics,
    and all ranks must agree on them).
    """
    device = resolve_device(cfg.data.data_device, "data.data_device")
    workers = _workers(cfg, num_workers)
    featurizer = Featurizer(cfg.audio, cfg.data.ref_frames)
    sampler = build_sampler(raw.est_frames, np.array([len(t) for t in raw.tokens]), cfg,
                            shuffle=False)
    collate = WavCollator(sampler.plan, raw.est_frames,
                          featurizer if device.type == "cpu" else None)
    loader = DataLoader(RawAudioDataset(raw, cfg.audio, cfg.data.ref_frames, cfg.data.shuffle_seed),
                        batch_sampler=sampler, collate_fn=collate, num_workers=workers,
                        worker_init_fn=worker_init if workers else None,
                        generator=torch.Generator().manual_seed(0))
    total = torch.zeros(cfg.audio.n_mels, dtype=torch.float64)
    total_sq = torch.zeros(cfg.audio.n_mels, dtype=torch.float64)
    frames = 0
    seen: set[int] = set()
    for batch in loader:
        if batch is None:
            continue
        if collate.featurizer is None:
            batch = featurizer(batch, device)
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
    return mean.astype(np.float32), std.astype(np.float32)


def read_raw_splits(data: str | Path, cfg: Config, tokenizer: Any = None
                    ) -> tuple[dict[str, RawSplit], Any, list[str]]:
    """Read + clean + tokenize ``data`` (as prepare does) and read every clip's header.

    Returns ``({split: RawSplit}, tokenizer, speakers)``.
    """
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
                          plan: BucketPlan | None = None, max_utterances: int = 0
                          ) -> tuple[OnTheFlyLoader, BucketBatchSampler]:
    """Like ``build_loader`` but over a raw dataset; features on ``cfg.data.data_device``.

    ``tokenizer``: reuse a vocabulary (e.g. a checkpoint's); default: built from the
    dataset's cleaned texts, like prepare. ``mel_stats``: a FeatureStore or ``(mean, std)``;
    default: computed by one pass on first use of ``loader.mel_mean``. ``raw_splits``:
    the result of :func:`read_raw_splits`, to build the train and val loaders from one read.
    ``plan``, ``max_utterances``: as in ``build_loader``.
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
                            seed=seed, shuffle=shuffle, plan=plan, max_utterances=max_utterances)
    if isinstance(mel_stats, FeatureStore):
        mel_stats = (mel_stats.mel_mean, mel_stats.mel_std)
    workers = _workers(cfg, num_workers)
    extra: dict[str, Any] = {}
    if workers > 0:
        extra = dict(persistent_workers=True, prefetch_factor=PREFETCH_PER_WORKER,
                     worker_init_fn=worker_init)
    # The CPU data role computes features in the workers; a GPU data role in its own thread.
    featurizer = Featurizer(cfg.audio, cfg.data.ref_frames) if device.type == "cpu" else None
    # pinned host memory for an asynchronous copy to a GPU (features or training); a CPU run
    # on a GPU machine starts no CUDA
    pin = torch.cuda.is_available() and (device.type == "cuda" or cfg.train.device != "cpu")
    wavs = WavCollator(sampler.plan, raw.est_frames, featurizer)
    collate: Any = wavs
    slots = None
    if workers > 0 and featurizer is not None:
        # Finished batches reach the main process through each worker's reused shared-memory
        # slots (``slots.SlotCollator``: used as they are by a CPU run, copied into pinned
        # memory for a GPU), not through a new shared-memory segment per tensor per batch.
        slots = Slots(slot_bytes(sampler.plan, cfg.audio.n_mels, cfg.data.ref_frames))
        collate = SlotCollator(wavs, slots)
    loader = DataLoader(RawAudioDataset(raw, cfg.audio, cfg.data.ref_frames, seed),
                        batch_sampler=WorkerStream(sampler) if workers else sampler,
                        collate_fn=collate, num_workers=workers,
                        pin_memory=pin and slots is None,
                        generator=torch.Generator().manual_seed(seed), **extra)
    return OnTheFlyLoader(loader, sampler, wavs, slots, cfg, device, tokenizer, speakers, raw,
                          mel_stats, pin=pin), sampler
