"""`myxtts profile` and `myxtts doctor` on an XTTS store (`myxtts prepare --xtts`): the profile
times XTTS-v2's fine-tuning step as `myxtts train STORE --init-from XTTS_DIR` runs it, the
CLI refuses what does not fit in one line, and the doctor verifies the store, shows the model
it was made for and blocks on a damaged file."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest
import torch

from myxtts.cli.main import main
from myxtts.config import load_config
from myxtts.diagnose.doctor import environment as env
from myxtts.diagnose.profile import run as profile_run
from myxtts.diagnose.profile.report import format_report
from myxtts.diagnose.profile.verdict import COMPUTE, INPUT, MEMORY
from myxtts.model.xtts_v2.gpt import XttsGpt
from myxtts.synthetic import make_demo_data
from myxtts.train.xtts.base import start_from_folder
from myxtts.train.xtts.prepare import prepare_xtts

pytestmark = pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")
SMALL = ["--device", "cpu", "--no-compile", "--precision", "fp32", "--num-workers", "0",
         "--batch-frames", "300", "--batch-size", "2", "--set", "text.languages=[en,fa]",
         "--set", "train.peak_tflops=1.0"]


@pytest.fixture(scope="module")
def store(reduced_folder, tmp_path_factory):
    """Two demo voices speaking English and Persian, as an XTTS store of the reduced model."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("xtts_diagnose")
    data = make_demo_data(root / "data", speakers=2, utterances=4, seed=4,
                          languages=("en", "fa"))
    prepare_xtts(data, root / "store", load_config(overrides=["text.languages=[en,fa]"]),
                 reduced_folder, workers=1, progress=False, echo=lambda *a: None)
    yield root / "store"
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def profiled(store, reduced_folder, tmp_path_factory):
    """`myxtts profile STORE --init-from XTTS_DIR --json`, 2 measured steps after 1 untimed."""
    run = tmp_path_factory.mktemp("xtts_profile") / "run"
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        mp.setattr(profile_run, "WARMUP_STEPS", 1)
        rc = main(["profile", str(store), "--init-from", str(reduced_folder), "--steps", "2",
                   "--json", "--output-dir", str(run), *SMALL])
    assert rc == 0, err.getvalue()
    return json.loads(out.getvalue()), run


@pytest.mark.slow
def test_profile_times_the_xtts_finetuning_step(profiled):
    p, run = profiled
    phases = p["phases"]
    for name in ("data wait", "forward", "backward", "optimizer", "other", "step"):
        assert name in phases and phases[name]["mean_s"] >= 0
    assert phases["forward"]["mean_s"] > 0 and phases["backward"]["mean_s"] > 0
    parts = sum(v["mean_s"] for k, v in phases.items() if k != "step")
    assert parts == pytest.approx(phases["step"]["mean_s"], rel=1e-9)
    assert p["steps"] == 2 and p["warmup_steps"] == 1
    assert sum(s["batches"] for s in p["shapes"]) == 2  # one micro-batch a step
    assert p["throughput"]["steps_per_s"] == pytest.approx(2 / p["seconds"])
    assert p["verdict"]["kind"] in (INPUT, MEMORY, COMPUTE) and p["verdict"]["advice"]
    assert not any("--model-size" in a for a in p["verdict"]["advice"])  # not for XTTS-v2
    assert not (run / "checkpoints").exists()  # a profile writes no checkpoint


def test_profile_describes_the_xtts_model_and_its_batches(profiled, store, reduced_folder):
    p, _ = profiled
    setup = p["setup"]
    assert setup["kind"] == "xtts_v2" and setup["preset"] is None
    assert setup["model"] == f"XTTS-v2 GPT of {reduced_folder}"
    base, gpt = start_from_folder(reduced_folder, store, 0)
    assert setup["parameters"] == sum(t.numel() for t in gpt.parameters())
    assert setup["batch_frames"] == 300 and setup["step_mode"] == "eager"
    widths = {b["frames"] for b in setup["batch_sizes"]}
    for s in p["shapes"]:  # an eager step's batches: cut to their longest row, in a bucket
        assert s["frames"] <= max(widths) and s["batch"] <= 2
    assert p["frames"] == "code positions" and p["shape_axes"] == "B x L_text x T_codes"
    assert 0 < p["padding_efficiency"] < 1  # codes against padded code positions
    # FLOPs: at least 6 x the blocks' weights x the padded code positions the window ran
    blocks = sum(t.numel() for t in XttsGpt(base.config).gpt.parameters() if t.dim() == 2)
    positions = sum(s["batch"] * s["frames"] * s["batches"] for s in p["shapes"])
    assert p["tflops"] * 1e12 * p["seconds"] > 6 * blocks * positions
    assert p["mfu"] == pytest.approx(p["tflops"] / 1.0)
    text = format_report(p)
    assert f"XTTS-v2 GPT of {reduced_folder} (" in text and "M parameters" in text
    assert "T_codes:batch" in text and "padded code positions are the clips' codes" in text
    assert "verdict: " + p["verdict"]["kind"].upper() in text


def _one_line_refusal(capsys, argv: list[str], *words: str) -> None:
    rc = main(argv)
    _, err = capsys.readouterr()
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err


