"""Evidence that it learns: train the tiny preset with the demo's settings on generated data
(CPU, one thread, ~7 minutes), then check the teacher-forced loss, free-running synthesis
(where it stops, and how close its mels are to the ground truth) and voice cloning by pitch,
including a demo speaker held out of training.

One model is trained once per session and shared by every test here. Thresholds were set
from repeated runs (seeds 1234 and 7, and variants of the settings; see the closing note of
the model/trainer issue): each sits with a margin beyond what the runs reached and far from
what an untrained model or a trivial output gives.

Marked ``slow``: plain ``pytest`` leaves these out and CI runs them as its second stage
(``pytest -m slow``); ``test_learns_quick.py`` proves learning in every test run, and checks
the pitch measure used here.
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
STEPS = int(os.environ.get("MYXTTS_LEARN_STEPS", "2100"))

pytestmark = pytest.mark.slow


def _cfg(out: Path):
    """The demo's settings (presets/demo.yaml), with this test's run folder and schedule."""
    from myxtts.cli.demo import demo_config_path

    return load_config(demo_config_path(), overrides=[
        f"train.output_dir={out}", f"train.max_steps={STEPS}", f"train.val_every={STEPS}",
        f"train.ckpt_every={STEPS}", "train.synth_every=0", "train.tensorboard=false",
        "train.device=cpu",  # the thresholds were measured on the CPU, one thread
    ])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from myxtts.data.prepare.build import prepare_store
    from myxtts.synthetic import make_demo_data
    from myxtts.train.tts import train

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
    prepare_store(data, root / "store", cfg, workers=1, progress=False,  # no fork of pytest
                  echo=lambda *a: None)
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
    # Runs (demo settings, 2100 steps, seeds 1234 / 7) reached mel 0.352 / 0.350, post-net
    # 0.308 / 0.304, guided 0.019 / 0.019.
    assert val["val/post_l1"] < 0.35, val
    assert val["val/mel_l1"] < 0.40, val
    assert val["val/guided"] < 0.04, val  # attention is near the diagonal


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

    synth = Synthesizer.from_checkpoint(trained["run"], device="cpu")
    tok, lengths, ref, ref_len = _inputs(trained, n)
    torch.manual_seed(0)
    mels, out_len = synth.model.generate(tok, lengths, torch.zeros(len(tok), dtype=torch.long),
                                         ref, ref_len)
    val = FeatureStore.open(trained["store"], "val")
    truths = [np.asarray(val.mel(i), dtype=np.float32) for i in range(len(tok))]
    # "right voice, wrong words": another utterance of the same speaker (the reference clip)
    others = [np.asarray(val.mel(int(val.refs(i)[0])), dtype=np.float32) for i in range(len(tok))]
    return mels.numpy(), out_len.numpy(), truths, others, synth


@pytest.fixture(scope="module")
def free_running(trained):
    return _free_running(trained, n=8)


def test_free_running_synthesis_stops_near_the_true_length(free_running):
    mels, out_len, truths, _, synth = free_running
    ratios = np.array([out_len[b] / t.shape[0] for b, t in enumerate(truths)])
    # Every sentence stops by itself within +-15 % of its true length (an untrained model
    # never stops: it runs into the max-length guard). Runs: 0.94-1.07 (seed 1234),
    # 0.95-1.08 (seed 7), medians 0.99 / 1.03.
    assert np.all(out_len < synth.cfg.model.max_decoder_frames), out_len
    assert np.all(np.abs(ratios - 1) < 0.15), ratios
    assert abs(np.median(ratios) - 1) < 0.05, ratios


def test_free_running_mels_are_close_to_the_ground_truth(free_running):
    from myxtts.metrics.dtw import dtw_l1

    mels, out_len, truths, others, synth = free_running
    std = synth.model.mel_std.numpy()
    model = np.array([dtw_l1(mels[b, :out_len[b]], t, std) for b, t in enumerate(truths)])
    wrong_words = np.array([dtw_l1(o, t, std) for o, t in zip(others, truths)])
    # DTW-aligned normalised log-mel L1 (see myxtts.metrics.dtw), medians over the 8
    # sentences. Baselines: the same speaker saying another sentence (real speech, right
    # voice, wrong words) 0.56; an untrained model 0.58; a constant mean frame 0.66.
    # Runs: 0.258 (seed 1234), 0.259 (seed 7). Earlier settings: pure teacher forcing (r=3,
    # 800 steps of 3000 frames) free-ran into a blurred mean spectrum (0.68); with frame
    # dropout + self-feed, r=4, 1600 steps and transformer dropout 0.1: 0.376-0.416.
    assert np.median(model) < 0.33, (model, wrong_words)
    assert np.median(model) < 0.6 * np.median(wrong_words), (model, wrong_words)


def estimate_f0(wav: np.ndarray, sample_rate: int, fmin: float = 60.0, fmax: float = 400.0,
                harmonics: int = 8, decay: float = 0.84) -> float:
    """Median f0 over voiced frames by subharmonic summation (Hermes, 1988): each candidate
    f0 scores the weighted spectral magnitude at its first ``harmonics`` multiples.

    Why not autocorrelation: on Griffin-Lim output the 2nd harmonic of loud vowels often
    dominates, and autocorrelation then reads an octave up (measured: a 114 Hz voice read
    223-230 Hz on those frames); summing all harmonics favours the true fundamental."""
    frame, hop, n_fft = 2048, 512, 4096
    window = np.hanning(frame)
    candidates = np.arange(fmin, fmax + 0.5, 1.0)  # [C] Hz
    bins = np.rint(np.outer(np.arange(1, harmonics + 1), candidates) * n_fft / sample_rate)
    bins = bins.astype(int)  # [H, C]
    weights = decay ** np.arange(harmonics)  # [H]
    f0s = []
    for start in range(0, len(wav) - frame, hop):
        x = wav[start:start + frame]
        if float(np.dot(x, x)) < 1e-3:  # silence and near-silence: no pitch
            continue
        mag = np.abs(np.fft.rfft(x * window, n_fft))
        f0s.append(candidates[int(np.argmax(weights @ mag[bins]))])
    return float(np.median(f0s)) if f0s else float("nan")


def test_voice_follows_the_reference_speaker_also_unseen(trained):
    from myxtts.inference.synthesizer import Synthesizer
    from myxtts.synthetic import demo_speaker_f0

    synth = Synthesizer.from_checkpoint(trained["run"], device="cpu")
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
    # Pitch follows the reference: right order, each within 20 % of the reference voice.
    # Runs: 112/149/226 Hz (seed 1234) and 112/146/224 Hz (seed 7) for 114/162 (held
    # out)/231 Hz; all ten voices 90-260 Hz came out within 10 % of their reference.
    assert measured[low] < measured[HELD_OUT] < measured[high], (measured, expected)
    for s in measured:
        assert abs(measured[s] / expected[s] - 1) < 0.20, (measured, expected)
