"""Vocoder benchmark: training speed and re-synthesis quality against Griffin-Lim (the
baseline, measured in the same run). Streaming latency is measured by ``longform.py``.

    python benchmarks/vocoder.py [--data DIR] [--steps N] [--gan-steps M] [--preset tiny|base]
                                 [--listen DIR]

1. Prepares DATA (default ../shared/data/ljspeech-mini, else a generated demo corpus) with
   audio, then trains the vocoder exactly as ``myxtts train-vocoder`` does: ``--steps``
   reconstruction steps (``vocoder.disc_start``), then ``--gan-steps`` with the
   discriminators. Steps/s and segments/s per phase are the medians of the logged intervals.
2. Quality on held-out utterances (the val split): mel L1 and multi-resolution STFT distance
   of the re-synthesis from ground-truth mels, Griffin-Lim vs the vocoder (lower = closer;
   ratio = vocoder / Griffin-Lim), PESQ (wide-band, 16 kHz) where the ``pesq`` package imports.
   ``--listen DIR`` also writes 4 of them as recording / Griffin-Lim / vocoder wavs with a
   spectrogram sheet each (the material for a listening note).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import LABEL, prepare, say  # noqa: E402


def prepare_with_audio(data: Path | None, tmp: Path) -> tuple[Path, Path]:
    from myxtts.config import load_config

    return prepare(data, None, tmp, load_config(overrides=["data.store_audio=true"]),
                   " (with audio)")


def phase_speed(run: Path, first: int, last: int) -> tuple[float, float]:
    """Median steps/s and segments/s of the logged intervals with first < step <= last."""
    steps, segs = [], []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if first < row.get("step", 0) <= last and "train/steps_per_s" in row:
            steps.append(row["train/steps_per_s"])
            segs.append(row["train/utterances_per_s"])
    return (statistics.median(steps), statistics.median(segs)) if steps else (float("nan"),) * 2


def pesq_score(store, indices, vocode, device) -> float | None:
    try:
        from pesq import pesq
    except ImportError:
        return None
    import soxr

    from myxtts.audio.io import PCM16_SCALE

    scores = []
    for i in indices:
        ref = store.audio(i).astype(np.float32) / PCM16_SCALE
        mel = torch.from_numpy(store.mel(i).astype(np.float32))[None].to(device)
        deg = vocode(mel)[0, : len(ref)].float().cpu().numpy()
        sr = store.manifest["audio"]["sample_rate"]
        scores.append(pesq(16000, soxr.resample(ref, sr, 16000), soxr.resample(deg, sr, 16000), "wb"))
    return float(np.mean(scores))


def spectrogram_image(wav: np.ndarray, sample_rate: int, label: str, top_hz: float = 4000.0):
    """Grey-scale |STFT| in dB (70 dB range, 2048-point window, 128 hop) from 0 to
    ``top_hz``, low frequencies at the bottom, with ``label`` above it. Linear frequency and
    a long window, not the mel: harmonics and what lies between them (where Griffin-Lim's
    phase errors and a vocoder's buzz show) are resolved."""
    from PIL import Image, ImageDraw

    x = torch.from_numpy(np.asarray(wav, np.float32))
    spec = torch.stft(x, 2048, 128, window=torch.hann_window(2048), center=True,
                      return_complex=True).abs()  # [1025, frames]
    rows = int(top_hz / (sample_rate / 2048))
    db = 20 * torch.log10(spec[:rows] + 1e-6)
    level = ((db - db.max() + 70.0) / 70.0).clamp(0.0, 1.0).flip(0).numpy()  # [rows, frames]
    img = Image.fromarray((255 * level).astype(np.uint8)).resize((level.shape[1] * 2, rows))
    canvas = Image.new("L", (img.width, img.height + 14), 255)
    canvas.paste(img, (0, 14))
    ImageDraw.Draw(canvas).text((2, 1), label, fill=0)
    return canvas


def write_listening_set(folder: Path, store, indices, vocoders: dict, audio, device: torch.device
                        ) -> list[str]:
    """For each utterance: the recording and every vocoder's re-synthesis as wavs, and one
    PNG with their spectrograms stacked (recording on top; where pillow imports). Why: the
    numbers say how close, the files let a person hear and see how it differs."""
    from myxtts.audio.io import PCM16_SCALE, save_wav

    folder.mkdir(parents=True, exist_ok=True)
    try:
        from PIL import Image
    except ImportError:
        Image = None
    written = []
    for n, i in enumerate(indices):
        mel = torch.from_numpy(np.asarray(store.mel(i), np.float32))[None].to(device)
        samples = mel.shape[1] * audio.hop_length
        clips = {"recording": store.audio(i)[:samples].astype(np.float32) * (1.0 / PCM16_SCALE)}
        with torch.no_grad():
            for name, vocode in vocoders.items():
                clips[name] = vocode(mel)[0, :samples].float().cpu().numpy()
        for name, wav in clips.items():
            save_wav(folder / f"{n:02d}_{name.replace(' ', '_')}.wav", wav, audio.sample_rate)
        written.append(f"{n:02d}_*.wav ({store.ids[i]})")
        if Image is not None:
            rows = [spectrogram_image(wav, audio.sample_rate, name) for name, wav in clips.items()]
            sheet = Image.new("L", (max(r.width for r in rows), sum(r.height for r in rows)), 255)
            for k, r in enumerate(rows):
                sheet.paste(r, (0, sum(q.height for q in rows[:k])))
            sheet.save(folder / f"{n:02d}_spectrograms.png")
    return written


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_arguments(p, presets=None, store=None, steps=None, rounds=None, batch_frames=None,
                         threads=None, set=None)
    p.add_argument("--preset", default=None, help="vocoder preset (default tiny on CPU, base on CUDA)")
    p.add_argument("--steps", type=int, default=1500, help="reconstruction-only steps")
    p.add_argument("--gan-steps", type=int, default=100, help="steps with the discriminators after")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    p.add_argument("--listen", type=Path, help="also write the val clips' recordings, "
                   "Griffin-Lim and vocoder re-syntheses (wav) and their log-mels (PNG) here")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    preset = args.preset or ("base" if cuda else "tiny")
    from myxtts.artifacts.vocoder import load_vocoder
    from myxtts.audio.griffin_lim import GriffinLim
    from myxtts.config import load_config
    from myxtts.data.store import FeatureStore
    from myxtts.train.vocoder.eval import pick_utterances, resynthesis_quality
    from myxtts.train.vocoder.recipe import train_vocoder

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        data, store_path = prepare_with_audio(args.data, tmp)
        run = tmp / "run"
        total = args.steps + args.gan_steps
        base = [f"vocoder.preset={preset}", f"vocoder.disc_start={args.steps}",
                f"train.output_dir={run}", f"train.device={device}", "train.warmup_steps=50",
                "train.log_every=25", f"train.val_every={total}", f"train.ckpt_every={total}",
                "train.synth_every=0", "train.tensorboard=false"]
        val = FeatureStore.open(store_path, "val")
        ids = pick_utterances(val, 8)
        gl = GriffinLim(load_config().audio).to(device)
        q_gl = resynthesis_quality(gl, val, ids, load_config().audio, device)
        p_gl = pesq_score(val, ids, gl, device)
        quality = []
        t0 = time.perf_counter()
        for phase, steps in (("reconstruction", args.steps), ("+ GAN", total)):
            if steps == 0 or (phase == "+ GAN" and args.gan_steps == 0):
                continue
            say(f"training the {preset} vocoder ({phase}) to step {steps}")
            cfg = load_config(overrides=base + [f"train.max_steps={steps}"])
            train_vocoder(cfg, store_path, progress=False)  # the GAN phase resumes the first
            gen = load_vocoder(run, cfg.audio, device)
            q = resynthesis_quality(gen, val, ids, cfg.audio, device)
            quality.append((f"after {steps} steps ({phase})", q,
                            pesq_score(val, ids, gen, device)))
        minutes = (time.perf_counter() - t0) / 60
        recon = phase_speed(run, 25, args.steps)
        gan = phase_speed(run, args.steps + 25, total)
        if args.listen:
            gen = load_vocoder(run, cfg.audio, device)
            names = write_listening_set(args.listen, val, ids[:4], {"griffin lim": gl, "vocoder": gen},
                                        cfg.audio, device)
            say(f"listening set in {args.listen}: {', '.join(names)}")
    dev = torch.cuda.get_device_name(0) if cuda else f"CPU, {torch.get_num_threads()} threads"
    lines = [f"data: {data}; device: {dev}; torch {torch.__version__}",
             f"vocoder {preset}: {args.steps} reconstruction + {args.gan_steps} GAN steps "
             f"in {minutes:.1f} min (validation included)", "",
             f"{'training':<{LABEL}} {'steps/s':>9} {'segments/s':>11}",
             f"{'  reconstruction (mel L1 + MR-STFT)':<{LABEL}} {recon[0]:9.1f} {recon[1]:11.1f}",
             *([f"{'  GAN (+ MPD/MRD, feature matching)':<{LABEL}} {gan[0]:9.1f} {gan[1]:11.1f}"]
               if args.gan_steps else []), "",
             f"{'re-synthesis of ' + str(len(ids)) + ' val utterances':<{LABEL}} "
             f"{'mel L1':>9} {'ratio':>6} {'MR-STFT':>9} {'ratio':>6} {'PESQ wb':>8}"]
    fmt = lambda p: "n/a" if p is None else f"{p:.3f}"  # noqa: E731
    lines.append(f"{'  Griffin-Lim (baseline)':<{LABEL}} {q_gl['mel_l1']:9.4f} {1:6.3f} "
                 f"{q_gl['stft_distance']:9.4f} {1:6.3f} {fmt(p_gl):>8}")
    for name, q, pq in quality:
        lines.append(f"{'  vocoder ' + name:<{LABEL}} {q['mel_l1']:9.4f} "
                     f"{q['mel_l1'] / q_gl['mel_l1']:6.3f} {q['stft_distance']:9.4f} "
                     f"{q['stft_distance'] / q_gl['stft_distance']:6.3f} {fmt(pq):>8}")
    if p_gl is None:
        lines.append("  (PESQ: n/a, the pesq package is not installed)")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
