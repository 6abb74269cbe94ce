"""XTTS-v2 fine-tuning batches from an XTTS store: bucketed, padded to the bucket's shape
(or, for an eager step, to the batch's longest row), the voice segment cut again every epoch,
built in loader workers.

What a batch holds is ``model.xtts_v2.trainee``'s contract (``text``, ``text_lengths``,
``codes``, ``wav_lengths``, ``cond_audio`` or its cloning mel ``cond_mel``, ``cond_lengths``,
``cond_idxs``) plus ``code_lengths`` (the real codes, what the progress counts) and
``indices``. Everything is read from the store's memory maps: no audio is decoded and no
DVAE runs while training.

The voice segment follows the reference trainer: a length drawn uniformly from
[``xtts.cond_min_s``, ``xtts.cond_max_s``] seconds (half the clip when it is shorter), at a
uniform start, zero-padded to the longest length, so every batch's ``cond_audio`` has one
width. The draw depends only on (seed, epoch, utterance): a resumed run and any number of
workers cut the same segments. Validation (``evaluation``) cuts the middle length from the
clip's start and passes no ``cond_idxs``, as the reference's evaluation does.

Lengths: a bucket's edge is in the GPT's code positions, ``ceil(samples / 1024) + 3`` per
clip (the stop codes the GPT appends are targets too), and ``data.batch_frames`` is the
budget in those units.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from myxtts.config import Config
from myxtts.data.batch import PAD_MULTIPLE, BatchShape
from myxtts.data.feed.buckets import BucketPlan, plan_buckets
from myxtts.data.feed.loader import choose_workers, worker_count, worker_init
from myxtts.data.feed.sampler import BucketBatchSampler, capped_subset
from myxtts.data.xtts_store import XttsStore
from myxtts.model.xtts_v2.features import cloning_mel, cloning_mel_spec
from myxtts.system import available_cpus

log = logging.getLogger(__name__)

SAMPLE_RATE = 22050  # the store's audio, the DVAE's and the cloning mel's rate
CODE_STRIDE = 1024  # audio samples per DVAE code


def gpt_code_lengths(audio_lengths: np.ndarray) -> np.ndarray:
    """The GPT's code positions per clip: ``ceil(samples / 1024) + 3``."""
    a = np.asarray(audio_lengths, dtype=np.int64)
    return (a + CODE_STRIDE - 1) // CODE_STRIDE + 3


def segment_bounds(n_samples: int, rng: np.random.Generator, shortest: int, longest: int,
                   evaluation: bool) -> tuple[int, int]:
    """(first, end) sample of the voice segment of a clip of ``n_samples`` (module docstring)."""
    length = (shortest + longest) // 2 if evaluation else int(rng.integers(shortest, longest + 1))
    if length > n_samples:
        length = n_samples // 2
    start = 0 if evaluation else int(rng.integers(0, n_samples - length + 1))
    return start, start + length


class XttsBatches(Dataset):
    """``batches[(epoch, indices)]`` -> one padded batch of ``store`` (a map-style dataset
    whose items are the sampler's batches: workers build whole batches)."""

    def __init__(self, store: XttsStore, plan: BucketPlan, seed: int, cfg: Config,
                 evaluation: bool = False, mel_stats: torch.Tensor | None = None,
                 trim: bool = False) -> None:
        self.store, self.plan, self.seed, self.evaluation = store, plan, int(seed), evaluation
        # trim: rows padded to the batch's longest, not to its bucket's shape (for an eager
        # step: nothing there caches per shape, and padding is work; the losses are the same)
        self.trim = trim
        # with the model's mel statistics, batches carry the segments' cloning mels instead
        # of their audio (made here, in the loader's workers where it has them)
        self.mel_stats = None if mel_stats is None else mel_stats.detach().float().cpu()
        self.spec = None if mel_stats is None else cloning_mel_spec()
        self.shortest = int(round(cfg.xtts.cond_min_s * SAMPLE_RATE))
        self.longest = int(round(cfg.xtts.cond_max_s * SAMPLE_RATE))
        self.positions = gpt_code_lengths(store.audio_lengths)

    def __len__(self) -> int:  # (a DataLoader over a batch sampler never asks)
        return len(self.store)

    def __getitem__(self, item: tuple[int, list[int]]) -> dict[str, torch.Tensor]:
        epoch, indices = item
        return self.batch(epoch, list(indices))

    def batch(self, epoch: int, indices: list[int]) -> dict[str, torch.Tensor]:
        s, b = self.store, len(indices)
        if self.trim:
            width_c = int(self.positions[indices].max())
            width_t = max(int(s.text_lengths[i]) for i in indices)
        else:
            width_c, width_t = self.plan.shape_for(int(self.positions[indices].max()))
        text = np.zeros((b, width_t), np.int64)
        codes = np.zeros((b, width_c), np.int64)
        cond = np.zeros((b, self.longest), np.float32)
        idxs = np.zeros((b, 2), np.int64)
        text_lengths = np.zeros(b, np.int64)
        code_lengths = np.zeros(b, np.int64)
        wav_lengths = np.zeros(b, np.int64)
        for row, i in enumerate(indices):
            t, c, audio = s.text(i), s.codes(i), s.audio(i)
            text[row, :len(t)], codes[row, :len(c)] = t, c
            text_lengths[row], code_lengths[row], wav_lengths[row] = len(t), len(c), len(audio)
            rng = np.random.default_rng([self.seed, epoch, i])
            first, end = segment_bounds(len(audio), rng, self.shortest, self.longest,
                                        self.evaluation)
            cond[row, :end - first] = audio[first:end]
            idxs[row] = first, end
        batch = {"text": text, "text_lengths": text_lengths, "codes": codes,
                 "code_lengths": code_lengths, "wav_lengths": wav_lengths, "cond_audio": cond,
                 "cond_lengths": idxs[:, 1] - idxs[:, 0],
                 "indices": np.asarray(indices, np.int64)}
        if not self.evaluation:
            batch["cond_idxs"] = idxs
        out = {k: torch.from_numpy(v) for k, v in batch.items()}
        if self.mel_stats is not None:
            with torch.no_grad():
                out["cond_mel"] = cloning_mel(out.pop("cond_audio"), self.mel_stats, self.spec)
        return out


