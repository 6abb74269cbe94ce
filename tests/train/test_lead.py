"""The host runs at most MAX_LEAD_STEPS queued steps ahead of the GPU (on the store path
nothing else throttles it): after queuing a step the engine waits on the marker of the
step that many before it. Modelled with stand-in events; a CPU engine records none."""

from __future__ import annotations

import torch

from myxtts.model.xtts import build_model
from myxtts.train.distributed import DistInfo
from myxtts.train.engine import engine as engine_module
from myxtts.train.engine.lead import MAX_LEAD_STEPS, StepLead
from tests.helpers import micro_config
from tests.train.test_graphs import N_MELS, N_TOKENS, _batches


class Events:
    """Stand-in CUDA events: ``log`` holds ("record", k) / ("sync", k) in order."""

    def __init__(self) -> None:
        self.log, self.made = [], 0

    def __call__(self):
        k, log = self.made, self.log
        self.made += 1

        class Event:
            def record(self):
                log.append(("record", k))

            def synchronize(self):
                log.append(("sync", k))
        return Event()


def test_the_host_waits_once_it_is_max_lead_steps_ahead():
    events = Events()
    lead = StepLead(torch.device("cpu"), max_lead=2, event=events)
    for _ in range(5):
        lead.queued()
        assert lead.pending <= 2
    assert events.log == [("record", 0), ("record", 1), ("record", 2), ("sync", 0),
                          ("record", 3), ("sync", 1), ("record", 4), ("sync", 2)]
    lead.clear()
    assert lead.pending == 0


def test_a_cpu_engine_records_no_marker_and_a_gpu_style_one_is_bounded(tmp_path, one_thread,
                                                                       monkeypatch):
    cfg = micro_config(tmp_path, f"audio.n_mels={N_MELS}")
    cpu = torch.device("cpu")
    assert not StepLead(cpu).enabled  # a CPU step is synchronous: nothing to bound
    events = Events()
    monkeypatch.setattr(engine_module, "StepLead", lambda device: StepLead(device, event=events))
    engine = engine_module.TrainEngine(cfg, build_model(cfg, N_TOKENS, 1, None, None), cpu,
                                       DistInfo(), compile_model=False)
    for i in range(MAX_LEAD_STEPS + 3):
        engine.step(_batches(i, 1))
        records = sum(1 for kind, _ in events.log if kind == "record")
        syncs = sum(1 for kind, _ in events.log if kind == "sync")
        assert records == i + 1 and records - syncs <= MAX_LEAD_STEPS
    assert engine.read()  # the read waited for everything: no marker left pending
    engine.step(_batches(0, 1))
    assert [kind for kind, _ in events.log[-1:]] == ["record"]  # no wait right after a read


def test_the_markers_on_a_gpu_are_blocking_events(monkeypatch):
    """The host waits in the driver (a sleeping thread), not by spinning a core that the
    loader's workers and the checkpoint writer need."""
    made = []

    class Event:
        def __init__(self, **kwargs):
            made.append(kwargs)

        def record(self):
            pass

        def synchronize(self):
            pass

    monkeypatch.setattr(torch.cuda, "Event", Event)
    lead = StepLead(torch.device("cuda", 0))
    for _ in range(MAX_LEAD_STEPS + 1):
        lead.queued()
    assert made and all(kwargs.get("blocking") is True for kwargs in made)
