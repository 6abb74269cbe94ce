"""``myxtts train-vocoder``: the GAN vocoder's run, from a store (or raw dataset) to
checkpoints a synthesizer can load.

Read top to bottom: ``train_vocoder`` builds the run (``train.vocoder.setup``: the store,
generator, discriminators and step, restored from the newest checkpoint of the run folder),
then loops (``_LoopContext.run``): fetch a device batch (side-stream prefetch), step, and at
intervals log (the one host sync), validate (re-synthesis quality of whole validation
utterances against Griffin-Lim's), write audio samples and checkpoint. The folder lock,
SIGINT/SIGTERM handling (save and stop at a step boundary) and the result are
``train.run``'s, shared with the TTS trainer. Batch k depends only on (seed, k), so a
resumed run continues the exact stream (``train.vocoder.data``).
"""

from __future__ import annotations

import logging
import math
import sys
from pathlib import Path
from typing import Any

import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.artifacts import vocoder as vck
from myxtts.artifacts.runs import CheckpointManager
from myxtts.artifacts.saver import BackgroundSaver
from myxtts.audio.griffin_lim import GriffinLim
from myxtts.audio.io import save_wav
from myxtts.config import Config, save_config
from myxtts.observe.loggers import build_logger
from myxtts.observe.meters import StepTimer
from myxtts.observe.progress import Progress
from myxtts.outputs import safe_name
from myxtts.train.errors import TrainError, is_out_of_memory
from myxtts.train.run import StopFlag, TrainResult, check_finite_weights, locked_run, next_micro
from myxtts.train.vocoder.data import SegmentBatches
from myxtts.train.vocoder.eval import pick_utterances, resynthesis_quality
from myxtts.train.vocoder.finetune import teacher_forced_mels
from myxtts.train.vocoder.setup import VocoderSetup, build_vocoder_setup

log = logging.getLogger(__name__)
VAL_UTTERANCES = 8
SAMPLE_UTTERANCES = 2


def train_vocoder(cfg: Config, data: str | Path, resume: str | Path | None = None,
                  progress: bool = True) -> TrainResult:
    """Train the vocoder into ``cfg.train.output_dir``, locked while it writes (``locked_run``)."""
    return locked_run(cfg.train.output_dir, "myxtts train-vocoder", _train_vocoder, cfg, data,
                      resume, progress)


def _train_vocoder(cfg: Config, data: str | Path, resume: str | Path | None = None,
                   progress: bool = True) -> TrainResult:
    out = Path(cfg.train.output_dir)
    manager = CheckpointManager(out / "checkpoints", cfg.train.keep_last)
    resume_path = Path(resume) if resume else manager.resumable()
    run = build_vocoder_setup(cfg, data, resume_path, progress)
    out.mkdir(parents=True, exist_ok=True)
    save_config(run.cfg, out / "config.yaml")
    n_params = sum(p.numel() for p in run.engine.model.parameters())
    log.info("vocoder %s: generator %.2f M parameters on %s, precision %s, %s", run.cfg.vocoder.preset,
             n_params / 1e6, run.device, str(run.engine.dtype).replace("torch.", ""),
             run.engine.mode)
    logger = build_logger(out, 0, run.cfg.train.tensorboard)
    ctx = _LoopContext(run, manager, logger, out)
    try:
        with StopFlag() as stop:
            last = ctx.run(stop, progress)
        return TrainResult(run.record.step, out, last, run.record.best_val_loss,
                           stopped_by=stop.signum)
    finally:
        logger.close()


