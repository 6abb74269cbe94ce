"""``myxtts train-vocoder``: the GAN vocoder's recipe, from a store (or raw dataset) to
checkpoints a synthesizer can load (``train.recipe`` gives the lifecycle and the loop).

Read top to bottom: :func:`train_vocoder` runs a :class:`VocoderRecipe` under the run
folder's lock. ``setup`` builds the run (``train.vocoder.setup``: the store, generator,
discriminators and step, restored from the newest checkpoint of the run folder); ``train``
steps with the events: log (the one host sync), validate (re-synthesis quality of whole
validation utterances against Griffin-Lim's), audio samples and checkpoint. Batch k depends
only on (seed, k), so a resumed run continues the exact stream (``train.vocoder.data``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.artifacts import vocoder as vck
from myxtts.audio.griffin_lim import GriffinLim
from myxtts.audio.io import save_wav
from myxtts.config import Config, save_config
from myxtts.data.batch import Batch
from myxtts.data.store import FeatureStore
from myxtts.observe.loggers import build_logger
from myxtts.outputs import safe_name
from myxtts.train.errors import TrainError, is_out_of_memory
from myxtts.train.recipe import Recipe, run
from myxtts.train.run import TrainResult
from myxtts.train.vocoder.data import SegmentBatches
from myxtts.train.vocoder.eval import pick_utterances, resynthesis_quality
from myxtts.train.vocoder.finetune import teacher_forced_mels
from myxtts.train.vocoder.setup import build_vocoder_setup

log = logging.getLogger(__name__)
VAL_UTTERANCES = 8
SAMPLE_UTTERANCES = 2


def train_vocoder(cfg: Config, data: str | Path, resume: str | Path | None = None,
                  progress: bool = True) -> TrainResult:
    """Train the vocoder into ``cfg.train.output_dir``, locked while it writes."""
    return run(VocoderRecipe(cfg, data, resume, show_progress=progress))


class VocoderRecipe(Recipe):
    """The vocoder's run (``train.recipe.Recipe``): one process, one device."""

    command = "myxtts train-vocoder"
    events = ("log", "validate", "samples", "checkpoint")
    unit = "seg"

    def __init__(self, cfg: Config, data_path: str | Path, resume: str | Path | None = None,
                 *, show_progress: bool = True) -> None:
        super().__init__(cfg, data_path, resume, show_progress=show_progress)
        self.train_store: FeatureStore | None = None
        self.val_store: FeatureStore | None = None
        self.val_ids: list[int] = []
        self.griffin_lim: dict[str, float] | None = None

    # ------------------------------------------------------------------ lifecycle
    def setup(self) -> None:
        state = self.load_checkpoint(self.resume) if self.resume is not None else None
        built = build_vocoder_setup(self.cfg, self.data_path, state, self.show_progress)
        self.cfg, self.device, self.engine = built.cfg, built.device, built.engine
        self.train_store, self.val_store = built.train, built.val
        if state is not None:
            self.restore(state)

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        """The checkpoint to resume, read and checked to be a vocoder's."""
        state = ck.load(path)
        if state.get(vck.KIND) != vck.VOCODER:
            raise TrainError(f"{path} is a TTS checkpoint; a vocoder run resumes from its own "
                             f"checkpoints (choose another --output-dir)")
        return state

    def restore(self, state: dict[str, Any]) -> None:
        """The one restorer: the engine's state (generator, discriminators, both optimizers,
        the random streams) and the progress record."""
        self.engine.load_state_dict(state)
        self.record = ck.TrainingProgress.from_state_dict(state[ck.PROGRESS])
        log.info("resumed from %s at step %d", self.resume, self.record.step)

    def train(self) -> TrainResult:
        out, cfg = self.out, self.cfg
        out.mkdir(parents=True, exist_ok=True)
        save_config(cfg, out / "config.yaml")
        n_params = sum(p.numel() for p in self.engine.model.parameters())
        log.info("vocoder %s: generator %.2f M parameters on %s, precision %s, %s",
                 cfg.vocoder.preset, n_params / 1e6, self.device,
                 str(self.engine.dtype).replace("torch.", ""), self.engine.mode)
        self.logger = build_logger(out, 0, cfg.train.tensorboard)
        assert self.val_store is not None
        self.val_ids = pick_utterances(self.val_store, VAL_UTTERANCES)
        return super().train()

    # ------------------------------------------------------------------ the step
    def batches(self) -> Iterator[tuple[Batch, int]]:
        """Segments of the store (or, with ``vocoder.tts_checkpoint``, of the TTS model's
        teacher-forced mels) on the device, from the record's step on."""
        t, v = self.cfg.train, self.cfg.vocoder
        assert self.train_store is not None
        mel_source = None
        if v.tts_checkpoint:  # fine-tune on the TTS model's teacher-forced mels
            mel_source = teacher_forced_mels(v.tts_checkpoint, self.train_store,
                                             self.out / "cache", self.device)
        segments = SegmentBatches(self.train_store, v.segment_frames, v.batch_size,
                                  self.cfg.audio.hop_length, self.cfg.audio.log_floor, t.seed,
                                  mel_source)
        for module in self.engine.modules:
            module.train()
        feed = segments.device_feed(self.device, self.record.step, self.cfg.data.prefetch_batches)
        try:
            yield from feed
        finally:
            feed.close()

    def accum(self) -> int:
        return 1  # a GAN step takes one batch

    def utterances(self, micro: list[Batch]) -> int:
        return self.cfg.vocoder.batch_size

    def step(self, micro: list[Batch]) -> None:
        v = self.cfg.vocoder
        try:
            self.engine.step(micro[0])
        except Exception as e:
            if not is_out_of_memory(e):
                raise
            raise TrainError(f"out of GPU memory with {v.batch_size} segments of "
                             f"{v.segment_frames} frames; try --set vocoder.batch_size="
                             f"{max(1, v.batch_size // 2)}") from e
        self.record.step += 1

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_extra(self) -> dict[str, Any]:
        return {vck.KIND: vck.VOCODER, vck.MEL_HASH: vck.mel_hash(self.cfg.audio),
                ck.CONFIG: self.cfg.to_dict()}

    def weights_fix(self) -> str:
        return f"lower vocoder.lr (now {self.cfg.vocoder.lr}) or use --precision fp32"

    # ------------------------------------------------------------------ events
    def vocode(self, mel: torch.Tensor) -> torch.Tensor:
        with self.engine.evaluating():
            return self.engine.model(mel)

    def log(self, step: int) -> None:
        assert self.timer is not None and self.logger is not None and self.bar is not None
        values = self.engine.read()
        if not all(math.isfinite(x) for x in values.values()):
            self.save_checkpoint()  # where the weights are still finite: a diverged one is refused
            raise TrainError(f"non-finite vocoder loss at step {step}; lower vocoder.lr (now "
                             f"{self.cfg.vocoder.lr}) or use --precision fp32")
        iv = self.timer.collect()
        values.update(steps_per_s=iv.steps_per_s, utterances_per_s=iv.utterances_per_s,
                      audio_s_per_s=iv.audio_s_per_s, data_wait_share=iv.data_wait_share)
        self.logger.scalars(step, values, prefix="train/")
        self.bar.update_to(step, values)

    def validate(self, step: int) -> None:
        assert self.logger is not None and self.val_store is not None
        audio = self.cfg.audio
        q = resynthesis_quality(self.vocode, self.val_store, self.val_ids, audio, self.device)
        if self.griffin_lim is None:  # the baseline does not change: measure it once
            gl = GriffinLim(audio).to(self.device)
            self.griffin_lim = resynthesis_quality(gl, self.val_store, self.val_ids, audio,
                                                   self.device)
        q.update({f"griffin_lim_{k}": v for k, v in self.griffin_lim.items()})
        self.logger.scalars(step, q, prefix="val/")
        self.note(f"step {step}: val mel L1 {q['mel_l1']:.4f} (Griffin-Lim "
                  f"{q['griffin_lim_mel_l1']:.4f}), STFT distance {q['stft_distance']:.4f} "
                  f"(Griffin-Lim {q['griffin_lim_stft_distance']:.4f})")
        is_best = q["mel_l1"] < self.record.best_val_loss
        self.record.best_val_loss = min(self.record.best_val_loss, q["mel_l1"])
        self.last = self.save_checkpoint(q["mel_l1"], is_best)

    def samples(self, step: int) -> None:
        assert self.logger is not None and self.val_store is not None
        for k, i in enumerate(self.val_ids[:SAMPLE_UTTERANCES]):
            mel = torch.from_numpy(self.val_store.mel(i).astype("float32"))[None].to(self.device)
            wav = self.vocode(mel)[0].float().cpu().numpy()
            name = safe_name(f"val{k}_{self.val_store.ids[i]}.wav")  # an id is never a path
            save_wav(self.out / "samples" / f"step_{step:08d}" / name, wav,
                     self.cfg.audio.sample_rate)
            self.logger.audio(f"vocoder/{k}", wav, self.cfg.audio.sample_rate, step)
