"""``build_loader``: store -> bucketed, padded batches, as fast as the host allows.

Pieces: the batch plan (:func:`bucket_plan`: made from the lengths alone, so the trainer can
size it before any loader exists), :class:`BucketBatchSampler` (``(epoch, indices)``: few
shapes, little padding, exact resume), ``dataset.StoreBatches`` (the padded batch, built
straight from the memory map into a reused buffer) and, with workers, torch's DataLoader over
shared-memory slots a worker reuses for every batch (``slots``), one stream of them across
epochs (``stream``). Copying to the GPU ahead of use is the trainer's feed's job
(:meth:`StoreLoader.device_feed`: ``prefetch.CopyFeed``). The worker count is
:func:`choose_workers`'.
"""

from __future__ import annotations

import functools
import logging
import math
import multiprocessing
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from myxtts.config import Config, ConfigError
from myxtts.data.batch import PAD_MULTIPLE, Batch
from myxtts.data.feed.buckets import BucketPlan, plan_buckets
from myxtts.data.feed.dataset import StoreBatches, VocabMap
from myxtts.data.feed.prefetch import CopyFeed
from myxtts.data.feed.sampler import BucketBatchSampler, capped_subset
from myxtts.data.feed.slots import PREFETCH_PER_WORKER, Slots, check_shared_memory, slot_bytes
from myxtts.data.feed.stream import StreamPasses, WorkerStream
from myxtts.data.store import FeatureStore
from myxtts.system import available_cpus

log = logging.getLogger(__name__)


def default_num_workers(cpus: int | None = None) -> int:
    """The most loader workers ``data.num_workers = -1`` gives a store: 0 up to 2 CPUs (no
    core to spare beside the training process), else 2 (1 with 3); more would only compete
    for cores. Whether any are used is :func:`choose_workers`'s rule. Many-core machines:
    ``benchmarks/input_ratio.py``."""
    cpus = available_cpus() if cpus is None else cpus
    return 0 if cpus <= 2 else min(2, cpus - 2)


WORKERS_PER_CPU = 4  # more loader workers than this per CPU only compete for it


def worker_count(requested: int, cpus: int | None = None) -> int:
    """``data.num_workers`` as asked, once it is bounded: at most ``WORKERS_PER_CPU`` per CPU
    this process may use (each worker is a process holding shared-memory batch slots: a
    count in the thousands would ask for terabytes), else a ConfigError naming it."""
    cpus = available_cpus() if cpus is None else cpus
    most = WORKERS_PER_CPU * cpus
    if requested > most:
        raise ConfigError(f"data.num_workers={requested}: at most {most} on this machine "
                          f"({WORKERS_PER_CPU} per CPU of the {cpus} this process may use); "
                          f"-1 chooses for you")
    return requested


WORKER_SAVING_S = 1e-3  # auto: workers only where they take >= this off every batch
_MESSAGES = 200  # descriptor round trips timed for the fixed part of a handover
_COPY_BYTES = 4 << 20  # bytes copied to time the copy out of a slot


@dataclass(frozen=True)
class Handover:
    """What taking a batch from a worker costs the training process instead of building it,
    in seconds: ``fixed_s`` per batch (the DataLoader queue's message: the slot's descriptor
    pickled, through a pipe, unpickled) plus ``per_byte_s`` for each byte copied out of the
    worker's shared slot (into pinned memory for a GPU; a CPU run uses the slot as it is)."""

    fixed_s: float
    per_byte_s: float

    def seconds(self, nbytes: int) -> float:
        return self.fixed_s + self.per_byte_s * nbytes


@functools.cache
def measured_handover() -> Handover:
    """:class:`Handover` measured on this machine, once per process (~10 ms): the median
    round trip of a descriptor-sized message through a pipe, and the fastest of five copies
    of 4 MiB between two arrays. Both depend on the CPU and the kernel: a figure from another
    machine would decide the worker count wrongly here."""
    reader, writer = multiprocessing.Pipe(duplex=False)
    message = ("/myxtts-slot-0000", 3, (16, 1200, 80), (16, 200), 1200)  # a slot reference
    trips = []
    try:
        for _ in range(_MESSAGES):
            start = time.perf_counter()
            writer.send(message)
            reader.recv()
            trips.append(time.perf_counter() - start)
    finally:
        reader.close()
        writer.close()
    src, dst = np.ones(_COPY_BYTES, dtype=np.uint8), np.empty(_COPY_BYTES, dtype=np.uint8)
    copies = []
    for _ in range(5):
        start = time.perf_counter()
        np.copyto(dst, src)
        copies.append(time.perf_counter() - start)
    return Handover(float(np.median(trips)), min(copies) / _COPY_BYTES)


