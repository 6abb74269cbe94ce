"""Evidence that it learns: train the tiny preset on generated data (CPU, ~4-5 minutes), then
check teacher-forced loss, free-running stopping, and voice cloning by pitch, including a demo
speaker held out of training.

One model is trained once per session and shared by every test here. Thresholds were set
from repeated runs (see the closing note of the model/trainer issue): each sits with a
margin above what the runs reached and far below what an untrained model gives.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from myxtts.config import load_config

# Many speakers with few clips each: with only a handful of voices the conditioning encoder
# learns to pick the nearest training voice (measured: a held-out 153 Hz voice came out at
# 117 Hz with 4 training speakers); a denser set of voices makes it learn pitch as a continuum.
SPEAKERS = 10
HELD_OUT = 5  # a middle voice: never seen in training, cloned from audio alone
UTTERANCES = int(os.environ.get("MYXTTS_LEARN_UTTERANCES", "40"))
STEPS = int(os.environ.get("MYXTTS_LEARN_STEPS", "800"))

pytestmark = pytest.mark.slow


def _cfg(out: Path):
    return load_config(overrides=[
        "model.preset=tiny", f"train.output_dir={out}", f"train.max_steps={STEPS}",
        "train.lr=2e-3", "train.warmup_steps=100", "train.log_every=50",
        f"train.val_every={STEPS}", f"train.ckpt_every={STEPS}", "train.synth_every=0",
        "train.tensorboard=false", "data.batch_frames=3000", "data.max_batch_size=32",
        "data.num_buckets=6", "data.val_fraction=0.05",
    ])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from myxtts.data.demo import make_demo_data
    from myxtts.data.prepare import prepare_store
    from myxtts.train.loop import train

    root = tmp_path_factory.mktemp("learn")
    full = make_demo_data(root / "all", speakers=SPEAKERS, utterances=UTTERANCES, seed=11)
    # training data: every speaker but HELD_OUT (same clips, filtered metadata)
    data = root / "train_data"
    data.mkdir()
    (data / "wavs").symlink_to(full / "wavs")
    lines = (full / "metadata.csv").read_text(encoding="utf-8").splitlines()
    held = [ln for ln in lines if ln.split("|")[3] == f"spk{HELD_OUT}"]
    (data / "metadata.csv").write_text(
        "\n".join(ln for ln in lines if ln.split("|")[3] != f"spk{HELD_OUT}") + "\n", encoding="utf-8")
    cfg = _cfg(root / "run")
    prepare_store(data, root / "store", cfg, progress=False, echo=lambda *a: None)
    # One intra-op thread: immune to OpenMP oversubscription on a busy machine (2 threads made
    # tiny steps up to 15x slower there), and it reproduces the calibration runs exactly.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = train(cfg, root / "store", progress=False)
    finally:
        torch.set_num_threads(threads)
    return {"cfg": cfg, "store": root / "store", "run": result.output_dir, "full": full,
            "held_clips": [full / "wavs" / f"{ln.split('|')[0]}.wav" for ln in held]}


def _val_metrics(run: Path) -> dict[str, float]:
    import json

    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "val/mel_l1" in r][-1]


def test_teacher_forced_validation_loss(trained):
    val = _val_metrics(trained["run"])
    # Normalised log-mel L1 (unit variance per band): an untrained model sits at ~0.8.
    # Runs (r=3, 800 steps) reached mel 0.29-0.33, post-net 0.22-0.26, guided 0.014-0.047.
    assert val["val/post_l1"] < 0.35, val
    assert val["val/mel_l1"] < 0.42, val
    assert val["val/guided"] < 0.06, val  # attention is near the diagonal


def _inputs(trained, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens of the first ``n`` validation utterances and, for each, a reference crop of
    another utterance of the same speaker (as training pairs them)."""
    from myxtts.data.store import FeatureStore

    val = FeatureStore.open(trained["store"], "val")
    idx = list(range(min(n, len(val))))
    tokens = [torch.from_numpy(np.asarray(val.tokens(i), dtype=np.int64)) for i in idx]
    lengths = torch.tensor([len(t) for t in tokens])
    tok = torch.zeros(len(idx), int(lengths.max()), dtype=torch.long)
    for b, t in enumerate(tokens):
        tok[b, : len(t)] = t
    r_frames = trained["cfg"].data.ref_frames
    refs = [torch.from_numpy(np.asarray(val.mel(int(val.refs(i)[0])), dtype=np.float32))[:r_frames]
            for i in idx]
    ref_len = torch.tensor([r.shape[0] for r in refs])
    ref = torch.zeros(len(idx), int(ref_len.max()), refs[0].shape[1])
    for b, r in enumerate(refs):
        ref[b, : r.shape[0]] = r
    return tok, lengths, ref, ref_len


