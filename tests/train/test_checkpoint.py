"""Checkpoints: one progress record, atomic files, retention, safe loading, old formats."""

from __future__ import annotations

import math
import os

import pytest
import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.artifacts.errors import ArtifactError
from myxtts.artifacts.runs import CheckpointManager
from myxtts.model.xtts import build_model
from myxtts.train.distributed import DistInfo
from myxtts.train.engine import TrainEngine, lr_factor
from myxtts.train.tts import train
from tests.helpers import micro_config
from tests.train.test_graphs import N_TOKENS, _batches


@pytest.mark.slow
def test_checkpoint_contents_and_retention(micro_store, tmp_path):
    cfg = micro_config(tmp_path / "run", "train.max_steps=12", "train.keep_last=2")
    train(cfg, micro_store, progress=False)
    ckdir = tmp_path / "run" / "checkpoints"
    kept = sorted(p.name for p in ckdir.glob("ckpt_*.pt"))
    assert kept == ["ckpt_00000008.pt", "ckpt_00000012.pt"]
    assert (ckdir / "best.pt").is_file() and (ckdir / "latest.txt").read_text() == "ckpt_00000012.pt"
    state = ck.load(ckdir / "ckpt_00000012.pt")
    assert set(state) == {ck.FORMAT, ck.MODEL, ck.OPTIMIZER, ck.SCHEDULER, ck.SCALER, ck.RNG,
                          ck.PROGRESS, ck.CONFIG, ck.VOCAB, ck.MEL_MEAN, ck.MEL_STD, ck.EMA,
                          ck.NONFINITE}
    assert state[ck.FORMAT] == 3 and state[ck.NONFINITE] == {"steps": 0, "in_row": 0}
    progress = ck.TrainingProgress.from_state_dict(state[ck.PROGRESS])
    assert progress.step == 12 and state[ck.CONFIG]["train"]["keep_last"] == 2
    # 12 steps of ~7 batches per epoch: the data position is in the second epoch
    assert progress.epoch == 1 and 0 < progress.batches_consumed < 12
    assert progress.data_plan["world_size"] == 1 and math.isfinite(progress.best_val_loss)
    assert (tmp_path / "run" / "config.yaml").is_file() and (tmp_path / "run" / "vocab.json").is_file()


def test_corrupt_checkpoint_is_a_clear_error(tmp_path):
    bad = tmp_path / "ckpt_00000001.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ArtifactError, match="cannot be read"):
        ck.load(bad)


def _damage(path, how: str) -> None:
    if how == "empty":
        path.write_bytes(b"")
    else:  # truncated: a copy cut short, as a full disk or a killed copy leaves it
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("how, words", [("empty", "is empty (0 bytes"), ("truncated", "cannot be read (")])
@pytest.mark.slow
def test_damaged_checkpoints_are_skipped_by_auto_resume_and_named_when_explicit(
        micro_store, tmp_path, caplog, how, words):
    run = tmp_path / "run"
    overrides = ("train.ckpt_every=2", "train.val_every=100")
    train(micro_config(run, "train.max_steps=4", *overrides), micro_store, progress=False)
    newest = run / "checkpoints" / "ckpt_00000004.pt"
    _damage(newest, how)
    with pytest.raises(ArtifactError) as err:  # named explicitly: one line, the file and the fix
        ck.load(newest)
    assert words in str(err.value) and str(newest) in str(err.value)
    assert "\n" not in str(err.value) and str(err.value).endswith("resume from an older one")
    with caplog.at_level("INFO"):  # auto-resume: skipped with a warning, the one before used
        result = train(micro_config(run, "train.max_steps=6", *overrides), micro_store,
                       progress=False)
    assert result.step == 6 and "skipping a damaged checkpoint" in caplog.text
    assert "resuming from " + str(run / "checkpoints" / "ckpt_00000002.pt") in caplog.text
    _damage(newest, how)  # (the resumed run wrote a good step 4 again)
    with pytest.raises(ArtifactError, match=words.replace("(", r"\(")):
        train(micro_config(tmp_path / "other", "train.max_steps=6", *overrides), micro_store,
              resume=newest, progress=False)


