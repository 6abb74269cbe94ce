"""Vocoder training: segments line up with their audio, resume is exact, bad input is one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.artifacts import vocoder as vck
from myxtts.artifacts.errors import ArtifactError
from myxtts.artifacts.vocoder import check_mel_definition, load_vocoder, mel_hash
from myxtts.audio.mel import MelSpectrogram
from myxtts.config import load_config
from myxtts.data.store import FeatureStore, StoreError
from myxtts.train.errors import TrainError
from myxtts.train.vocoder.data import SegmentBatches
from myxtts.train.vocoder.engine import VocoderEngine
from myxtts.train.vocoder.recipe import train_vocoder

pytestmark = pytest.mark.usefixtures("one_thread")

# A vocoder far smaller than the tiny preset: the mechanics are under test, not quality.
MICRO_VOCODER = ["vocoder.dim=16", "vocoder.layers=1", "vocoder.disc_channels=4",
                 "vocoder.periods=[2, 3]", "vocoder.segment_frames=8", "vocoder.batch_size=2"]


def vocoder_config(out, *extra):
    return load_config(overrides=[
        *MICRO_VOCODER, f"train.output_dir={out}", "train.device=cpu", "train.tensorboard=false",
        "train.warmup_steps=1", "train.log_every=2", "train.val_every=3", "train.ckpt_every=3",
        "train.synth_every=0", "vocoder.disc_start=2", *extra])


def test_a_segment_is_the_audio_its_mel_was_computed_from(audio_store):
    store = FeatureStore.open(audio_store, "train")
    cfg = load_config()
    batches = SegmentBatches(store, 16, 4, cfg.audio.hop_length, cfg.audio.log_floor, seed=5)
    b = batches.batch(0)
    assert b["mel"].shape == (4, 16, cfg.audio.n_mels) and b["wav"].shape == (4, 16 * 256)
    assert torch.equal(b["mel"], batches.batch(0)["mel"])  # a pure function of (seed, k)
    assert not torch.equal(b["mel"], batches.batch(1)["mel"])
    # recompute the mel of a whole clip's audio: it is the store's mel (float16, int16 audio)
    i = 3
    wav = torch.from_numpy(store.audio(i).astype(np.float32) / 32767)
    mel, n = MelSpectrogram(cfg.audio)(wav)
    assert int(n) == len(store.mel(i))
    assert (mel - torch.from_numpy(store.mel(i).astype(np.float32))).abs().max() < 0.05
    # and a segment's wav is the stored clip's samples at the segment's frames
    mel_seg, wav_seg = batches.segment(i, 5)
    assert np.array_equal(mel_seg, store.mel(i)[5:21].astype(np.float32))
    assert np.allclose(wav_seg, store.audio(i)[5 * 256: 21 * 256] / 32767)


@pytest.mark.slow
def test_training_resumes_exactly(audio_store, tmp_path, monkeypatch):
    full = train_vocoder(vocoder_config(tmp_path / "a", "train.max_steps=6"), audio_store,
                         progress=False)
    real_step = VocoderEngine.step

    def crash_at_step_5(self, batch):  # a killed run: the newest checkpoint is step 3
        if self.steps == 4:
            raise RuntimeError("killed")
        real_step(self, batch)

    monkeypatch.setattr(VocoderEngine, "step", crash_at_step_5)
    with pytest.raises(RuntimeError, match="killed"):
        train_vocoder(vocoder_config(tmp_path / "b", "train.max_steps=6"), audio_store,
                      progress=False)
    monkeypatch.setattr(VocoderEngine, "step", real_step)
    resumed = train_vocoder(vocoder_config(tmp_path / "b", "train.max_steps=6"), audio_store,
                            progress=False)
    assert full.step == resumed.step == 6
    a = ck.load(tmp_path / "a" / "checkpoints" / "ckpt_00000006.pt")
    b = ck.load(tmp_path / "b" / "checkpoints" / "ckpt_00000006.pt")
    for part in ("model", "discriminators"):
        for k, v in a[part].items():
            assert torch.equal(v, b[part][k]), f"{part}.{k} differs after resume"
    assert a["kind"] == "vocoder" and a["mel_hash"] == mel_hash(load_config().audio)
    # the run is loadable for synthesis, in eval mode, speaking this mel definition
    gen = load_vocoder(tmp_path / "a", load_config().audio, torch.device("cpu"))
    assert not gen.training and gen(torch.zeros(1, 10, 80)).shape == (1, 10 * 256)
    # a checkpoint saved before vocoder.projections existed was trained without them
    assert gen.projections == 1
    del a["config"]["vocoder"]["projections"]
    ck.save(tmp_path / "old.pt", a)
    assert load_vocoder(tmp_path / "old.pt", load_config().audio, torch.device("cpu")).projections == 0


def test_the_vocoder_engines_state_holds_its_random_streams(tmp_path):
    """Like the TTS engine's, the vocoder engine's ``state_dict`` carries the random streams
    and ``load_state_dict`` puts them back; it keeps no non-finite counts, so none are saved."""
    from myxtts.model.vocoder.discriminators import Discriminators
    from myxtts.model.vocoder.generator import VocosGenerator

    cfg = vocoder_config(tmp_path)
    engine = VocoderEngine(VocosGenerator(cfg.audio, cfg.vocoder),
                           Discriminators(cfg.audio, cfg.vocoder), cfg, torch.device("cpu"))
    state = ck.compose(ck.TrainingProgress(step=2), engine.state_dict(), {})
    assert ck.RNG in state and ck.NONFINITE not in state
    expected = torch.rand(3)  # drawn after the streams were saved
    torch.manual_seed(7)
    engine.load_state_dict(state)
    assert torch.equal(torch.rand(3), expected) and engine.steps == 2


def test_a_store_without_audio_says_how_to_add_it(micro_store, tmp_path):
    with pytest.raises(StoreError, match=r"--audio --force"):
        train_vocoder(vocoder_config(tmp_path, "train.max_steps=1"), micro_store, progress=False)


def test_another_mel_definition_is_refused_naming_the_keys():
    audio = load_config().audio
    other = load_config(overrides=["audio.hop_length=200"]).audio
    check_mel_definition(vars(audio), audio, "x")  # same definition: fine
    trimmed = load_config(overrides=["audio.trim_db=30"]).audio
    check_mel_definition(vars(trimmed), audio, "x")  # trimming is not the mel definition
    with pytest.raises(ArtifactError, match=r"audio.hop_length: vocoder 200, model 256"):
        check_mel_definition(vars(other), audio, "x")


def test_fp16_is_refused_for_the_gan():
    from myxtts.config import ConfigError
    from myxtts.train.vocoder.engine import vocoder_precision

    with pytest.raises(ConfigError, match="bf16 or fp32"):
        vocoder_precision("fp16", torch.device("cpu"))
    assert vocoder_precision("auto", torch.device("cpu")) == torch.float32


def test_a_tts_run_voices_its_samples_with_a_given_vocoder(audio_store, micro_store, tmp_path,
                                                           monkeypatch):
    import myxtts.artifacts.vocoder as vck_module
    import myxtts.train.samples as samples_module
    from myxtts.model.vocoder.generator import VocosGenerator
    from myxtts.train.tts import train
    from tests.helpers import micro_config

    train_vocoder(vocoder_config(tmp_path / "voc", "train.max_steps=1"), audio_store, progress=False)
    voiced = []  # mel frames each loaded vocoder turned into sample audio
    real_load = vck_module.load_vocoder

    def spying_load(*args, **kwargs):
        gen = real_load(*args, **kwargs)
        real_waveforms = gen.waveforms
        gen.waveforms = lambda mels, lengths: voiced.append(int(lengths.sum())) or \
            real_waveforms(mels, lengths)
        return gen

    monkeypatch.setattr(samples_module, "load_vocoder", spying_load)  # where the samples load it
    cfg = micro_config(tmp_path / "tts", "train.max_steps=2", "train.synth_every=2",
                       "model.max_decoder_frames=16", f"train.vocoder={tmp_path / 'voc'}")
    train(cfg, micro_store, progress=False)
    wavs = sorted((tmp_path / "tts" / "samples" / "step_00000002").glob("*.wav"))
    assert wavs and voiced and sum(voiced) > 0  # the samples went through the vocoder
    assert isinstance(real_load(tmp_path / "voc", cfg.audio, torch.device("cpu")), VocosGenerator)
    wrong = micro_config(tmp_path / "tts2", "train.max_steps=2", f"train.vocoder={tmp_path}")
    with pytest.raises(ArtifactError, match="no checkpoint at"):  # before step 1, not at a sample
        train(wrong, micro_store, progress=False)
    assert not (tmp_path / "tts2" / "config.yaml").exists()


def test_fine_tuning_reads_the_tts_models_teacher_forced_mels(audio_store, tmp_path):
    from myxtts.train.tts import train
    from myxtts.train.vocoder.finetune import teacher_forced_mels
    from tests.helpers import micro_config

    train(micro_config(tmp_path / "tts", "train.max_steps=2"), audio_store, progress=False)
    store = FeatureStore.open(audio_store, "train")
    mels = teacher_forced_mels(tmp_path / "tts", store, tmp_path / "cache", torch.device("cpu"))
    assert mels.shape == store.mel_array.shape and np.isfinite(mels).all()
    assert not np.array_equal(mels, store.mel_array)  # the model's mels, not the store's
    again = teacher_forced_mels(tmp_path / "tts", store, tmp_path / "cache", torch.device("cpu"))
    assert np.array_equal(again, mels) and len(list((tmp_path / "cache").iterdir())) == 1
    run = train_vocoder(vocoder_config(tmp_path / "voc", "train.max_steps=2",
                                       f"vocoder.tts_checkpoint={tmp_path / 'tts'}"),
                        audio_store, progress=False)
    assert run.step == 2 and list((tmp_path / "voc" / "cache").glob("tts_mels_train_*.f16"))
    with pytest.raises(TrainError, match="is a vocoder run"):
        teacher_forced_mels(tmp_path / "voc", store, tmp_path / "cache", torch.device("cpu"))


def test_diverged_vocoder_stops_naming_the_step_and_saves_nothing_non_finite(
        audio_store, tmp_path, monkeypatch):
    real = VocoderEngine.step

    def overflow_at_step_4(self, batch):  # what an update that overflowed leaves behind
        real(self, batch)
        if self.steps == 4:
            with torch.no_grad():
                next(self.disc.parameters()).fill_(float("nan"))

    monkeypatch.setattr(VocoderEngine, "step", overflow_at_step_4)
    out = tmp_path / "v"
    with pytest.raises(TrainError) as e:  # checkpoints every 3 steps: 3 is saved, 6 is not
        train_vocoder(vocoder_config(out, "train.max_steps=6", "train.log_every=100"),
                      audio_store, progress=False)
    assert "non-finite at step 6" in str(e.value) and "vocoder.lr" in str(e.value)
    assert sorted(p.name for p in (out / "checkpoints").glob("ckpt_*.pt")) == ["ckpt_00000003.pt"]
    state = ck.load(out / "checkpoints" / "ckpt_00000003.pt")
    for name in (vck.GENERATOR, vck.DISCRIMINATORS):
        assert all(torch.isfinite(w).all() for w in state[name].values()), name
