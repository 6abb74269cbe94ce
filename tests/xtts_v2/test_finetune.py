"""Fine-tuning XTTS-v2 (``myxtts train STORE --init-from XTTS_DIR``) on a store of
``myxtts prepare --xtts``: a stopped and resumed run is bit-exact, Persian grows the model with
its old rows unchanged, the exported folder loads in coqui-tts and speaks as ``myxtts
synthesize --greedy`` does, and fine-tuning lowers the held-out code loss on real speech."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.artifacts.runs import CheckpointManager
from myxtts.cli.common import config_file
from myxtts.cli.main import main
from myxtts.config import load_config
from myxtts.synthetic import make_demo_data
from myxtts.train.xtts.prepare import prepare_xtts
from myxtts.train.xtts.recipe import XttsRecipe, train_xtts
from tests.xtts_v2.reference import fix_reference_generation, load_reference
from tests.xtts_v2.test_speak import CODES, TEXT, _reference_say, _reference_voice

LJSPEECH_MINI = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "ljspeech-mini"
pytestmark = pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")


def _config(out: Path, *overrides: str):
    """The xtts-finetune config, small and fast: a few steps, eager, on the CPU."""
    return load_config(config_file("xtts-finetune"), None, [
        f"train.output_dir={out}", "train.device=cpu", "train.compile=off",
        "train.precision=fp32", "train.max_steps=4", "train.log_every=2", "train.ckpt_every=2",
        "train.val_every=1000", "train.lr=1e-4", "data.num_workers=0", "data.batch_frames=400",
        "data.max_batch_size=3", "text.languages=[en,fa]", *overrides])


@pytest.fixture(scope="module")
def store(reduced_folder, tmp_path_factory):
    """Two demo voices speaking English and Persian, as an XTTS store of the reduced model."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("xtts_finetune")
    data = make_demo_data(root / "data", speakers=2, utterances=5, seed=4,
                          languages=("en", "fa"))
    prepare_xtts(data, root / "store", load_config(overrides=["text.languages=[en,fa]"]),
                 reduced_folder, workers=1, progress=False, echo=lambda *a: None)
    yield root / "store"
    torch.set_num_threads(threads)


def _newest(out: Path) -> dict:
    return ck.load(CheckpointManager(out / "checkpoints", 5).latest())


@pytest.mark.slow
def test_stopped_and_resumed_run_is_bit_exact(store, reduced_folder, tmp_path):
    straight = tmp_path / "straight"
    train_xtts(_config(straight), store, init_from=reduced_folder, progress=False)
    stopped = tmp_path / "stopped"
    train_xtts(_config(stopped, "train.max_steps=2"), store, init_from=reduced_folder,
               progress=False)
    train_xtts(_config(stopped), store, progress=False)  # the same folder: continues
    a, b = _newest(straight), _newest(stopped)
    assert a[ck.PROGRESS]["step"] == b[ck.PROGRESS]["step"] == 4
    assert a[ck.MODEL].keys() == b[ck.MODEL].keys()
    for name, weight in a[ck.MODEL].items():
        assert torch.equal(weight, b[ck.MODEL][name]), name
    first = _newest(straight)[ck.MODEL]["gpt.mel_head.weight"]
    start = torch.load(reduced_folder / "model.pth", weights_only=True)["model"]
    assert not torch.equal(first, start["gpt.mel_head.weight"])  # it trained