def _free_running(trained, n: int = 8):
    from myxtts.data.store import FeatureStore
    from myxtts.inference.synthesizer import Synthesizer

    synth = Synthesizer.from_checkpoint(trained["run"])
    tok, lengths, ref, ref_len = _inputs(trained, n)
    torch.manual_seed(0)
    mels, out_len = synth.model.generate(tok, lengths, torch.zeros(len(tok), dtype=torch.long),
                                         ref, ref_len)
    val = FeatureStore.open(trained["store"], "val")
    truths = [torch.from_numpy(np.asarray(val.mel(i), dtype=np.float32)) for i in range(len(tok))]
    return mels, out_len, truths, synth


def test_free_running_synthesis_stops_near_the_true_length(trained):
    mels, out_len, truths, synth = _free_running(trained, n=8)
    ratios = np.array([int(out_len[b]) / t.shape[0] for b, t in enumerate(truths)])
    # Runs: every held-out sentence stopped by itself at 0.76-1.09 of the true length, the
    # median at ~0.88 (the model speaks slightly fast); 5-6 of 8 within +-15 %. An untrained
    # model never stops (it runs into the max-length guard).
    assert abs(np.median(ratios) - 1) < 0.15, ratios
    assert np.all((ratios > 0.7) & (ratios < 1.3)), ratios
    assert np.all(out_len.numpy() < synth.cfg.model.max_decoder_frames), out_len


def estimate_f0(wav: np.ndarray, sample_rate: int, fmin: float = 60.0, fmax: float = 400.0) -> float:
    """Median f0 over voiced frames, by normalised autocorrelation (robust enough for the
    demo's harmonic vowels; Griffin-Lim phase does not change the period)."""
    frame, hop = 2048, 512
    lo, hi = int(sample_rate / fmax), int(sample_rate / fmin)
    f0s = []
    for start in range(0, len(wav) - frame, hop):
        x = wav[start:start + frame] - wav[start:start + frame].mean()
        energy = float(np.dot(x, x))
        if energy < 1e-4:
            continue
        ac = np.correlate(x, x, mode="full")[frame - 1:]
        ac = ac / (energy + 1e-9)
        lag = lo + int(np.argmax(ac[lo:hi]))
        if ac[lag] > 0.5:
            f0s.append(sample_rate / lag)
    return float(np.median(f0s)) if f0s else float("nan")


def test_voice_follows_the_reference_speaker_also_unseen(trained):
    from myxtts.data.demo import demo_speaker_f0
    from myxtts.inference.synthesizer import Synthesizer

    synth = Synthesizer.from_checkpoint(trained["run"])
    sentence = ["lamo tesi kunapo miresu"]
    full = trained["full"]
    lines = (full / "metadata.csv").read_text(encoding="utf-8").splitlines()

    def clip_of(spk: int) -> Path:
        return next(full / "wavs" / f"{ln.split('|')[0]}.wav" for ln in reversed(lines)
                    if ln.split("|")[3] == f"spk{spk}")

    sr = synth.cfg.audio.sample_rate
    measured = {}
    low, high = 2, SPEAKERS - 2  # training voices either side of the held-out one
    for spk in (low, HELD_OUT, high):
        wav = synth.synthesize(sentence, [clip_of(spk)], seed=0)[0]
        measured[spk] = estimate_f0(wav, sr)
    expected = {s: demo_speaker_f0(s, SPEAKERS) for s in measured}
    # Pitch follows the reference: right order, each within 25 % of the reference voice.
    # Runs: 127/140/256 Hz for 114/162 (held out)/231 Hz; training voices 101-260 Hz came
    # out within 25 % except the lowest (90 Hz), whose estimate is octave-unstable.
    assert measured[low] < measured[HELD_OUT] < measured[high], (measured, expected)
    for s in measured:
        assert abs(measured[s] / expected[s] - 1) < 0.25, (measured, expected)
