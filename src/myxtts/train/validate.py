"""Validation: teacher-forced loss over the val split (sharded across DDP ranks), and
free-running samples.

Both run under ``no_grad``/``inference_mode`` and read results back once at the end
(one sync per validation, not per batch).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from myxtts.artifacts.vocoder import load_vocoder
from myxtts.audio.griffin_lim import GriffinLim
from myxtts.audio.io import save_wav
from myxtts.config import Config
from myxtts.data.feed.prefetch import CopyFeed
from myxtts.evaluate.dtw import dtw_l1
from myxtts.observe.loggers import MetricLogger
from myxtts.train.engine import TrainEngine

log = logging.getLogger(__name__)


@torch.no_grad()
def validation_loss(engine: TrainEngine, data: Any, device: torch.device,
                    dist: Any = None) -> dict[str, float] | None:
    """Mean teacher-forced losses over the val split (same batches and crops each time).

    Under DDP (``dist.enabled``) each rank validates its shard of the batches (the val
    loader is built per rank) and the sums are all-reduced, so every rank returns the mean
    over all batches: what one process computes on the whole split (batches weighted
    equally; the sampler's padding repeats are left out, see ``real_batches``). With
    ``train.ema_decay`` the averaged weights are validated (``TrainEngine.evaluating``)."""
    if data.val_loader is None:
        return None
    with engine.evaluating():  # eval mode, the weights' moving average, eager blocks
        sums, count = validation_sums(engine, data, device)
    if not sums:
        return None
    keys = sorted(sums)
    count_t = torch.tensor([float(count)], device=device)
    totals = torch.cat([torch.stack([sums[k] for k in keys]), count_t])  # [keys + 1], one reduce
    if dist is not None and dist.enabled:
        torch.distributed.all_reduce(totals, op=torch.distributed.ReduceOp.SUM)
    values = totals.cpu().tolist()  # the one host sync of a validation
    return {k: v / values[-1] for k, v in zip(keys, values[:-1])}


def validation_sums(engine: TrainEngine, data: Any, device: torch.device
                    ) -> tuple[dict[str, torch.Tensor], int]:
    """This rank's summed per-batch losses over its real val batches, and how many there
    were. The sampler's padding repeats (DDP: at the end of a rank's list) are not run; a
    rank with no real batch runs one only to return zero sums of the same keys, so every
    rank takes part in the all-reduce with the same tensor."""
    data.val_sampler.set_epoch(0)
    real = data.val_sampler.real_batches
    sums: dict[str, torch.Tensor] = {}
    for k, (batch, _) in enumerate(CopyFeed(data.val_loader, device, 2, frames=None)):
        losses = {name: v.detach().float() for name, v in engine.loss(batch).items()}
        if k >= real:  # only reached when this rank has no real batch at all
            return {name: torch.zeros_like(v) for name, v in losses.items()}, 0
        for name, v in losses.items():
            sums[name] = sums[name] + v if name in sums else v
        if k + 1 == real:
            break
    return sums, real if sums else 0


def synthesize_samples(engine: TrainEngine, data: Any, cfg: Config, logger: MetricLogger,
                       step: int, out_dir: Path, device: torch.device, rank: int) -> list[Path]:
    """Free-running synthesis (:func:`free_running`) of fixed validation sentences with their
    own reference speakers, saved, logged and scored against their ground-truth mels."""
    if rank != 0 or not data.synth_batch:
        return []
    model = engine.model
    batch = {k: v.to(device) for k, v in data.synth_batch.items() if isinstance(v, torch.Tensor)}
    mels, lengths, align = free_running(engine, batch, device, seed=step)
    wavs = sample_vocoder(cfg, device).waveforms(mels, lengths)
    std = model.mel_std.float().cpu().numpy()  # distances in units of each band's spread
    paths = []
    step_dir = out_dir / f"step_{step:08d}"
    for i in range(mels.shape[0]):
        n = int(lengths[i])
        wav = wavs[i]
        path = step_dir / f"val{i}_{data.synth_names[i]}.wav"
        save_wav(path, wav, cfg.audio.sample_rate)
        paths.append(path)
        logger.audio(f"synth/{i}", wav, cfg.audio.sample_rate, step)
        mel = mels[i, :n].float().cpu().numpy()  # [n, n_mels]
        logger.image(f"synth_mel/{i}", mel.T, step)
        true_n = int(batch["mel_lengths"][i])
        logger.image(f"align/{i}", np.asarray(align[i].float().cpu().numpy().T), step)
        truth = batch["mel"][i, :true_n].float().cpu().numpy()
        scores = {f"length_ratio_{i}": n / max(1, true_n), f"dtw_l1_{i}": dtw_l1(mel, truth, std)}
        logger.scalars(step, scores, prefix="synth/")
    return paths


def free_running(engine: TrainEngine, batch: dict[str, torch.Tensor], device: torch.device,
                 seed: int, alignment: bool = True, max_frames: int | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(log-mels, lengths, alignment or None) of ``batch`` decoded free-running, as every
    sample of a run is: by the weights' moving average when the run keeps one, compiled
    blocks eager (``TrainEngine.evaluating``: generation's one-frame steps would otherwise
    compile graphs of their own in the middle of the run). ``alignment``: also the
    teacher-forced attention map; ``max_frames``: a cap below the model's own."""
    model = engine.model
    # Generation draws prenet-dropout noise: fork the RNG so a run that synthesises samples
    # and one resumed from a checkpoint see the same random stream afterwards.
    # Samples run in fp32 whatever train.precision says: generation is hundreds of one-frame
    # steps, and on a CPU (where bf16 is emulated) an autocast around them would cost far more
    # than the training step; fp32 also keeps samples comparable across precisions.
    devices = [device] if device.type == "cuda" else []
    fp32 = torch.autocast(device.type, enabled=False)
    align = None
    with engine.evaluating():
        with torch.random.fork_rng(devices=devices), fp32:
            torch.manual_seed(seed)
            mels, lengths = model.generate(batch["tokens"], batch["token_lengths"],
                                           batch["language_ids"], batch["ref_mel"],
                                           batch["ref_lengths"], max_frames=max_frames)
        if alignment:
            with torch.no_grad(), torch.autocast(device.type, enabled=False):
                align = model.alignment(batch)
    return mels, lengths, align


def sample_vocoder(cfg: Config, device: torch.device) -> Any:
    """What voices a run's samples: its trained vocoder (``train.vocoder``, checked to speak
    this mel definition), else Griffin-Lim."""
    if cfg.train.vocoder:
        return load_vocoder(cfg.train.vocoder, cfg.audio, device)
    return GriffinLim(cfg.audio).to(device)