def test_persian_grows_the_model_and_keeps_its_old_rows(store, reduced_folder, tmp_path):
    recipe = XttsRecipe(_config(tmp_path / "run"), store, init_from=reduced_folder,
                        show_progress=False)
    recipe.setup()
    released = torch.load(reduced_folder / "model.pth", weights_only=True)["model"]
    old = released["gpt.text_embedding.weight"]
    gpt = recipe.engine.model.gpt
    assert "fa" in recipe.base.config.languages
    assert gpt.text_embedding.weight.shape[0] > old.shape[0]
    assert gpt.text_embedding.weight.shape[0] == recipe.base.config.number_text_tokens
    for key, rows in (("gpt.text_embedding.weight", gpt.text_embedding.weight),
                      ("gpt.text_head.weight", gpt.text_head.weight),
                      ("gpt.text_head.bias", gpt.text_head.bias)):
        assert torch.equal(rows[:old.shape[0]].detach(), released[key]), key
    new = gpt.text_embedding.weight[old.shape[0]:].detach()
    assert torch.isfinite(new).all() and new.std() > 0
    recipe.cleanup()


@pytest.mark.slow
def test_exported_run_loads_in_coqui_and_speaks_as_synthesize(store, reduced_folder, tmp_path):
    run = tmp_path / "run"
    train_xtts(_config(run, "train.max_steps=2"), store, init_from=reduced_folder,
               progress=False)
    out = tmp_path / "exported"
    assert main(["export", str(run), "--format", "xtts", "-o", str(out)]) == 0
    ref = load_reference(out)
    fix_reference_generation(ref)
    trained = _newest(run)[ck.MODEL]
    got = {f"gpt.{k}": v for k, v in ref.gpt.state_dict().items()
           if not k.startswith(("gpt_inference.", "gpt.wte."))}
    for name, weight in trained.items():
        torch.testing.assert_close(got[name], weight, rtol=0, atol=0)
    from myxtts.inference.xtts_v2.synthesizer import XttsV2Synthesizer

    clip = tmp_path / "ref.wav"
    _write_clip(clip)
    for source in (out, run):  # the exported folder and the run itself speak alike
        synth = XttsV2Synthesizer.from_path(source, device="cpu")
        synth.with_decoding(greedy=True, max_codes=CODES)
        latents, embedding = _reference_voice(ref, clip)
        expected = _reference_say(ref, latents, embedding)
        wav, _ = synth.say(TEXT, synth.voice([clip]), "en")
        assert wav.shape == expected.shape
        assert np.abs(wav - expected).max() < 1e-4


def _write_clip(path: Path) -> None:
    import soundfile as sf

    t = np.arange(16000 * 4) / 16000
    wav = 0.3 * np.sin(2 * np.pi * (120 + 20 * np.sin(2 * np.pi * 0.5 * t)) * t)
    sf.write(path, wav.astype(np.float32), 16000, subtype="PCM_16")


