"""Evaluation during training (``train.eval_every``): the speech metrics that cost little,
on a fixed set of validation utterances, logged and kept as the run's last evaluation.

The first ``train.eval_utterances`` validation utterances (the same at every evaluation,
each once) are decoded free-running as the trainer's samples are
(``train.samples.free_running``: the weights' average, eager blocks, fp32, a forked RNG,
here always seeded alike), cut at ``metrics.truth.MAX_LENGTH_RATIO`` times their true
length as ``myxtts evaluate`` cuts them, and voiced by the samples' vocoder. Each is scored
against its ground-truth mel voiced by the SAME vocoder (``metrics.scorer``): MCD after
DTW, log-F0 RMSE, voicing error, duration ratio and, with resemblyzer installed, speaker
similarity to that vocoded truth. Voicing both
sides alike measures the model, not the vocoder. ASR and DNSMOS are left to ``myxtts
evaluate`` (seconds per clip on a CPU).

The means go to the run's loggers (``eval/``: TensorBoard and metrics.jsonl) and, with the
step, to ``RUN/evaluation.json`` (``evaluate.record``), which ``myxtts export``
carries into the bundle. Rank 0 alone evaluates; the others go on to their next step.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from myxtts.config import Config
from myxtts.data.batch import to_model_dtypes
from myxtts.evaluate.record import write_evaluation
from myxtts.metrics import missing
from myxtts.metrics.scorer import Scorer, summarize
from myxtts.metrics.truth import length_cap
from myxtts.observe.loggers import MetricLogger
from myxtts.train.engine import TrainEngine
from myxtts.train.samples import free_running, sample_vocoder

log = logging.getLogger(__name__)

EVAL_SEED = 0  # the prenet-dropout noise of every evaluation: only the weights change
LOGGED = ("mcd_db", "f0_rmse_cents", "voicing_error", "duration_ratio", "similarity")


class TrainingEvaluation:
    """``evaluation(engine, logger, step, rank)`` scores the run now; the fixed
    utterances, their vocoded truths and the scorer are loaded on the first call. The class
    is what the training loop's ``evaluation`` takes (``train.hooks``): ``myxtts train``
    passes it."""

    def __init__(self, cfg: Config, data: Any, device: torch.device, out: Path) -> None:
        self.cfg, self.data, self.device, self.out = cfg, data, device, Path(out)
        self.batches: list[dict[str, torch.Tensor]] | None = None
        self.truths: list[np.ndarray] = []
        self.voices: list[np.ndarray | None] = []

    def _load_utterances(self) -> None:
        """The first ``eval_utterances`` validation utterances (CPU batches), each truth's
        clip through the samples' vocoder and its d-vector."""
        self.batches, want = [], self.cfg.train.eval_utterances
        if self.data.val_loader is None:
            log.warning("train.eval_every: the data has no validation split, so nothing is "
                        "evaluated")
            return
        self.data.val_sampler.set_epoch(0)
        seen: set[int] = set()
        for batch in self.data.val_loader:  # each utterance once: the sampler repeats some
            rows = []
            for i, u in enumerate(batch["indices"].tolist()):
                if u not in seen and len(rows) < want:
                    seen.add(u)
                    rows.append(i)
            if rows:
                keep = torch.tensor(rows)
                self.batches.append(to_model_dtypes({k: v[keep].cpu() for k, v in batch.items()
                                                     if isinstance(v, torch.Tensor)}))
            want -= len(rows)
            if want == 0:
                break
        self.data.val_sampler.set_epoch(0)  # validation starts its pass where it always does
        self.vocoder = sample_vocoder(self.cfg, self.device)
        self.scorer = Scorer(self.cfg.audio, asr="none", speaker=not missing("resemblyzer"),
                             mos=False)
        for batch in self.batches:
            self.truths += self.vocoder.waveforms(batch["mel"].to(self.device),
                                                  batch["mel_lengths"].to(self.device))
        self.voices = [self.scorer.embed(w) for w in self.truths]

    def __call__(self, engine: TrainEngine, logger: MetricLogger, step: int,
                 rank: int) -> dict[str, float] | None:
        if rank != 0:
            return None
        # Everything here runs on a forked RNG (building the speaker encoder's layers draws
        # initial weights, decoding draws prenet noise): a run that evaluates trains exactly
        # as one that does not (tested).
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            return self._evaluate(engine, logger, step)

    def _evaluate(self, engine: TrainEngine, logger: MetricLogger,
                  step: int) -> dict[str, float] | None:
        if self.batches is None:
            self._load_utterances()
        if not self.batches:
            return None
        clips: list[np.ndarray] = []
        for batch in self.batches:
            on_device = {k: v.to(self.device) for k, v in batch.items()}
            caps = torch.tensor([length_cap(int(n)) for n in batch["mel_lengths"]])
            mels, lengths, _ = free_running(engine, on_device, self.device, EVAL_SEED,
                                            alignment=False, max_frames=int(caps.max()))
            # each cut at its own cap, as `myxtts evaluate` cuts: one duration ratio
            lengths = torch.minimum(lengths, caps.to(lengths.device))
            clips += self.vocoder.waveforms(mels, lengths)
        scores = [self.scorer.score(c, truth=t, reference=v)
                  for c, t, v in zip(clips, self.truths, self.voices)]
        summary = summarize(scores)
        metrics = {k: summary[k] for k in LOGGED if summary.get(k) is not None}
        logger.scalars(step, metrics, prefix="eval/")
        write_evaluation(self.out, {"step": step, "utterances": len(clips),
                                    "vocoder": self.cfg.train.vocoder or "griffin-lim",
                                    "against": "the vocoded truth", "metrics": metrics})
        return metrics
