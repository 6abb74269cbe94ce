"""The vocoder learns: trained on generated demo voices for a CI-sized budget, its
re-synthesis of held-out clips from their ground-truth mels is closer to the recording
than Griffin-Lim's, in multi-resolution STFT distance and in mel L1.

Thresholds from honest runs of exactly this setup (2-core CPU, torch 2.13, ~60 s), with
one consistency projection (the default): after 1500 steps mel L1 0.138 / 0.135 / 0.135
(seeds 1234 / 7 / 99) vs Griffin-Lim 0.145, i.e. 0.96x / 0.94x / 0.94x; STFT distance
1.09 vs 2.75 (0.40x). 1000 steps gave only 0.97-0.99x (too thin a margin for a test);
at initialisation mel L1 is 1.4 (10x Griffin-Lim). Without the projection 1000 steps gave
1.07x (seed 1234) and 1.24x (seed 7).
"""

from __future__ import annotations

import pytest
import torch

from myxtts.artifacts.vocoder import load_vocoder
from myxtts.audio.griffin_lim import GriffinLim
from myxtts.config import load_config
from myxtts.data.store import FeatureStore
from myxtts.train.vocoder.eval import pick_utterances, resynthesis_quality
from myxtts.train.vocoder.recipe import train_vocoder

STEPS = 1500
GAN_STEPS = 0  # measured: 10 adversarial steps right after the reconstruction phase RAISE
# mel L1 (0.154 -> 0.179; cold discriminators pull the generator around before they help),
# so quality is asserted on the reconstruction phase; the GAN path is exercised by
# test_vocoder_train.py (resume equality runs discriminator and generator GAN steps).


@pytest.mark.slow
def test_the_vocoder_beats_griffin_lim_on_held_out_clips(audio_store, tmp_path):
    cfg = load_config(overrides=[
        f"train.output_dir={tmp_path}", "train.device=cpu", "train.tensorboard=false",
        f"train.max_steps={STEPS + GAN_STEPS}", f"vocoder.disc_start={STEPS}",
        "train.warmup_steps=20", "train.log_every=100", f"train.val_every={STEPS + GAN_STEPS}",
        f"train.ckpt_every={STEPS + GAN_STEPS}", "train.synth_every=0", "train.seed=1234"])
    train_vocoder(cfg, audio_store, progress=False)
    device = torch.device("cpu")
    val = FeatureStore.open(audio_store, "val")
    ids = pick_utterances(val, 8)
    gen = load_vocoder(tmp_path, cfg.audio, device)
    ours = resynthesis_quality(gen, val, ids, cfg.audio, device)
    gl = resynthesis_quality(GriffinLim(cfg.audio), val, ids, cfg.audio, device)
    assert ours["stft_distance"] < 0.6 * gl["stft_distance"], (ours, gl)
    assert ours["mel_l1"] < gl["mel_l1"], (ours, gl)