@pytest.mark.skipif(not LJSPEECH_MINI.is_dir(), reason="ljspeech-mini is not on this machine")
@pytest.mark.slow
def test_fine_tuning_lowers_the_held_out_code_loss_on_real_speech(reduced_folder, tmp_path):
    """20 LJSpeech clips (those the reduced model's small vocabulary can spell), 4 held out:
    their code loss falls after 12 steps."""
    data = tmp_path / "lj"
    (data / "wavs").mkdir(parents=True)
    rows = [r for r in (LJSPEECH_MINI / "metadata.csv").read_text(encoding="utf-8").splitlines()
            if not any(ch in r.split("|")[-1] for ch in "';:()\"")][:20]
    for r in rows:
        name = r.split("|")[0]
        shutil.copy(LJSPEECH_MINI / "wavs" / f"{name}.wav", data / "wavs" / f"{name}.wav")
    (data / "metadata.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    store = tmp_path / "store"
    prepare_xtts(data, store, load_config(overrides=["data.val_fraction=0.2",
                                                     "data.min_val_utterances=4"]),
                 reduced_folder, workers=1, progress=False, echo=lambda *a: None)
    cfg = _config(tmp_path / "run", "train.max_steps=12", "train.lr=3e-4",
                  "text.languages=[en]", "data.batch_frames=1200", "data.max_batch_size=6")
    recipe = XttsRecipe(cfg, store, init_from=reduced_folder, show_progress=False)
    recipe.setup()
    from myxtts.train.validation import validation_loss

    before = validation_loss(recipe.engine, recipe, recipe.device)
    recipe.train()
    after = validation_loss(recipe.engine, recipe, recipe.device)
    recipe.cleanup(finished=True)
    assert after["code_ce"] < before["code_ce"] - 0.1, (before, after)


def test_settings_without_meaning_here_and_a_missing_model_are_one_line(store, reduced_folder,
                                                                         tmp_path):
    from myxtts.train.errors import TrainError

    with pytest.raises(TrainError, match=r"train\.synth_every=5: not for XTTS-v2 .* set "
                                         r"train\.synth_every=0"):
        train_xtts(_config(tmp_path / "a", "train.synth_every=5"), store,
                   init_from=reduced_folder, progress=False)
    with pytest.raises(TrainError, match="give the model it was made for with --init-from"):
        train_xtts(_config(tmp_path / "b"), store, progress=False)
    assert not (tmp_path / "a" / "checkpoints").exists()


@pytest.mark.slow
def test_the_command_line_fine_tunes_and_the_run_is_an_xtts_model(store, reduced_folder,
                                                                   tmp_path, capsys):
    from myxtts.artifacts.xtts_v2 import is_xtts_v2

    run = tmp_path / "run"
    assert main(["train", str(store), "--init-from", str(reduced_folder), "--output-dir",
                 str(run), "--max-steps", "2", "--num-workers", "0", "--batch-frames", "400",
                 "--no-compile", "--device", "cpu", "--quiet", "--config", "finetune",
                 "--set", "train.ckpt_every=2"]) == 0
    said = capsys.readouterr().out  # finetune on an XTTS store: XTTS-v2's fine-tuning config
    assert "config xtts-finetune" in said and "trained to step 2" in said
    assert is_xtts_v2(run) and (run / "xtts-v2.json").is_file()
    state = _newest(run)
    assert state["config"]["train"]["lr"] == 5e-6  # the xtts-finetune config
    bundle = tmp_path / "mine.safetensors"
    assert main(["export", str(run), "-o", str(bundle)]) == 0 and bundle.stat().st_size > 0


def test_the_default_worker_count_is_chosen_and_trains(store, reduced_folder, tmp_path):
    """``data.num_workers=-1`` (the default) picks a count by the store's rule, then steps."""
    recipe = XttsRecipe(_config(tmp_path / "run", "data.num_workers=-1"), store,
                        init_from=reduced_folder, show_progress=False)
    recipe.setup()
    try:
        assert recipe.loader is not None and recipe.loader.num_workers >= 0
        recipe.run_steps(1)
        assert recipe.record.step == 1 and recipe.record.batches_consumed == 1
    finally:
        recipe.cleanup()


@pytest.mark.slow
def test_fine_tuning_logs_mfu_when_the_peak_is_known(store, reduced_folder, tmp_path):
    """With a peak to divide by, each log step carries the interval's TFLOP/s and MFU (the
    GPT step's FLOPs, counted on the meta device)."""
    import json

    out = tmp_path / "run"
    train_xtts(_config(out, "train.max_steps=2", "train.peak_tflops=0.5"), store,
               init_from=reduced_folder, progress=False)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in logged] == [2]
    assert logged[0]["train/tflops"] > 0
    assert logged[0]["train/mfu"] == pytest.approx(logged[0]["train/tflops"] / 0.5)