# Workers: a store batch builds in about a millisecond and every task a worker sends costs
# the training process a queue message (``Handover.fixed_s``), so cheap batches travel several
# to a task (``stream.WorkerStream``'s group): enough for TASK_S of work (a message's cost
# then amortised over several batches), at most MAX_GROUP (each batch in flight holds a
# shared slot).
TASK_S = 3e-3
MAX_GROUP = 3


def batches_per_task(build_s: float) -> int:
    """Batches per worker task for batches that build in ``build_s`` seconds."""
    return max(1, min(MAX_GROUP, math.ceil(TASK_S / max(build_s, 1e-6))))


def choose_workers(cpus: int, build_s: float, nbytes: int, handover: Handover | None = None
                   ) -> tuple[int, str]:
    """``(workers, why)`` for a store whose largest batch builds in ``build_s`` seconds here
    and of which the training process copies ``nbytes`` out of a worker's slot: workers only
    where a core is spare beside the training step and they take at least
    ``WORKER_SAVING_S`` off every batch (``build_s`` less the ``handover``, default
    :func:`measured_handover`); else 0 (``benchmarks/data_pipeline.py --parts precomputed``
    measures both)."""
    most = default_num_workers(cpus)
    note = batch_cost_note(build_s, nbytes, handover)
    if most == 0:
        return 0, f"{cpus} CPUs: no core to spare for a worker; {note}"
    if not workers_pay(build_s, nbytes, handover):
        return 0, note
    return most, f"{note}, on {cpus} CPUs"


def workers_pay(build_s: float, nbytes: int, handover: Handover | None = None) -> bool:
    """Whether a worker takes at least ``WORKER_SAVING_S`` off each batch of this cost."""
    cost = (handover or measured_handover()).seconds(nbytes)
    return build_s - cost >= WORKER_SAVING_S


def batch_cost_note(build_s: float, nbytes: int, handover: Handover | None = None) -> str:
    cost = (handover or measured_handover()).seconds(nbytes)
    saves = "saves" if workers_pay(build_s, nbytes, handover) else "would save"
    return (f"a batch builds in {1e3 * build_s:.2f} ms here, taking it from a worker costs "
            f"~{1e3 * cost:.2f} ms: a worker {saves} {1e3 * max(0.0, build_s - cost):.2f} ms "
            f"per batch (threshold {1e3 * WORKER_SAVING_S:.0f} ms)")


def store_batch_cost(store: FeatureStore, cfg: Config) -> tuple[float, int]:
    """:func:`batch_cost` of the train loader ``build_loader`` makes of ``store`` (a CPU
    run's batches): what ``myxtts doctor`` weighs the worker count against."""
    sampler = build_sampler(store.mel_lengths, store.token_lengths, cfg)
    return batch_cost(StoreBatches(store, sampler.plan, cfg.data.ref_frames,
                                   cfg.data.shuffle_seed, pad_multiple(cfg)), sampler)


def batch_cost(batches: StoreBatches, sampler: BucketBatchSampler,
               tries: int = 3) -> tuple[float, int]:
    """``(seconds, bytes)`` of the first epoch's largest batch, built in this process (the
    fastest of ``tries``: the first may read the store from disk). ~1-10 ms."""
    sizes = batches.store.mel_lengths
    largest = max(sampler.batches(0), key=lambda b: int(sizes[b].sum()))
    best, nbytes = float("inf"), 0
    for _ in range(tries):
        start = time.perf_counter()
        out = batches.batch(0, largest)
        best = min(best, time.perf_counter() - start)
        nbytes = sum(t.numel() * t.element_size() for t in out.values())
    return best, nbytes


# data.batch_frames=auto: the frame budget bucket edges are planned with, and on a CPU (where
# memory is not the limit, step time is) the budget itself. On a GPU the trainer then
# probes each bucket's batch size (myxtts.train.engine.budget) and builds the loader for those.
AUTO_PLAN_FRAMES = 12000


def pad_multiple(cfg: Config) -> int:
    """Mel frames every bucket edge is a multiple of: whole decoder steps, PAD_MULTIPLE at a time."""
    return cfg.model.frames_per_step * PAD_MULTIPLE


def plan_frames(cfg: Config) -> int:
    """The frame budget batches are planned with: ``data.batch_frames``, or for ``auto``
    :data:`AUTO_PLAN_FRAMES`."""
    bf = cfg.data.batch_frames
    return AUTO_PLAN_FRAMES if bf == "auto" else int(bf)


