"""What the trainer needs from the data side, from a prepared store or a raw dataset.

Two sources, one result: a store folder (has ``manifest.json``) gives memory-mapped
features; anything else is read as a raw dataset and featurised on the fly on
``data.data_device``. On resume the checkpoint's vocabulary must cover the data's (a store)
or is used (on the fly), its mel statistics are reused, and the sampler continues mid-epoch
from the record's position (:meth:`TrainData.continue_from`). A run that fine-tunes a
trained model (``base``) speaks that model's vocabulary grown by the data's new symbols
(:func:`model_vocabulary`): the data's ids are mapped into it on the host.

Two steps, so the train loader is built once, for its final batch plan: :func:`open_data`
gives a :class:`TrainSource` (vocabulary, mel statistics, validation, and the train split's
batch plan at the config's sizes: what the model and the engine are built from); the engine
sizes each bucket's batch (``data.batch_frames=auto``), and :meth:`TrainSource.train_data`
builds the train loader for that plan (a :class:`TrainData`), before the data position is
restored, which depends on the final plan. :func:`open_train_data` does both at the
config's sizes.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.config import Config
from myxtts.data.batch import BatchShape, to_model_dtypes
from myxtts.data.feed.buckets import BucketPlan
from myxtts.data.feed.dataset import VocabMap
from myxtts.data.feed.loader import bucket_plan, build_loader
from myxtts.data.feed.onthefly import (
    RawSplit,
    build_onthefly_loader,
    feature_work,
    read_raw_splits,
    split_mel_stats,
)
from myxtts.data.feed.protocol import FeatureWork, TrainLoader
from myxtts.data.feed.sampler import BucketBatchSampler
from myxtts.data.store import MANIFEST, FeatureStore, ensure_finite
from myxtts.text import Tokenizer
from myxtts.train.distributed import DistInfo
from myxtts.train.errors import TrainError

log = logging.getLogger(__name__)

VAL_SEED = 0  # validation batches and reference crops are the same at every validation


class Vocabulary:
    """What the data speaks, for :class:`TrainSource` and :class:`TrainData` alike (their
    ``tokenizer`` and ``source``, the folder named in messages)."""

    tokenizer: Tokenizer
    source: str

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def languages(self) -> list[str]:
        return self.tokenizer.languages

    def check_vocabulary(self, state: dict[str, Any]) -> None:
        """TrainError unless the data speaks the vocabulary of the checkpoint ``state``
        (checked before its weights are loaded: another size would not even fit the model)."""
        if self.tokenizer.to_dict() != state[ck.VOCAB]:
            try:
                theirs = Tokenizer.from_dict(state[ck.VOCAB]).vocab_size
            except Exception:  # an unreadable vocabulary: the message needs no number
                theirs = "?"
            raise TrainError(f"{self.source or 'the data'} has another vocabulary than the "
                             f"checkpoint ({self.tokenizer.vocab_size} symbols here, the "
                             f"checkpoint's {theirs}); resume on the data the run started "
                             f"with, or start a new run with another --output-dir")


@dataclass
class TrainData(Vocabulary):
    loader: TrainLoader
    sampler: BucketBatchSampler
    val_loader: TrainLoader | None
    val_sampler: BucketBatchSampler | None
    tokenizer: Tokenizer
    mel_mean: np.ndarray
    mel_std: np.ndarray
    synth_batch: dict[str, torch.Tensor] = field(default_factory=dict)
    synth_names: list[str] = field(default_factory=list)
    source: str = ""  # the store or dataset folder, for messages

    def continue_from(self, progress: ck.TrainingProgress) -> None:
        """The sampler continues at ``progress``'s data position (a resumed run's: mapped
        onto a changed batch plan if need be); ``progress.data_plan`` is set to the
        sampler's plan either way."""
        if progress.data_plan:  # (a new run's record has no position yet)
            try:
                progress.batches_consumed = self.sampler.resume(
                    progress.data_plan, progress.epoch, progress.batches_consumed)
            except ValueError as e:
                raise TrainError(f"cannot continue the data order from the checkpoint: {e}") from e
        progress.data_plan = self.sampler.plan_state()