def real_codes(batch: dict[str, torch.Tensor]) -> int:
    """The real codes of a host batch (the progress's frames)."""
    return int(batch["code_lengths"].sum())


def xtts_plan(store: XttsStore, cfg: Config, batch_frames: int, max_utterances: int = 0
              ) -> BucketPlan:
    """The batch plan of ``store`` at ``batch_frames`` code positions per batch."""
    positions, text = gpt_code_lengths(store.audio_lengths), np.asarray(store.text_lengths)
    only = capped_subset(len(positions), max_utterances, cfg.data.split_seed)
    if only is not None:
        positions, text = positions[only], text[only]
    return plan_buckets(positions, text, batch_frames, cfg.data.max_batch_size,
                        cfg.data.num_buckets, PAD_MULTIPLE)


def xtts_sampler(store: XttsStore, plan: BucketPlan, seed: int, *, rank: int = 0,
                 world_size: int = 1, shuffle: bool = True, max_utterances: int = 0,
                 split_seed: int = 0) -> BucketBatchSampler:
    only = capped_subset(len(store), max_utterances, split_seed)
    return BucketBatchSampler(gpt_code_lengths(store.audio_lengths), store.text_lengths, plan,
                              seed, rank, world_size, shuffle, only)


def batch_shapes(plan: BucketPlan, cfg: Config) -> list[BatchShape]:
    """Each bucket's padded shape (``ref_frames``: the voice segment's samples)."""
    return plan.batch_shapes(int(round(cfg.xtts.cond_max_s * SAMPLE_RATE)), 80)


def largest_batch_cost(batches: XttsBatches, sampler: BucketBatchSampler) -> tuple[float, int]:
    """Seconds to build the first epoch's batch of the most code positions here, and its
    bytes (what the loader's worker rule and ``myxtts doctor`` weigh)."""
    positions = batches.positions
    largest = max(sampler.batches(0), key=lambda b: len(b) * int(positions[b].max()))
    started = time.perf_counter()
    built = batches.batch(0, list(largest))
    seconds = time.perf_counter() - started
    return seconds, sum(t.numel() * t.element_size() for t in built.values())


class XttsLoader:
    """One pass per ``iter()``: the sampler's batches from its position, built here or in
    ``workers`` persistent worker processes (their own seeded generator: the DataLoader's
    base seed never comes from the global stream, which would shift dropout on resume).
    ``workers=-1`` (``data.num_workers``' default) decides as for every store: workers only
    where a core is spare and they take enough off each batch (``choose_workers``, from the
    time the largest batch takes to build here and its bytes)."""

    def __init__(self, batches: XttsBatches, sampler: BucketBatchSampler, workers: int) -> None:
        self.batches, self.sampler = batches, sampler
        self.workers = worker_count(workers)
        if self.workers < 0:
            self.workers, why = choose_workers(available_cpus(),
                                               *largest_batch_cost(batches, sampler))
            log.info("XTTS store loader: %d worker%s (%s; --num-workers N to choose)",
                     self.workers, "" if self.workers == 1 else "s", why)
        self.loader = None if self.workers == 0 else DataLoader(
            batches, sampler=sampler, batch_size=None, num_workers=self.workers,
            persistent_workers=True, worker_init_fn=worker_init,
            generator=torch.Generator().manual_seed(batches.seed))

    @property
    def num_workers(self) -> int:
        return self.workers

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        if self.loader is not None:
            yield from self.loader
        else:
            for item in self.sampler:
                yield self.batches[item]