def worker_init(worker_id: int) -> None:
    """One intra-op thread per loader worker: N workers x N threads would oversubscribe."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    torch.set_num_threads(1)


def bucket_plan(mel_lengths, token_lengths, cfg: Config, max_utterances: int = 0) -> BucketPlan:
    """The batch plan of these lengths at the config's budget (``buckets.plan_buckets``); a
    budget too small is a ConfigError. ``max_utterances``: planned for the fixed seeded
    subset :func:`build_sampler` draws from (0 = all)."""
    mel, tok = np.asarray(mel_lengths), np.asarray(token_lengths)
    only = capped_subset(len(mel), max_utterances, cfg.data.split_seed)
    if only is not None:
        mel, tok = mel[only], tok[only]
    try:
        return plan_buckets(mel, tok, plan_frames(cfg), cfg.data.max_batch_size,
                            cfg.data.num_buckets, pad_multiple(cfg))
    except ValueError as e:
        # The message names data.batch_frames and the value to use; ConfigError makes the
        # CLI print it as one line instead of a traceback.
        raise ConfigError(str(e)) from e


def build_sampler(mel_lengths, token_lengths, cfg: Config, *, rank: int = 0, world_size: int = 1,
                  seed: int | None = None, shuffle: bool = True, plan: BucketPlan | None = None,
                  max_utterances: int = 0) -> BucketBatchSampler:
    """The bucket sampler for these lengths. ``plan``: the batch plan (default
    :func:`bucket_plan`'s, at the config's batch sizes). ``max_utterances``: draw from at most
    this many utterances, a fixed subset seeded by ``data.split_seed`` (:func:`capped_subset`;
    validation's ``data.max_val_utterances``); 0 = all."""
    plan = bucket_plan(mel_lengths, token_lengths, cfg, max_utterances) if plan is None else plan
    only = capped_subset(len(mel_lengths), max_utterances, cfg.data.split_seed)
    try:
        return BucketBatchSampler(mel_lengths, token_lengths, plan,
                                  cfg.data.shuffle_seed if seed is None else seed, rank,
                                  world_size, shuffle, only)
    except ValueError as e:
        raise ConfigError(str(e)) from e


def build_loader(store: FeatureStore | str | Path, cfg: Config, *, split: str = "train",
                 rank: int = 0, world_size: int = 1, device: str | torch.device | None = None,
                 seed: int | None = None, shuffle: bool = True, num_workers: int | None = None,
                 plan: BucketPlan | None = None, vocab_map: VocabMap | None = None,
                 max_utterances: int = 0
                 ) -> tuple[StoreLoader, BucketBatchSampler]:
    """Batches (``data.batch.Batch``, on the CPU) of one split of a store.

    ``store``: an open FeatureStore or its path (opened with ``cfg``, so a store built for
    other features is refused). ``device``: where training runs; CUDA turns on float16 mels
    copied from the store without a host cast (cast on the GPU:
    ``data.batch.to_model_dtypes``) and, where CUDA is available, pinned batches.
    ``seed``: batch order and reference crops (default ``data.shuffle_seed``).
    ``num_workers`` overrides ``data.num_workers`` (-1 = :func:`choose_workers`' choice).
    ``plan``: the batch plan (:func:`bucket_plan`'s, with the batch sizes the trainer chose
    for ``data.batch_frames=auto``); default: the config's.
    ``vocab_map``: the store's token and language ids as a model's (``dataset.VocabMap``).
    ``max_utterances``: batch a fixed seeded subset of at most this many (0 = all).
    Returns ``(loader, sampler)``: call ``sampler.set_epoch`` / ``state_dict`` on the
    sampler; iterating the loader runs one epoch and advances the sampler to the next.
    """
    if not isinstance(store, FeatureStore):
        store = FeatureStore.open(store, split, cfg)
    if len(store) == 0:
        raise ConfigError(f"{store.path}: the {store.split} split is empty; prepare more data or "
                          f"set data.val_fraction > 0")
    seed = cfg.data.shuffle_seed if seed is None else int(seed)
    sampler = build_sampler(store.mel_lengths, store.token_lengths, cfg, rank=rank,
                            world_size=world_size, seed=seed, shuffle=shuffle, plan=plan,
                            max_utterances=max_utterances)
    transfer = device is not None and torch.device(device).type == "cuda"
    pin = transfer and torch.cuda.is_available()
    ref_frames, multiple = cfg.data.ref_frames, pad_multiple(cfg)
    workers = worker_count(cfg.data.num_workers if num_workers is None else int(num_workers))
    note, group = None, 1
    if workers != 0:
        # Measured once per loader (a few ms): what decides workers for -1, and what
        # ``myxtts profile`` weighs a user's count against (``StoreLoader.worker_note``).
        build_s, nbytes = batch_cost(StoreBatches(store, sampler.plan, ref_frames, seed,
                                                  multiple, transfer=transfer), sampler)
        best, why = choose_workers(available_cpus(), build_s, nbytes if pin else 0)
        group = batches_per_task(build_s)
        if workers < 0:
            workers = best
            log.info("store loader: %d worker%s (%s; --num-workers N to choose)", workers,
                     "" if workers == 1 else "s", why)
        elif best == 0:
            many = f"{workers} loader worker{'' if workers == 1 else 's'}"
            note = (f"{many} compete with the training process for the {available_cpus()} "
                    f"CPUs (no core to spare)" if default_num_workers() == 0 else
                    f"{many} save the training process too little on this store to pay for "
                    f"their CPU: "
                    f"{why}")
    if workers == 0:
        # The training process pins as it builds; workers cannot (no CUDA in forked
        # processes): their batches are copied into pinned memory as they leave the slots.
        batches = StoreBatches(store, sampler.plan, ref_frames, seed, multiple, transfer=transfer,
                               pinned=pin, vocab_map=vocab_map)
        return StoreLoader(batches, sampler, pin=pin, prefetch=cfg.data.prefetch_batches,
                           worker_note=note), sampler
    per_slot = slot_bytes(sampler.plan, store.n_mels, ref_frames, transfer=transfer)
    check_shared_memory(per_slot, group, workers)
    batches = StoreBatches(store, sampler.plan, ref_frames, seed, multiple, transfer=transfer,
                           vocab_map=vocab_map, slots=Slots(per_slot, group))
    # Persistent workers keep their memmaps, page cache and shared slots across epochs, and
    # one stream of batches runs on across them, ``group`` to a task (``stream``). Own
    # generator: the DataLoader draws a base seed at every iter(); from the global RNG that
    # would shift the model's dropout stream and break bit-exact resume.
    workers_loader = DataLoader(batches, batch_sampler=WorkerStream(sampler, group),
                                collate_fn=_built, num_workers=workers, persistent_workers=True,
                                prefetch_factor=PREFETCH_PER_WORKER, worker_init_fn=worker_init,
                                generator=torch.Generator().manual_seed(seed))
    return StoreLoader(batches, sampler, workers_loader, pin, cfg.data.prefetch_batches,
                       note), sampler


def _built(results: list) -> list:
    """A store DataLoader's ``collate_fn``: its dataset hands over batches already built (in
    shared slots: ``StoreBatches.__getitems__``)."""
    return results


class StoreLoader:
    """What ``build_loader`` returns: iterate it for batch dicts (one epoch per pass).

    Without workers each batch is built here as the sampler names it (``batches``: pinned
    when training on CUDA); with them (``dataloader``, whose batch sampler is a
    ``stream.WorkerStream``), the sampler's pass is cut from the workers' stream
    (``passes``) and each batch taken out of a worker's shared slot (``slots``, pinned as it
    leaves when training on CUDA: ``pin``). ``prefetch``: batches the trainer's feed keeps in
    flight (``data.prefetch_batches``). ``worker_note``: set where the workers asked for cost
    the training process more than they save on this store (``choose_workers``' rule): what
    ``myxtts profile`` says.
    """

    def __init__(self, batches: StoreBatches, sampler: BucketBatchSampler,
                 dataloader: DataLoader | None = None, pin: bool = False, prefetch: int = 2,
                 worker_note: str | None = None) -> None:
        self.batches, self.sampler = batches, sampler
        self.dataloader, self.slots = dataloader, batches.slots
        # what a new iteration of the workers' DataLoader hands over: no reference to this
        # loader, so dropping it stops the workers at once (no cycle for the collector)
        self.passes = None if dataloader is None else StreamPasses(
            dataloader.batch_sampler, functools.partial(batches.slots.receive, dataloader, pin,
                                                        grouped=True))
        self.pin = pin
        self.prefetch = int(prefetch)
        self.worker_note = worker_note

    @property
    def num_workers(self) -> int:
        return 0 if self.dataloader is None else self.dataloader.num_workers

    def feature_work(self) -> None:
        """A store's features are made: no data role computes any."""
        return None

    def __len__(self) -> int:
        return len(self.sampler)

    def device_feed(self, device: torch.device, *, hold: int = 1,
                    copy_log: list | None = None) -> CopyFeed:
        """The trainer's ``protocol.DeviceFeed``: this loader's batches copied to ``device``
        on a side stream, ``prefetch`` ahead, cast to the model's dtypes there. ``hold`` needs
        nothing here (a handed-out batch keeps its memory, a worker's slot included, until
        dropped); ``copy_log``: see ``CopyFeed``."""
        return CopyFeed(self, device, self.prefetch, copy_log)

    def __iter__(self) -> Iterator[Batch]:
        if self.passes is None:
            for epoch, indices in self.sampler:
                yield self.batches.batch(epoch, indices)
        else:
            yield from self.passes.one_pass()