def test_checkpoint_refuses_pickled_objects(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    path = tmp_path / "evil.pt"
    torch.save({ck.FORMAT: ck.FORMAT_VERSION, "x": Evil()}, path)
    with pytest.raises(ArtifactError):
        ck.load(path)


def test_progress_record_round_trips_and_refuses_other_layouts():
    p = ck.TrainingProgress(step=7, best_val_loss=0.5, epoch=2, batches_consumed=3,
                            data_plan={"seed": 0})
    assert ck.TrainingProgress.from_state_dict(p.state_dict()) == p
    with pytest.raises(ArtifactError, match=r"unknown keys \['extra'\]"):
        ck.TrainingProgress.from_state_dict({**p.state_dict(), "extra": 1})
    missing = p.state_dict()
    del missing["epoch"]
    with pytest.raises(ArtifactError, match="misses 'epoch'"):
        ck.TrainingProgress.from_state_dict(missing)


def _engine(tmp_path, *overrides) -> TrainEngine:
    cfg = micro_config(tmp_path, "audio.n_mels=16", *overrides)
    torch.manual_seed(0)
    return TrainEngine(cfg, build_model(cfg, N_TOKENS, 1, None, None), torch.device("cpu"),
                       DistInfo(), compile_model=False)


def _poisoned(seed: int) -> list[dict[str, torch.Tensor]]:
    batches = _batches(seed, 1)
    batches[0]["mel"][0, 0, 0] = float("nan")
    return batches


def test_an_engines_state_saved_and_loaded_is_the_same_state(tmp_path, one_thread):
    engine = _engine(tmp_path, "train.ema_decay=0.5")
    for batches in (_poisoned(0), _batches(1, 1), _poisoned(2)):
        engine.step(batches)
    progress = ck.TrainingProgress(step=3, epoch=0, batches_consumed=3)
    ck.save(tmp_path / "a.pt", ck.compose(progress, engine.state_dict(), {"extra": 3}))
    expected_draw = torch.rand(3)  # the random streams were saved before this draw

    state = ck.load(tmp_path / "a.pt")
    other = _engine(tmp_path / "o", "train.ema_decay=0.5")
    other.load_state_dict(state)  # the random streams too
    assert torch.equal(torch.rand(3), expected_draw)
    assert ck.TrainingProgress.from_state_dict(state[ck.PROGRESS]) == progress and state["extra"] == 3
    assert state[ck.NONFINITE] == {"steps": 2, "in_row": 1}
    want, got = engine.state_dict(), other.state_dict()
    for key in (ck.MODEL, ck.EMA):
        flat = [(k, v) for k, v in want[key].items() if isinstance(v, torch.Tensor)]
        assert flat and all(torch.equal(v, got[key][k]) for k, v in flat), key
    assert got[ck.SCHEDULER]["last_epoch"] == want[ck.SCHEDULER]["last_epoch"] == 3
    first = next(iter(want[ck.OPTIMIZER]["state"]))
    assert torch.equal(got[ck.OPTIMIZER]["state"][first]["exp_avg"],
                       want[ck.OPTIMIZER]["state"][first]["exp_avg"])
    assert other.nonfinite_counts() == (2, 1)  # the stop on diverging runs continues


def test_a_resumed_engine_draws_the_same_dropout_and_continues_the_counts(tmp_path, one_thread):
    """An engine loaded from another's state_dict (random streams and non-finite counts
    included) takes the next steps exactly as the one that saved it: the same dropout
    masks (bit for bit equal weights and losses), the same counts."""
    overrides = ("model.dropout=0.2", "model.frame_dropout=0.2", "train.self_feed=0.5",
                 "train.self_feed_after=1")
    engine = _engine(tmp_path, *overrides)
    for batches in (_batches(0, 1), _poisoned(1)):
        engine.step(batches)
    engine.read()
    ck.save(tmp_path / "c.pt", ck.compose(ck.TrainingProgress(step=2), engine.state_dict(), {}))
    for i in (2, 3):  # the run goes on
        engine.step(_batches(i, 1))
    torch.manual_seed(1234)  # whatever a restarted process drew before it resumes
    resumed = _engine(tmp_path / "r", *overrides)
    resumed.load_state_dict(ck.load(tmp_path / "c.pt"))
    for i in (2, 3):
        resumed.step(_batches(i, 1))
    assert resumed.read() == engine.read()
    assert resumed.nonfinite_counts() == engine.nonfinite_counts() == (1, 0)
    for (name, a), b in zip(engine.model.state_dict().items(),
                            resumed.model.state_dict().values()):
        assert torch.equal(a, b), f"{name} differs after the resume"


def test_format_2_checkpoints_load_with_their_counts_in_their_own_entry(tmp_path, one_thread):
    """A format-2 checkpoint (the non-finite counts inside the progress record) loads in the
    current layout and an engine continues its counts."""
    engine = _engine(tmp_path)
    state = ck.compose(ck.TrainingProgress(step=4, epoch=1), engine.state_dict(), {})
    v2 = {k: v for k, v in state.items() if k != ck.NONFINITE}
    v2[ck.PROGRESS] = {**state[ck.PROGRESS], "nonfinite_steps": 4, "nonfinite_in_row": 2}
    torch.save({ck.FORMAT: 2, **v2}, tmp_path / "v2.pt")
    loaded = ck.load(tmp_path / "v2.pt")
    assert loaded[ck.FORMAT] == ck.FORMAT_VERSION == 3
    assert loaded[ck.NONFINITE] == {"steps": 4, "in_row": 2}
    assert ck.TrainingProgress.from_state_dict(loaded[ck.PROGRESS]) == \
        ck.TrainingProgress(step=4, epoch=1)
    other = _engine(tmp_path / "o")
    other.load_state_dict(loaded)
    assert other.nonfinite_counts() == (4, 2)


def test_a_resumed_schedule_follows_the_config_not_the_checkpoint(tmp_path, one_thread):
    engine = _engine(tmp_path, "train.lr=1e-3", "train.warmup_steps=0")
    for i in range(2):
        engine.step(_batches(i, 1))
    state = ck.compose(ck.TrainingProgress(step=2), engine.state_dict(), {})
    other = _engine(tmp_path / "o", "train.lr=5e-4", "train.warmup_steps=0")
    other.load_state_dict(state)
    want = 5e-4 * lr_factor(2, other.cfg.train)
    assert [g["lr"] for g in other.state_dict()[ck.OPTIMIZER]["param_groups"]] == \
        pytest.approx([want, want])
    assert other.state_dict()[ck.SCHEDULER]["base_lrs"] == [5e-4, 5e-4]


def test_the_random_streams_of_only_the_training_device_are_saved(monkeypatch):
    """A CPU run on a GPU machine records no GPU stream (and touches no CUDA): a checkpoint
    saved with every visible GPU's stream could not be restored where fewer are visible."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def no_cuda(*args, **kwargs):
        raise AssertionError("a CPU run read a GPU's random stream")

    monkeypatch.setattr(torch.cuda, "get_rng_state_all", no_cuda)
    monkeypatch.setattr(torch.cuda, "get_rng_state", no_cuda)
    assert set(ck.rng_state(torch.device("cpu"))) == {"torch", "python"}
    assert set(ck.rng_state()) == {"torch", "python"}
    ck.set_rng_state({**ck.rng_state(), "cuda": [torch.zeros(8, dtype=torch.uint8)] * 8},
                     torch.device("cpu"))  # an old checkpoint's streams: a CPU run skips them


def test_each_ddp_rank_resumes_its_own_random_streams(tmp_path):
    """A DDP checkpoint keeps every rank's streams and each rank takes its own back (a
    single-process resume takes rank 0's); from an older checkpoint without them, ranks
    other than 0 keep their own seeded streams instead of all copying rank 0's."""
    streams = []
    for seed in (10, 11):  # what rank 0 and rank 1 held at the save
        torch.manual_seed(seed)
        streams.append(ck.rng_state())
    draws = []
    for st in streams:
        ck.set_rng_state(st)
        draws.append(torch.rand(3))
    ck.set_rng_state(streams[0])
    ck.save(tmp_path / "ddp.pt", ck.compose(ck.TrainingProgress(step=1),
                                            {ck.RNG: ck.rng_state()}, {}, streams))
    state = ck.load(tmp_path / "ddp.pt")
    for rank in (0, 1):
        torch.manual_seed(99)
        ck.restore_rng(state, None, rank, 2)
        assert torch.equal(torch.rand(3), draws[rank])
    ck.restore_rng(state)  # one process: rank 0's
    assert torch.equal(torch.rand(3), draws[0])

    legacy = {k: v for k, v in state.items() if k != ck.RNG_RANKS}
    torch.manual_seed(99)
    expected = torch.rand(3)
    torch.manual_seed(99)
    ck.restore_rng(legacy, None, 1, 2)
    assert torch.equal(torch.rand(3), expected)
    ck.restore_rng(legacy, None, 0, 2)
    assert torch.equal(torch.rand(3), draws[0])
    single = ck.compose(ck.TrainingProgress(step=1), {}, {}, None)
    assert ck.RNG_RANKS not in single


@pytest.mark.gpu
def test_a_gpu_stream_goes_back_to_the_training_gpu():
    device = torch.device("cuda", torch.cuda.current_device())
    state = ck.rng_state(device)
    expected = torch.rand(4, device=device)
    ck.set_rng_state(state, device)
    assert torch.equal(torch.rand(4, device=device), expected)
    old_format = {**state, "cuda": [state["cuda"]]}  # one stream per visible GPU, as before
    ck.set_rng_state(old_format, device)
    assert torch.equal(torch.rand(4, device=device), expected)


def test_a_bf16_or_fp32_checkpoint_resumes_with_loss_scaling(tmp_path):
    """A run without loss scaling saves an empty scaler state; resumed in fp16 (a GPU
    without bf16) its scaler starts fresh instead of refusing the empty state."""
    state = _engine(tmp_path, "train.precision=fp32").state_dict()
    assert state[ck.SCALER] == {}
    fp16 = _engine(tmp_path / "h", "train.precision=fp16")
    fresh = fp16.state_dict()[ck.SCALER]
    fp16.load_state_dict(ck.compose(ck.TrainingProgress(), state, {}))
    assert fresh and fp16.state_dict()[ck.SCALER] == fresh


def test_a_failed_save_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    path = tmp_path / "ckpt_00000001.pt"
    ck.save(path, {"weights": torch.arange(4)})
    before = path.read_bytes()

    def broken_save(obj, f, *args, **kwargs):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        ck.save(path, {"weights": torch.arange(8)})
    assert path.read_bytes() == before and sorted(tmp_path.iterdir()) == [path]


def test_manager_keeps_the_newest_and_the_best(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2)
    for step, val in ((1, 3.0), (2, 1.0), (3, 2.0), (4, 2.5)):
        manager.save({"step": step}, step, val, is_best=val == 1.0)
    assert [p.name for p in manager.step_paths()] == ["ckpt_00000003.pt", "ckpt_00000004.pt"]
    assert manager.latest() == tmp_path / "ckpt_00000004.pt"
    assert ck.load(tmp_path / "best.pt")["step"] == 2
    assert (tmp_path / "best.txt").read_text().startswith("ckpt_00000002.pt val_loss=1.0")


def test_format_1_checkpoints_still_load_and_resume_where_they_stood(tmp_path):
    """Checkpoints written before the progress record (format 1) load into the current layout."""
    sampler = {"version": 1, "epoch": 3, "position": 5, "num_batches": 9, "seed": 0,
               "world_size": 1, "num_buckets": 4, "plan": "abc", "fingerprint": "def"}
    old = {ck.FORMAT: 1, "model": {}, "step": 40, "best_val_loss": 0.7, "sampler": sampler,
           "counters": {"nonfinite_steps": 2.0, "epoch": 3}, ck.CONFIG: {}}
    torch.save(old, tmp_path / "old.pt")
    state = ck.load(tmp_path / "old.pt")
    assert state[ck.FORMAT] == ck.FORMAT_VERSION and "sampler" not in state and "step" not in state
    p = ck.TrainingProgress.from_state_dict(state[ck.PROGRESS])
    assert (p.step, p.best_val_loss, p.epoch, p.batches_consumed) == (40, 0.7, 3, 5)
    assert state[ck.NONFINITE] == {"steps": 2, "in_row": 0}
    assert p.data_plan == {k: v for k, v in sampler.items() if k not in ("epoch", "position")}
