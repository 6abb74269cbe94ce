"""Bad inputs around synthesis and long waits: synthesis does what it says (a stream is the
whole output, long text is decoded and written window by window, samples run in fp32, the
demo's references are long enough), nothing hangs (a signal inside a long accumulation cycle,
absurd step counts), a closed output ends cleanly, the monitor never writes into a run.
Style of tests/test_bad_inputs.py: exit code, one line, no traceback, nothing written lost."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
import torch

from myxtts.cli.main import main
from myxtts.inference import longform
from myxtts.inference.synthesizer import Synthesizer
from myxtts.train.tts import BatchStream, train
from tests.helpers import MICRO_MODEL, micro_config

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def run(micro_store, tmp_path_factory) -> Path:
    """2 micro steps; the decoder never stops, so every piece decodes to 48 frames and any
    piece of several words is split again."""
    out = tmp_path_factory.mktemp("synth") / "run"
    train(micro_config(out, "train.max_steps=2", "model.max_decoder_frames=48"), micro_store,
          progress=False)
    return out


@pytest.fixture(scope="module")
def ref(micro_store) -> Path:
    return sorted((micro_store.parent / "data" / "wavs").glob("*.wav"))[0]


def _one_error_line(err: str) -> None:
    assert "Traceback" not in err, err
    assert len([ln for ln in err.splitlines() if ": error: " in ln]) == 1, err


# ------------------------------------------------------------ synthesis does what it says

def test_stream_is_the_whole_output_for_several_sentences_and_a_split_one(run, ref):
    synth = Synthesizer.from_checkpoint(run, device="cpu")
    text = "lamo tesi kunapo. miresu fato. kali."  # the first two must be split (never stop)
    [whole] = synth.synthesize([text], [ref], seed=3)
    streamed = np.concatenate(list(synth.stream(text, [ref], seed=3)))
    assert np.array_equal(streamed, whole)
    # nothing cut: every word got its own piece of 48 frames
    hop = synth.cfg.audio.hop_length
    assert whole.size >= 6 * 48 * hop


@pytest.mark.slow
def test_long_text_is_decoded_window_by_window_and_written_as_it_goes(run, ref, tmp_path,
                                                                        capsys):
    synth = Synthesizer.from_checkpoint(run, device="cpu")
    words = ["lamo", "tesi", "kali", "miresu", "fato", "pana"]
    text = " ".join(f"{w}." for w in words * 4)  # 24 one-word sentences
    batches: list[int] = []
    decode = synth.synthesize_mel
    synth.synthesize_mel = lambda texts, *a, **k: (batches.append(len(texts)), decode(texts, *a, **k))[1]
    first = next(iter(synth.speak([text], [ref], "en")))
    assert batches == [1] and first[0] == 0  # the first audio after one sentence, not the text
    parts = list(synth.speak([text], [ref], "en"))
    assert max(batches) <= longform.MAX_BATCH and len(parts) == 24
    src = tmp_path / "chapter.txt"
    src.write_text(text, encoding="utf-8")
    out = tmp_path / "chapter.wav"
    assert main(["synthesize", "-c", str(run), "-r", str(ref), "--text-file", str(src), "-o",
                 str(out), "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert "synthesised 1/24 sentences" in err and "synthesised 24/24 sentences" in err
    wav, _ = sf.read(out, dtype="float32")
    assert len(wav) == sum(p.size for _, p in parts)


def test_samples_are_synthesised_in_fp32_even_inside_autocast(tmp_path):
    from myxtts.config import load_config
    from myxtts.train.samples import synthesize_samples

    seen = []

    class Stop(Exception):
        pass

    def generate(*a, **k):
        seen.append(torch.is_autocast_enabled("cpu"))
        raise Stop

    model = SimpleNamespace(generate=generate)
    keys = ("tokens", "token_lengths", "language_ids", "ref_mel", "ref_lengths")
    data = SimpleNamespace(synth_batch={k: torch.zeros(1) for k in keys}, synth_names=["a"])
    engine = SimpleNamespace(model=model, evaluating=contextlib.nullcontext)
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(Stop):
        synthesize_samples(engine, data, load_config(), None, 1, tmp_path,
                           torch.device("cpu"), 0)
    assert seen == [False]


def test_demo_references_are_long_enough_for_the_synthesizer(tmp_path):
    from myxtts.audio.io import load_audio
    from myxtts.cli.demo import _reference_clip
    from myxtts.config import load_config
    from myxtts.synthetic import make_demo_data

    cfg = load_config()
    data = make_demo_data(tmp_path / "d", speakers=2, utterances=8, seed=0)
    need = cfg.data.ref_frames // 2 * cfg.audio.hop_length  # Synthesizer.reference's rule
    for spk in ("spk0", "spk1"):
        clip = _reference_clip(data, spk)
        speech = {p: len(load_audio(p, cfg.audio)) for p in (data / "wavs").glob(f"{spk}_*.wav")}
        assert speech[clip] >= need, clip
        # the clip most likely to pass: the longest (the first or last may be the shortest)
        assert speech[clip] == max(speech.values()), clip


# ------------------------------------------------------------ nothing hangs

def test_a_signal_inside_a_long_accumulation_cycle_stops_between_micro_batches(
        micro_store, tmp_path, monkeypatch):
    real_iter = BatchStream.__iter__

    def signalling(self):
        for k, item in enumerate(real_iter(self)):
            if k == 3:  # the first batch of the second cycle of 3 has been handed out
                os.kill(os.getpid(), signal.SIGTERM)
            yield item

    monkeypatch.setattr(BatchStream, "__iter__", signalling)
    cfg = micro_config(tmp_path / "run", "train.max_steps=3", "train.grad_accum_steps=3",
                       "data.batch_frames=600")
    result = train(cfg, micro_store, progress=False)
    assert result.stopped_by_signal and result.step == 1  # not waited out to step 2
    from myxtts.artifacts import checkpoint as ck
    from myxtts.artifacts.runs import CheckpointManager
    saved = ck.load(CheckpointManager(tmp_path / "run" / "checkpoints", 1).latest())
    assert saved[ck.PROGRESS]["step"] == 1
    assert saved[ck.PROGRESS]["batches_consumed"] == 3  # the dropped cycle is read on resume


def test_absurd_step_counts_are_refused(micro_store, tmp_path, capsys):
    sets = [a for item in [*MICRO_MODEL, "train.device=cpu", "data.num_workers=0",
                           "train.tensorboard=false", "train.grad_accum_steps=100000"]
            for a in ("--set", item)]
    assert main(["train", str(micro_store), "--output-dir", str(tmp_path / "r"), "--quiet",
                 "--max-steps", "1", *sets]) == 2
    err = capsys.readouterr().err
    _one_error_line(err)
    assert "train.grad_accum_steps=100000" in err and "batches of an epoch" in err
    assert main(["profile", str(micro_store), "--steps", "10000000"]) == 2
    err = capsys.readouterr().err
    _one_error_line(err)
    assert "--steps 10000000" in err


# ------------------------------------------------------------ closed outputs, the monitor

def _synth_cmd(run: Path, ref: Path) -> str:
    return (f"{sys.executable} -m myxtts.cli.main synthesize -c {run} -r {ref} --device cpu "
            f"-t 'lamo tesi. miresu fato. kali.' --stream -o -")


def _env() -> dict:
    import myxtts

    src = Path(myxtts.__file__).resolve().parents[1]  # the package under test
    return {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_stream_into_a_closed_pipe_ends_quietly_and_a_full_disk_is_one_line(run, ref):
    pipe = subprocess.run(["bash", "-c", f"{_synth_cmd(run, ref)} 2>err.txt | head -c 100 "
                           f"> /dev/null; echo ${{PIPESTATUS[0]}}"], cwd=run.parent,
                          capture_output=True, text=True, timeout=300, env=_env())
    err = (run.parent / "err.txt").read_text()
    assert pipe.stdout.strip() == "0" and "Traceback" not in err and "Error" not in err, err
    full = subprocess.run(["bash", "-c", f"{_synth_cmd(run, ref)} > /dev/full"],
                          capture_output=True, text=True, timeout=300, env=_env())
    assert full.returncode == 2, full.stderr
    _one_error_line(full.stderr)
    assert "standard output" in full.stderr


def test_monitor_log_never_writes_into_the_run(run, capsys):
    metrics = run / "metrics.jsonl"
    before = hashlib.sha256(metrics.read_bytes()).hexdigest()
    for log in (metrics, run / "monitor.csv", run / "checkpoints" / "m.jsonl"):
        assert main(["monitor", str(run), "--log", str(log), "--count", "1",
                     "--interval", "0.01"]) == 2
        err = capsys.readouterr().err
        _one_error_line(err)
        assert "inside the run folder" in err
    assert hashlib.sha256(metrics.read_bytes()).hexdigest() == before
    assert not (run / "monitor.csv").exists() and not (run / "checkpoints" / "m.jsonl").exists()