@dataclass
class TrainSource(Vocabulary):
    """The run's data before its train loader exists: what the model and the engine are
    built from (vocabulary, mel statistics, the validation loader, the synthesis batch) and
    ``plan``, the train split's batch plan at the config's sizes. ``store`` (a store) or
    ``raw`` (on the fly: ``read_raw_splits``' result) is what :meth:`train_data` batches."""

    cfg: Config
    dist: DistInfo
    device: torch.device
    tokenizer: Tokenizer
    mel_mean: np.ndarray
    mel_std: np.ndarray
    plan: BucketPlan
    val_loader: TrainLoader | None
    val_sampler: BucketBatchSampler | None
    store: FeatureStore | None = None
    vocab_map: VocabMap | None = None
    raw: tuple[dict[str, RawSplit], Tokenizer, list[str]] | None = None
    synth_batch: dict[str, torch.Tensor] = field(default_factory=dict)
    synth_names: list[str] = field(default_factory=list)
    source: str = ""  # the store or dataset folder, for messages

    def feature_work(self, plan: BucketPlan) -> FeatureWork | None:
        """The data role's largest batch of feature work at ``plan`` (None: a store's
        features are made)."""
        return None if self.store is not None else feature_work(plan, self.cfg)

    def train_data(self, plan: BucketPlan) -> TrainData:
        """The run's data with its train loader, built for ``plan`` (once: the trainer's
        final batch plan)."""
        cfg, dist = self.cfg, self.dist
        if self.store is not None:
            loader, sampler = build_loader(self.store, cfg, rank=dist.rank,
                                           world_size=dist.world_size, device=self.device,
                                           plan=plan, vocab_map=self.vocab_map)
        else:
            loader, sampler = build_onthefly_loader(
                self.source, cfg, tokenizer=self.tokenizer, mel_stats=(self.mel_mean, self.mel_std),
                rank=dist.rank, world_size=dist.world_size, raw_splits=self.raw, plan=plan)
        return TrainData(loader, sampler, self.val_loader, self.val_sampler, self.tokenizer,
                         self.mel_mean, self.mel_std, self.synth_batch, self.synth_names,
                         self.source)


def bucket_shapes(sampler: BucketBatchSampler, cfg: Config) -> list[BatchShape]:
    """Each bucket's padded batch shape, in bucket order (what the warm-up and the auto batch
    budget run)."""
    return sampler.plan.batch_shapes(cfg.data.ref_frames, cfg.audio.n_mels)


def is_store(path: Path) -> bool:
    return (path / MANIFEST).is_file()


def open_data(cfg: Config, data_path: str | Path, device: torch.device, dist: DistInfo,
              state: dict[str, Any] | None, base: dict[str, Any] | None = None) -> TrainSource:
    """The run's data up to its train loader, batched as the config plans it. ``state`` (the
    checkpoint resumed) supplies the vocabulary on the fly and the mel statistics; ``base``
    (the checkpoint a fine-tuning run starts from) the vocabulary to grow and the mel
    statistics. Build the train loader with :meth:`TrainSource.train_data` once the batch
    plan is final, then call :meth:`TrainData.continue_from`."""
    path = Path(data_path)
    if not path.exists():
        raise TrainError(f"{path} does not exist: pass a store from `myxtts prepare` or a dataset folder")
    data = _from_store(cfg, path, device, dist, state, base) if is_store(path) else \
        _on_the_fly(cfg, path, device, dist, state, base)
    if data.val_sampler is not None and data.val_sampler.only is not None and dist.rank == 0:
        log.info("validation on %d of the %d val utterances (a fixed subset: "
                 "data.max_val_utterances=%d)", len(data.val_sampler.only),
                 len(data.val_sampler.mel_lengths), cfg.data.max_val_utterances)
    _pick_synth_batch(cfg, data)
    return data


def open_train_data(cfg: Config, data_path: str | Path, device: torch.device, dist: DistInfo,
                    state: dict[str, Any] | None, base: dict[str, Any] | None = None) -> TrainData:
    """:func:`open_data` with its train loader at the config's batch sizes."""
    source = open_data(cfg, data_path, device, dist, state, base)
    return source.train_data(source.plan)


def model_vocabulary(data: Tokenizer, state: dict[str, Any] | None,
                     base: dict[str, Any] | None) -> tuple[Tokenizer, VocabMap | None]:
    """The vocabulary the model speaks and the map of the data's ids into it (None: the
    data's own). Fine-tuning (``base``): the base model's vocabulary extended by the data's
    new symbols (``Tokenizer.extended``). Resuming (``state``): the run's vocabulary where it
    covers the data's; else the data's, which :meth:`TrainSource.check_vocabulary` refuses."""
    if base is not None:
        model = Tokenizer.from_dict(base[ck.VOCAB]).extended(data)
    elif state is not None:
        model = Tokenizer.from_dict(state[ck.VOCAB])
        if model.extended(data) is not model:
            return data, None
    else:
        return data, None
    vocab_map = VocabMap.between(data, model)
    return (data, None) if vocab_map is None else (model, vocab_map)