class _LoopContext:
    def __init__(self, run: VocoderSetup, manager: CheckpointManager, logger: Any, out: Path) -> None:
        self.setup, self.manager, self.logger, self.out = run, manager, logger, out
        self.cfg = run.cfg
        self.val_ids = pick_utterances(run.val, VAL_UTTERANCES)
        self.griffin_lim: dict[str, float] | None = None
        self.saved_step = run.record.step if run.record.step else -1
        self.saver = BackgroundSaver(manager, run.device)  # a save costs the step a copy only

    def vocode(self, mel: torch.Tensor) -> torch.Tensor:
        engine = self.setup.engine
        with engine.evaluating():
            return engine.model(mel)

    def validate(self, step: int) -> dict[str, float]:
        r = self.setup
        q = resynthesis_quality(self.vocode, r.val, self.val_ids, self.cfg.audio, r.device)
        if self.griffin_lim is None:  # the baseline does not change: measure it once
            gl = GriffinLim(self.cfg.audio).to(r.device)
            self.griffin_lim = resynthesis_quality(gl, r.val, self.val_ids, self.cfg.audio, r.device)
        q.update({f"griffin_lim_{k}": v for k, v in self.griffin_lim.items()})
        self.logger.scalars(step, q, prefix="val/")
        return q

    def samples(self, step: int) -> None:
        r = self.setup
        for k, i in enumerate(self.val_ids[:SAMPLE_UTTERANCES]):
            mel = torch.from_numpy(r.val.mel(i).astype("float32"))[None].to(r.device)
            wav = self.vocode(mel)[0].float().cpu().numpy()
            name = safe_name(f"val{k}_{r.val.ids[i]}.wav")  # an id is never a path
            save_wav(self.out / "samples" / f"step_{step:08d}" / name, wav,
                     self.cfg.audio.sample_rate)
            self.logger.audio(f"vocoder/{k}", wav, self.cfg.audio.sample_rate, step)

    def save(self, val_loss: float | None = None, is_best: bool = False) -> Path:
        r = self.setup
        check_finite_weights(r.engine.modules, r.record.step, (
            f"lower vocoder.lr (now {self.cfg.vocoder.lr}) or use --precision fp32"))
        self.saved_step = r.record.step
        extra = {vck.KIND: vck.VOCODER, vck.MEL_HASH: vck.mel_hash(self.cfg.audio),
                 ck.CONFIG: self.cfg.to_dict()}
        state = ck.compose(r.record, r.engine.state_dict(), extra)
        return self.saver.save(state, r.record.step, val_loss, is_best)

    def run(self, stop: StopFlag, show: bool) -> Path | None:
        r, t = self.setup, self.cfg.train
        v = self.cfg.vocoder
        mel_source = None
        if v.tts_checkpoint:  # fine-tune on the TTS model's teacher-forced mels
            mel_source = teacher_forced_mels(v.tts_checkpoint, r.train, self.out / "cache",
                                             r.device)
        batches = SegmentBatches(r.train, v.segment_frames, v.batch_size, self.cfg.audio.hop_length,
                                 self.cfg.audio.log_floor, t.seed, mel_source)
        feed = batches.device_feed(r.device, r.record.step, self.cfg.data.prefetch_batches)
        stream = iter(feed)
        timer = StepTimer(r.device)
        bar = Progress(total=t.max_steps, initial=r.record.step, enabled=show, unit="seg")
        for module in r.engine.modules:
            module.train()
        try:
            last = self._loop(stop, stream, timer, bar)
        finally:  # the save in flight is written before the run returns (see train.loop)
            self.saver.close(report=sys.exc_info()[0] is None)
        bar.close()
        return last

    def _loop(self, stop: StopFlag, stream: Any, timer: StepTimer, bar: Progress) -> Path | None:
        r, t, v = self.setup, self.cfg.train, self.cfg.vocoder
        seg_s = v.segment_frames / self.cfg.audio.frames_per_second
        last: Path | None = None
        while r.record.step < t.max_steps:
            self.saver.check()  # a save that failed stops the run here, in one line
            (batch,), _ = next_micro(stream, timer, 1)
            try:
                r.engine.step(batch)
            except Exception as e:
                if not is_out_of_memory(e):
                    raise
                raise TrainError(f"out of GPU memory with {v.batch_size} segments of "
                                 f"{v.segment_frames} frames; try --set vocoder.batch_size="
                                 f"{max(1, v.batch_size // 2)}") from e
            r.record.step += 1
            step = r.record.step
            timer.step_end(v.batch_size, v.batch_size * seg_s)
            if step % t.log_every == 0 or step == t.max_steps:
                self._log(step, timer, bar)
            if step % t.val_every == 0 or step == t.max_steps:
                q = self.validate(step)
                bar.note(f"step {step}: val mel L1 {q['mel_l1']:.4f} (Griffin-Lim "
                         f"{q['griffin_lim_mel_l1']:.4f}), STFT distance {q['stft_distance']:.4f} "
                         f"(Griffin-Lim {q['griffin_lim_stft_distance']:.4f})")
                is_best = q["mel_l1"] < r.record.best_val_loss
                r.record.best_val_loss = min(r.record.best_val_loss, q["mel_l1"])
                last = self.save(q["mel_l1"], is_best)
            if t.synth_every and (step % t.synth_every == 0 or step == t.max_steps):
                self.samples(step)
            if (step % t.ckpt_every == 0 or step == t.max_steps) and self.saved_step != step:
                last = self.save()
            if stop.signum is not None:
                if self.saved_step != step:
                    last = self.save()
                bar.note(f"stopped by signal at step {step}; checkpoint {last}")
                break
        return last

    def _log(self, step: int, timer: StepTimer, bar: Progress) -> None:
        values = self.setup.engine.read()
        if not all(math.isfinite(x) for x in values.values()):
            self.save()  # where the weights are still finite: a diverged one is refused there
            raise TrainError(f"non-finite vocoder loss at step {step}; lower vocoder.lr (now "
                             f"{self.cfg.vocoder.lr}) or use --precision fp32")
        iv = timer.collect()
        values.update(steps_per_s=iv.steps_per_s, utterances_per_s=iv.utterances_per_s,
                      audio_s_per_s=iv.audio_s_per_s, data_wait_share=iv.data_wait_share)
        self.logger.scalars(step, values, prefix="train/")
        bar.update_to(step, values)