def test_cpu_batches_carry_the_segments_mels_the_step_would_make(store, reduced_folder):
    """On the CPU the loader makes the voice segments' cloning mels: the ones the step
    makes from the same segments' audio, which the batch then leaves out."""
    from myxtts.data.xtts_store import XttsStore
    from myxtts.model.xtts_v2.features import cloning_mel_spec, normalised_log
    from myxtts.train.xtts.batches import XttsBatches, xtts_plan

    cfg = _config(Path("unused"))
    train = XttsStore.open(store, "train")
    plan = xtts_plan(train, cfg, 400)
    stats = torch.rand(80) + 2.0
    audio = XttsBatches(train, plan, 5, cfg).batch(1, [0, 1, 2])
    mels = XttsBatches(train, plan, 5, cfg, mel_stats=stats).batch(1, [0, 1, 2])
    assert "cond_audio" not in mels and "cond_audio" in audio
    want = normalised_log(cloning_mel_spec()(audio["cond_audio"]), stats)
    assert torch.equal(mels["cond_mel"], want)
    for key in ("text", "codes", "cond_lengths", "cond_idxs"):
        assert torch.equal(mels[key], audio[key])


@pytest.mark.slow
def test_torchrun_two_ranks_fine_tune_in_step(store, reduced_folder, tmp_path):
    """DDP on the CPU (gloo): both ranks take the same steps over their own shares of the
    batches, rank 0 checkpoints once with both ranks' random streams, and the weights move."""
    import os
    import subprocess
    import sys

    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_port=29541", "-m", "myxtts.cli.main", "train", str(store), "--quiet",
           "--init-from", str(reduced_folder), "--output-dir", str(run), "--max-steps", "2",
           "--no-compile", "--device", "cpu"]
    for item in ("data.batch_frames=400", "data.max_batch_size=2", "data.num_workers=0",
                 "train.tensorboard=false", "train.log_every=2", "train.ckpt_every=2",
                 "train.val_every=1000", "train.lr=1e-4", "text.languages=[en,fa]"):
        cmd += ["--set", item]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stdout.count("trained to step 2") == 2  # both ranks reached the same step
    state = _newest(run)
    assert state[ck.PROGRESS]["data_plan"]["world_size"] == 2
    assert len(state[ck.RNG_RANKS]) == 2
    assert not torch.equal(state[ck.RNG_RANKS][0]["torch"], state[ck.RNG_RANKS][1]["torch"])
    from myxtts.artifacts.xtts_v2 import read_xtts_v2

    base = read_xtts_v2(reduced_folder).weights
    key = "gpt.conditioning_encoder.init.weight"  # the trainee's names are the released ones
    assert state[ck.MODEL][key].shape == base[key].shape
    assert not torch.equal(state[ck.MODEL][key], base[key])


def test_eager_batches_are_cut_to_their_longest_row(store):
    """For an eager step a batch is padded to its own longest text and code row, not its
    bucket's shape: the same rows, less padding (the losses do not depend on the widths:
    test_trainee)."""
    from myxtts.data.xtts_store import XttsStore
    from myxtts.train.xtts.batches import XttsBatches, gpt_code_lengths, xtts_plan

    cfg = _config(Path("unused"))
    train = XttsStore.open(store, "train")
    plan = xtts_plan(train, cfg, 400)
    rows = [0, 2, 3]
    bucket = XttsBatches(train, plan, 5, cfg).batch(1, rows)
    cut = XttsBatches(train, plan, 5, cfg, trim=True).batch(1, rows)
    width_t = int(train.text_lengths[rows].max())
    width_c = int(gpt_code_lengths(train.audio_lengths[rows]).max())
    assert cut["text"].shape == (3, width_t) and cut["codes"].shape == (3, width_c)
    assert bucket["text"].shape[1] >= width_t and bucket["codes"].shape[1] >= width_c
    assert bucket["text"].shape[1] + bucket["codes"].shape[1] > width_t + width_c  # cut
    assert torch.equal(cut["text"], bucket["text"][:, :width_t])
    assert torch.equal(cut["codes"], bucket["codes"][:, :width_c])
    assert not bucket["text"][:, width_t:].any() and not bucket["codes"][:, width_c:].any()
    for key in ("text_lengths", "code_lengths", "wav_lengths", "cond_audio", "cond_idxs"):
        assert torch.equal(cut[key], bucket[key])