def _saved_stats(saved: dict[str, Any] | None) -> tuple[np.ndarray, np.ndarray] | None:
    """The mel statistics a checkpoint's model normalises with (None: no checkpoint)."""
    if saved is None:
        return None
    return saved[ck.MEL_MEAN].numpy(), saved[ck.MEL_STD].numpy()


def _remap_raw(splits: dict[str, RawSplit], vocab_map: VocabMap) -> dict[str, RawSplit]:
    """A raw dataset's splits with their token and language ids in the model's vocabulary."""
    return {name: dataclasses.replace(
        s, tokens=[vocab_map.tokens[t] for t in s.tokens],
        language_ids=vocab_map.languages[s.language_ids]) for name, s in splits.items()}


def _from_store(cfg: Config, path: Path, device: torch.device, dist: DistInfo,
                state: dict[str, Any] | None, base: dict[str, Any] | None) -> TrainSource:
    train_store = FeatureStore.open(path, "train", cfg)
    train_store.check_statistics()
    # A NaN store would train a NaN model: prepare's recorded check, else one pass recorded
    # by each node's first rank (nodes may hold their own copies of the store).
    problem = ensure_finite(path, train_store.manifest,
                            record_as="train" if dist.local_rank == 0 else None)
    if problem:
        raise TrainError(f"{path}: {problem}; run `myxtts prepare --verify {path}` and rebuild "
                         f"the store with --force")

    tokenizer, vocab_map = model_vocabulary(train_store.tokenizer, state, base)
    plan = bucket_plan(train_store.mel_lengths, train_store.token_lengths, cfg)
    val_loader = val_sampler = None
    val_store = FeatureStore.open(path, "val", cfg)
    if len(val_store) > 0:
        val_loader, val_sampler = build_loader(val_store, cfg, split="val", device=device,
                                               rank=dist.rank, world_size=dist.world_size,
                                               seed=VAL_SEED, shuffle=False, num_workers=0,
                                               vocab_map=vocab_map,
                                               max_utterances=cfg.data.max_val_utterances)
    mean, std = _saved_stats(base or state) or (train_store.mel_mean, train_store.mel_std)
    return TrainSource(cfg, dist, device, tokenizer, mean, std, plan, val_loader, val_sampler,
                       store=train_store, vocab_map=vocab_map, source=str(path))


def _on_the_fly(cfg: Config, path: Path, device: torch.device, dist: DistInfo,
                state: dict[str, Any] | None, base: dict[str, Any] | None) -> TrainSource:
    tok = Tokenizer.from_dict(state[ck.VOCAB]) if state is not None else None
    stats = _saved_stats(state if state is not None else base)
    raw = read_raw_splits(path, cfg, tok)
    if base is not None:  # tokenized with the data's own vocabulary: mapped into the model's
        tok, vocab_map = model_vocabulary(raw[1], None, base)
        if vocab_map is not None:
            raw = (_remap_raw(raw[0], vocab_map), tok, raw[2])
    train = raw[0]["train"]
    plan = bucket_plan(train.est_frames, np.array([len(t) for t in train.tokens], np.int64), cfg)
    mean, std = stats or split_mel_stats(train, cfg)  # one pass over the audio for a new model
    val_loader = val_sampler = None
    if raw[0]["val"].paths:
        val_loader, val_sampler = build_onthefly_loader(
            path, cfg, split="val", tokenizer=raw[1], mel_stats=(mean, std), seed=VAL_SEED,
            rank=dist.rank, world_size=dist.world_size, shuffle=False, num_workers=0,
            raw_splits=raw, max_utterances=cfg.data.max_val_utterances)
    return TrainSource(cfg, dist, device, raw[1], mean, std, plan, val_loader, val_sampler,
                       raw=raw, source=str(path))


def _pick_synth_batch(cfg: Config, data: TrainSource) -> None:
    """The first validation utterances (fixed): sentences and reference voices to synthesise."""
    n = cfg.train.synth_sentences
    if n == 0 or data.val_loader is None:
        return
    data.val_sampler.set_epoch(0)
    batch = next(iter(data.val_loader))
    data.val_sampler.set_epoch(0)
    n = min(n, batch["tokens"].shape[0])
    data.synth_batch = to_model_dtypes({k: v[:n].cpu() for k, v in batch.items()
                                        if isinstance(v, torch.Tensor)})
    data.synth_names = [f"utt{int(i)}" for i in data.synth_batch["indices"]]
