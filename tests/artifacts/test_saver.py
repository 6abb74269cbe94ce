"""Checkpoints saved in the background: what is written is the state at the moment of the
save (training may change its tensors right after), at most one save is in flight, a failed
save is raised at the next call with the previous checkpoint kept, and the files are those a
synchronous save writes."""

from __future__ import annotations

import threading

import pytest
import torch

from myxtts.artifacts import checkpoint as ck
from myxtts.artifacts.errors import ArtifactError
from myxtts.artifacts.runs import CheckpointManager
from myxtts.artifacts.saver import BackgroundSaver
from tests.helpers import full_disk_for_checkpoints


def _state(value: float) -> dict:
    return {"model": {"w": torch.full((4, 3), value), "b": torch.arange(3.0)},
            "optimizer": {"state": {0: {"exp_avg": torch.full((4, 3), value / 2)}}},
            ck.PROGRESS: {"step": int(value)}, "note": "plain values pass"}


class Gate:
    """Holds ``CheckpointManager.save`` in the background thread until opened; records the
    order of what happens."""

    def __init__(self, monkeypatch) -> None:
        self.open, self.log = threading.Event(), []
        real = CheckpointManager.save

        def held(manager, state, step, *a, **k):
            self.log.append(f"start {step}")
            assert self.open.wait(10)
            out = real(manager, state, step, *a, **k)
            self.log.append(f"done {step}")
            return out
        monkeypatch.setattr(CheckpointManager, "save", held)


def test_the_state_of_the_moment_is_written_while_training_changes_it(tmp_path, monkeypatch):
    gate = Gate(monkeypatch)
    saver = BackgroundSaver(CheckpointManager(tmp_path, keep_last=3))
    live = _state(1.0)
    path = saver.save(live, 1)
    with torch.no_grad():  # the next steps update the weights in place
        live["model"]["w"].add_(100.0)
        live["optimizer"]["state"][0]["exp_avg"].mul_(0.0)
    assert saver.busy and not path.exists()
    gate.open.set()
    saver.wait()
    saved = ck.load(path)
    assert torch.equal(saved["model"]["w"], torch.full((4, 3), 1.0))
    assert torch.equal(saved["optimizer"]["state"][0]["exp_avg"], torch.full((4, 3), 0.5))
    assert saved["note"] == "plain values pass" and (tmp_path / "latest.txt").read_text() == path.name


def test_at_most_one_save_is_in_flight(tmp_path, monkeypatch):
    gate = Gate(monkeypatch)
    saver = BackgroundSaver(CheckpointManager(tmp_path, keep_last=3))
    saver.save(_state(1.0), 1)
    second = threading.Thread(target=lambda: saver.save(_state(2.0), 2))
    second.start()
    second.join(0.3)
    assert second.is_alive() and gate.log == ["start 1"]  # the second waits for the first
    gate.open.set()
    second.join(10)
    saver.wait()
    assert gate.log == ["start 1", "done 1", "start 2", "done 2"]


def test_a_background_save_writes_what_a_synchronous_one_writes(tmp_path):
    state = _state(3.0)
    CheckpointManager(tmp_path / "sync", keep_last=2).save(state, 3, 0.5, is_best=True)
    saver = BackgroundSaver(CheckpointManager(tmp_path / "bg", keep_last=2))
    saver.save(state, 3, 0.5, is_best=True)
    saver.wait()
    for name in ("ckpt_00000003.pt", "best.pt", "latest.txt", "best.txt"):
        a, b = (tmp_path / "sync" / name), (tmp_path / "bg" / name)
        if name.endswith(".pt"):
            x, y = ck.load(a), ck.load(b)
            assert x.keys() == y.keys() and torch.equal(x["model"]["w"], y["model"]["w"])
        else:
            assert a.read_text() == b.read_text()


def test_a_failed_save_is_raised_at_the_next_call_and_the_previous_survives(tmp_path,
                                                                           monkeypatch):
    manager = CheckpointManager(tmp_path, keep_last=3)
    saver = BackgroundSaver(manager)
    saver.save(_state(1.0), 1)
    saver.wait()
    full_disk_for_checkpoints(monkeypatch)
    saver.save(_state(2.0), 2)
    saver._thread.join()  # (the failure happened; nobody has been told yet)
    with pytest.raises(ArtifactError, match=r"disk is full.*ckpt_00000001\.pt survives"):
        saver.check()
    saver.check()  # said once
    assert manager.latest().name == "ckpt_00000001.pt"
    saver.save(_state(3.0), 3)
    saver.wait(report=False)  # a run failing for another reason: forgotten, not raised
    saver.check()


def test_the_host_buffers_are_laid_out_once_in_chunks_and_each_entry_is_its_own(monkeypatch):
    """What a GPU save copies into: the entries (512-byte multiples) packed largest first
    into chunks of at most CHUNK bytes, each allocated at a power of two (what torch's
    pinned allocator would round it to anyway), so the region is not a doubling of the
    checkpoint; laid out ahead and reused while the entries keep their shapes and dtypes."""
    from myxtts.artifacts import saver

    monkeypatch.setattr(saver, "CHUNK", 4096)
    made = []

    def alloc(nbytes):
        made.append(nbytes)
        return torch.empty(nbytes, dtype=torch.uint8)

    items = [(("model", "w"), torch.ones(3, 5)),  # 60 bytes: 512
             (("model", "step"), torch.tensor(4)),  # 512
             (("optimizer", 0, "exp_avg"), torch.ones(1000, dtype=torch.bfloat16)),  # 2048
             (("optimizer", 1, "exp_avg"), torch.ones(1500)),  # 6000 bytes: its own chunk
             (("flags",), torch.ones(7, dtype=torch.bool))]  # 512
    buffers = saver.HostBuffers(alloc)
    buffers.reserve(items)
    assert made == [8192, 4096] and buffers.nbytes == 12288  # 6144 alone; 2048+512x3 = 3584
    views = buffers.views(items)
    assert made == [8192, 4096]  # the same layout: nothing allocated again
    for value, (key, t) in enumerate(items):
        assert views[key].shape == t.shape and views[key].dtype == t.dtype
        views[key].fill_(value)
    for value, (key, _) in enumerate(items):  # no entry overlaps another
        assert torch.equal(views[key], torch.full_like(views[key], value))
    grown = [*items[:2], (("optimizer", 0, "exp_avg"), torch.ones(1200, dtype=torch.bfloat16))]
    buffers.views(grown)  # a tensor changed shape: laid out anew
    assert made[2:] == [4096] and buffers.nbytes == 4096  # 2560 + 512 + 512
    buffers.close()
    assert buffers.nbytes == 0


def test_a_cpu_save_hands_no_event_over(tmp_path):
    """On a CPU the copy is done when save returns: nothing for the writer to wait for."""
    handed = []
    saver = BackgroundSaver(CheckpointManager(tmp_path, keep_last=2))
    saver.reserve(_state(1.0))  # nothing to lay out on a CPU
    path = saver.save(_state(1.0), 1, writes_after=handed.append)
    saver.close()
    assert handed == [] and ck.load(path)["model"]["w"][0, 0] == 1.0
