"""Evaluation during an XTTS-v2 fine-tuning run (``train.eval_every``): the speech metrics
that cost little, on a fixed set of validation utterances, logged and kept as the run's last
evaluation (``evaluate.training`` does the same for myxtts's own model).

The utterances are the first ``train.eval_utterances`` of the store's validation split, the
same at every evaluation. Each speaks in the voice of its own clip (from the store's audio:
conditioning latents by the run's current GPT, the speaker embedding by the base model's
speaker encoder, as ``myxtts synthesize --reference`` makes a voice), its text (the store's
tokens) decoded greedily by the run's GPT (the weights' average where the run keeps one,
eval mode, eager blocks, fp32: ``TrainEngine.evaluating``) up to
``metrics.truth.length_cap`` of its true length in codes, as ``myxtts evaluate`` caps it,
and voiced by the base model's HiFi-GAN decoder. Each is scored against its true recording
(``metrics.scorer``, at the decoder's 24 kHz): MCD after DTW, log-F0 RMSE, voicing error,
duration ratio and, with resemblyzer installed, speaker similarity to the true clip. XTTS-v2
cannot voice a true clip through its decoder alone, so the truth is the recording itself,
not a vocoded one. ASR and DNSMOS are left to ``myxtts evaluate RUN DATA``.

The means go to the run's loggers (``eval/``) and, with the step, to
``RUN/evaluation.json`` (``evaluate.record``). Rank 0 alone evaluates, on a forked RNG: a
run that evaluates trains bit for bit as one that does not.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from myxtts.artifacts.errors import ArtifactError
from myxtts.artifacts.xtts_v2 import read_xtts_v2
from myxtts.audio.sinc_resample import sinc_resample
from myxtts.config import Config, config_from_dict
from myxtts.evaluate.record import write_evaluation
from myxtts.evaluate.training import LOGGED
from myxtts.inference.xtts_v2.decode import pad_rows, stream_codes
from myxtts.inference.xtts_v2.voice import GPT_RATE, reference_clip
from myxtts.metrics import missing
from myxtts.metrics.scorer import Scorer, summarize
from myxtts.metrics.truth import length_cap
from myxtts.model.xtts_v2.gpt import XttsGpt
from myxtts.model.xtts_v2.hifigan import XttsLatentDecoder
from myxtts.model.xtts_v2.model import SPEAKER_RATE, voice_latents
from myxtts.observe.loggers import MetricLogger
from myxtts.train.engine import TrainEngine

log = logging.getLogger(__name__)

DECODER_PREFIX = "hifigan_decoder."
BATCH = 8  # utterances decoded together (one KV cache each)


@dataclass
class _Utterance:
    """One fixed utterance: its text ids, its clip as a voice reference (``[1, S]`` at
    22050 Hz), its speaker embedding, its true clip at the decoder's rate, the true clip's
    d-vector (None without resemblyzer) and its cap in codes."""

    tokens: torch.Tensor
    clip: torch.Tensor
    speaker: torch.Tensor
    truth: np.ndarray
    dvector: np.ndarray | None
    cap: int


class XttsTrainingEvaluation:
    """``evaluation(engine, logger, step, rank)`` scores the run now (``train.hooks``);
    ``data`` is the run's ``XttsRecipe`` (its ``base`` and ``val_store``). The decoder, the
    utterances and the scorer are loaded on the first call. ``myxtts train`` passes the
    class to ``train_xtts``."""

    def __init__(self, cfg: Config, data: Any, device: torch.device, out: Path) -> None:
        self.cfg, self.data, self.device, self.out = cfg, data, device, Path(out)
        self.utterances: list[_Utterance] | None = None
        self.decoder: XttsLatentDecoder | None = None
        self.mel_stats: torch.Tensor | None = None

    def __call__(self, engine: TrainEngine, logger: MetricLogger, step: int,
                 rank: int) -> dict[str, float] | None:
        if rank != 0:
            return None
        # Building the decoder draws initial weights before they are loaded: the RNG is
        # forked so a run that evaluates trains exactly as one that does not (tested).
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            return self._evaluate(engine, logger, step)

    # ------------------------------------------------------------------ loading
    def _load(self) -> None:
        self.utterances = []
        store, base = getattr(self.data, "val_store", None), self.data.base
        if store is None or not len(store):
            log.warning("train.eval_every: the store has no validation split, so nothing is "
                        "evaluated")
            return
        try:
            files = read_xtts_v2(base.folder)
        except ArtifactError as e:
            log.warning("train.eval_every: the run's XTTS-v2 folder cannot be read, so nothing "
                        "is evaluated: %s", e)
            return
        decoder = XttsLatentDecoder.from_config(base.config)
        decoder.load_state_dict({k[len(DECODER_PREFIX):]: v for k, v in files.weights.items()
                                 if k.startswith(DECODER_PREFIX)}, strict=True)
        self.decoder = decoder.to(self.device).eval()
        stats = files.weights.get("mel_stats")  # the model's own, as it speaks
        self.mel_stats = (stats if stats is not None else base.mel_stats).float().to(self.device)
        args = base.config.args
        rate = args.output_sample_rate
        self.scorer = Scorer(config_from_dict({"audio": {"sample_rate": rate}}).audio,
                             asr="none", speaker=not missing("resemblyzer"), mos=False)
        for i in range(min(self.cfg.train.eval_utterances, len(store))):
            audio = torch.from_numpy(np.ascontiguousarray(store.audio(i)))[None]
            clip = reference_clip(audio[0].numpy(), GPT_RATE, base.config.voice)
            with torch.no_grad():
                speaker = self.decoder.speaker_embedding(
                    sinc_resample(clip, GPT_RATE, SPEAKER_RATE).to(self.device))
            truth = sinc_resample(audio, GPT_RATE, rate)[0].numpy()
            codes = audio.shape[-1] / args.gpt_code_stride_len
            self.utterances.append(_Utterance(
                torch.from_numpy(store.text(i)), clip, speaker, truth,
                self.scorer.embed(truth), length_cap(int(codes))))

    # ------------------------------------------------------------------ scoring
    def _evaluate(self, engine: TrainEngine, logger: MetricLogger,
                  step: int) -> dict[str, float] | None:
        if self.utterances is None:
            self._load()
        if not self.utterances:
            return None
        fp32 = torch.autocast(self.device.type, enabled=False)
        clips: list[np.ndarray] = []
        with engine.evaluating(), fp32, torch.no_grad():
            gpt: XttsGpt = engine.model.gpt
            for first in range(0, len(self.utterances), BATCH):
                clips += self._speak(gpt, self.utterances[first:first + BATCH])
        scores = [self.scorer.score(c, truth=u.truth, reference=u.dvector)
                  for c, u in zip(clips, self.utterances)]
        summary = summarize(scores)
        metrics = {k: summary[k] for k in LOGGED if summary.get(k) is not None}
        logger.scalars(step, metrics, prefix="eval/")
        write_evaluation(self.out, {"step": step, "utterances": len(clips),
                                    "vocoder": "XTTS-v2's HiFi-GAN decoder",
                                    "against": "the true recording", "metrics": metrics})
        return metrics

    def _speak(self, gpt: XttsGpt, batch: list[_Utterance]) -> list[np.ndarray]:
        """The utterances of ``batch`` decoded together, greedily, each to its stop code
        (included, as ``myxtts synthesize`` decodes) or its cap, then voiced one by one."""
        assert self.decoder is not None and self.mel_stats is not None
        voice = self.data.base.config.voice
        latents = torch.cat([voice_latents(gpt, u.clip.to(self.device), self.mel_stats, voice)
                             for u in batch])
        tokens, lengths = pad_rows([u.tokens.to(self.device) for u in batch])
        caps = [min(u.cap, gpt.max_gen_mel_tokens) for u in batch]
        codes, states = [], []
        for code, state in stream_codes(gpt, latents, tokens, self.data.base.config.sampling,
                                        greedy=True, max_codes=max(caps),
                                        text_lengths=lengths):
            codes.append(code.clone())
            states.append(state)
        codes_t, states_t = torch.stack(codes, dim=1), torch.stack(states, dim=1)
        stopped = codes_t == gpt.stop_audio_token
        ends = torch.where(stopped.any(dim=1), stopped.int().argmax(dim=1) + 1,
                           codes_t.shape[1]).tolist()
        out = []
        for i, u in enumerate(batch):
            n = min(int(ends[i]), caps[i])
            wav = self.decoder(states_t[i:i + 1, :n].float(), u.speaker)[0, 0]
            out.append(wav.float().cpu().numpy())
        return out
