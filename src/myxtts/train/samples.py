"""The run's samples: fixed validation sentences decoded free-running, as a listener hears the
model, voiced by the run's vocoder (or Griffin-Lim), saved, logged and compared with their
ground-truth mels.

``free_running`` and ``sample_vocoder`` are how every sample of a run is made; the
evaluation in training (``myxtts.evaluate.training``) decodes and voices its utterances
with them too.
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
from myxtts.metrics.dtw import dtw_l1
from myxtts.observe.loggers import MetricLogger
from myxtts.train.engine import TrainEngine

log = logging.getLogger(__name__)


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
