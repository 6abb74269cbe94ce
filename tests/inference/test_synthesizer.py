"""Synthesizer: a checkpoint is all it needs; batched text -> clips cut to their lengths."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from myxtts.inference.synthesizer import Synthesizer
from myxtts.train.checkpoint import resolve_checkpoint
from myxtts.train.errors import TrainError
from myxtts.train.loop import train
from tests.helpers import micro_config

SENTENCES = ["lamo tesi kunapo.", "miresu."]  # the demo language the micro store speaks


@pytest.fixture(scope="module")
def run(micro_store, tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "run"
    train(micro_config(out, "train.max_steps=4", "model.max_decoder_frames=48"), micro_store,
          progress=False)
    return out


@pytest.fixture(scope="module")
def reference(micro_store):
    return sorted((micro_store.parent / "data" / "wavs").glob("*.wav"))[0]


def test_a_run_folder_or_a_file_loads_and_synthesizes(run, reference):
    synth = Synthesizer.from_checkpoint(run, device="cpu")
    assert resolve_checkpoint(run) == run / "checkpoints" / "best.pt"
    hop, limit = synth.cfg.audio.hop_length, synth.cfg.model.max_decoder_frames
    mels, lengths = synth.synthesize_mel(SENTENCES, [reference])
    wavs = synth.vocode(mels, lengths)
    assert len(wavs) == 2 and mels.shape[0] == 2 and mels.shape[2] == synth.cfg.audio.n_mels
    for wav, n in zip(wavs, lengths.tolist()):
        assert wav.dtype == np.float32 and 0 < n <= limit and len(wav) == n * hop
        assert np.isfinite(wav).all()
    spoken = synth.synthesize(SENTENCES, [reference])  # long-form: one clip per text
    assert len(spoken) == 2 and all(len(w) >= hop and np.isfinite(w).all() for w in spoken)
    for i, n in enumerate(lengths.tolist()):  # zero past each length: a clean batch
        assert not mels[i, n:].any()
    again = Synthesizer.from_checkpoint(run / "checkpoints" / "ckpt_00000004.pt", device="cpu")
    assert again.tokenizer == synth.tokenizer


def test_the_seed_fixes_the_prenet_noise(run, reference):
    synth = Synthesizer.from_checkpoint(run, device="cpu")
    a = synth.synthesize_mel(SENTENCES[:1], [reference], seed=3)[0]
    b = synth.synthesize_mel(SENTENCES[:1], [reference], seed=3)[0]
    c = synth.synthesize_mel(SENTENCES[:1], [reference], seed=4)[0]
    assert torch.equal(a, b) and not (a.shape == c.shape and torch.equal(a, c))


def test_a_reference_is_cropped_to_what_the_encoder_trained_on(run, reference):
    synth = Synthesizer.from_checkpoint(run, device="cpu")
    ref, n = synth.reference(reference)
    assert ref.shape == (1, int(n), synth.cfg.audio.n_mels) and int(n) <= synth.cfg.data.ref_frames


def test_user_errors_are_one_line(run, reference, tmp_path):
    synth = Synthesizer.from_checkpoint(run, device="cpu")
    with pytest.raises(TrainError, match="language 'xx' is not known to this model"):
        synth.synthesize(SENTENCES, [reference], language="xx")
    with pytest.raises(TrainError, match="empty after cleaning"):
        synth.synthesize(["   "], [reference])
    with pytest.raises(TrainError, match="no checkpoint at"):
        resolve_checkpoint(tmp_path / "nothing")