def test_profile_refusals(store, reduced_folder, tmp_path, capsys):
    s, f = str(store), str(reduced_folder)
    _one_line_refusal(capsys, ["profile", s, "--steps", "1", *SMALL], "--init-from XTTS_DIR",
                      "--run RUN")
    _one_line_refusal(capsys, ["profile", str(tmp_path), "--init-from", f, "--steps", "1"],
                      "--init-from", "prepare --xtts")
    _one_line_refusal(capsys, ["profile", s, "--init-from", f, "--run", str(tmp_path)],
                      "give one of them")
    _one_line_refusal(capsys, ["profile", s, "--init-from", f, "--model-size", "tiny"],
                      "--model-size")
    _one_line_refusal(capsys, ["profile", s, "--run", str(tmp_path)],
                      "no XTTS-v2 fine-tuning run")


@pytest.mark.slow
def test_profile_run_profiles_a_fine_tuning_run_on_its_store(store, reduced_folder, tmp_path,
                                                           capsys):
    """`--run RUN` of an XTTS-v2 fine-tuning run profiles its model from its newest
    checkpoint, on its XTTS store; on data that is no XTTS store it is refused in one line."""
    run = tmp_path / "run"
    assert main(["train", str(store), "--init-from", str(reduced_folder), "--output-dir",
                 str(run), "--max-steps", "1", "--quiet", "--set", "train.ckpt_every=1",
                 *SMALL]) == 0
    capsys.readouterr()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(profile_run, "WARMUP_STEPS", 1)
        rc = main(["profile", str(store), "--run", str(run), "--steps", "1", "--json",
                   "--output-dir", str(tmp_path / "profiled"), *SMALL])
    out, err = capsys.readouterr()
    assert rc == 0, err
    p = json.loads(out)
    assert p["setup"]["kind"] == "xtts_v2" and p["steps"] == 1
    assert p["setup"]["model"] == f"XTTS-v2 GPT of {reduced_folder}"
    _one_line_refusal(capsys, ["profile", str(tmp_path), "--run", str(run)],
                      "fine-tunes XTTS-v2", "profile it on its XTTS store")


@pytest.fixture
def no_compile(monkeypatch):
    monkeypatch.setattr(env, "compile_probe", lambda device: 0.25)


def _doctor(capsys, *argv: str) -> tuple[int, list[str]]:
    rc = main(["doctor", *argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out.splitlines()


def _line(lines: list[str], name: str) -> str:
    return next(ln for ln in lines if ln[2:].startswith(f"{name}:"))


def test_doctor_on_a_good_xtts_store_shows_its_model(store, reduced_folder, capsys, no_compile):
    rc, lines = _doctor(capsys, str(store), "--init-from", str(reduced_folder),
                        "--num-workers", "1")
    assert all(ln[0] in "✔⚠-" for ln in lines[:-1]) and rc == 0
    found = _line(lines, "XTTS store")
    assert found.startswith("✔") and "verified" in found and "train +" in found
    identity = json.loads((store / "manifest.json").read_text())["identity"]
    model = _line(lines, "XTTS model")
    for key in ("dvae_sha256", "mel_stats_sha256", "vocab_sha256"):
        assert identity[key][:12] in model
    assert "languages en, fa" in model and f"{identity['number_text_tokens']} text" in model
    assert _line(lines, "--init-from").startswith("✔")
    assert "T_codes:batch" in _line(lines, "batches")
    assert "audio.i16" in _line(lines, "store read speed")
    assert "this XTTS store" in _line(lines, "/dev/shm")  # sized from its largest batch


def test_doctor_blocks_on_a_damaged_xtts_store(store, tmp_path, capsys, no_compile):
    bad = Path(shutil.copytree(store, tmp_path / "store"))
    codes = bad / "train" / "codes.i16"
    codes.write_bytes(codes.read_bytes()[:-10])
    rc, lines = _doctor(capsys, str(bad))
    line = _line(lines, "XTTS store")
    assert rc == 1 and line.startswith("✗") and str(codes) in line
    assert "--xtts XTTS_DIR" in line


def test_doctor_init_from_another_folder_blocks(store, tmp_path, capsys, no_compile):
    other = tmp_path / "other"
    other.mkdir()
    rc, lines = _doctor(capsys, str(store), "--init-from", str(other))
    assert rc == 1 and _line(lines, "--init-from").startswith("✗")
    _one_line_refusal(capsys, ["doctor", str(tmp_path), "--init-from", str(other)],
                      "only with a store of `myxtts prepare --xtts`")


def test_doctor_costs_the_batch_the_loader_of_the_run_builds(store):
    """On the CPU the loader makes the voice segments' cloning mels, so the doctor weighs
    that batch (its bytes: the mels, not the audio), and its worker rule sees what the
    loader's sees."""
    from myxtts.data.feed.loader import plan_frames
    from myxtts.data.xtts_store import XttsStore
    from myxtts.diagnose.doctor.xtts import check_xtts_store
    from myxtts.train.xtts.batches import XttsBatches, largest_batch_cost, xtts_plan, xtts_sampler

    cfg = load_config(overrides=["train.device=cpu", "text.languages=[en,fa]"])
    _, plan = check_xtts_store(store, cfg, None)
    train = XttsStore.open(store, "train")
    bplan = xtts_plan(train, cfg, plan_frames(cfg))
    seed = cfg.data.shuffle_seed

    def cost(stats):
        batches = XttsBatches(train, bplan, seed, cfg, mel_stats=stats)
        return largest_batch_cost(batches, xtts_sampler(train, bplan, seed))[1]

    assert plan.batch_cost[1] == cost(torch.ones(80)) != cost(None)
