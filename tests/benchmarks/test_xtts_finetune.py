"""The XTTS fine-tuning benchmark's own helpers (no training, no coqui-tts): the dataset it
hands both sides keeps exactly the accepted clips, the JSON carries a ratio per worker
count, the table shows both sides or a dash where ours did not run, and the memory
helpers read this process."""

from __future__ import annotations

import importlib
import json
import sys

import pytest

from tests.helpers import REPO


@pytest.fixture(scope="module")
def bench():
    """``benchmarks/xtts_finetune.py`` as its siblings see it: their folder on the path."""
    folder = str(REPO / "benchmarks")
    sys.path.insert(0, folder)
    try:
        yield importlib.import_module("xtts_finetune")
    finally:
        sys.path.remove(folder)


def _run(workers: int, utt: float, rss: float) -> dict:
    return {"utterances_per_s": utt, "steps": 4, "batch_size": 3, "workers": workers,
            "seconds": 12 / utt, "peak_rss_mb": rss, "peak_pss_mb": rss / 2,
            "phases": {"loader": 1.0, "forward": 3.0}}


def test_only_the_accepted_clips_are_kept_in_their_order(bench):
    metadata = "LJ1|A b.|A b.\nLJ2|C; d|C; d\nLJ3|E|E\n"
    assert bench.keep_rows(metadata, ["LJ3", "LJ1"]) == "LJ1|A b.|A b.\nLJ3|E|E\n"
    assert bench.keep_rows(metadata, []) == ""


def test_the_json_has_a_ratio_per_worker_count_and_none_without_ours(bench):
    runs = {0: {"peer": _run(0, 2.0, 1000), "mine": _run(0, 5.0, 800)},
            2: {"peer": _run(2, 2.5, 2000), "mine": None}}
    out = json.loads(json.dumps(bench.figures(runs)))
    assert out["ratio_0_workers"] == pytest.approx(2.5)
    assert out["ratio_2_workers"] is None
    assert out["runs"]["0"]["mine"]["utterances_per_s"] == 5.0


def test_the_table_shows_both_sides_and_a_dash_where_ours_did_not_run(bench):
    runs = {0: {"peer": _run(0, 2.0, 1000), "mine": _run(0, 5.0, 800)},
            2: {"peer": _run(2, 2.5, 2000), "mine": None}}
    lines = bench.render(runs, ["head line"]).splitlines()
    assert lines[0] == "head line"
    assert lines[2].split()[:4] == ["workers", "myxtts", "utt/s", "coqui"]
    assert lines[4].split() == ["0", "5.00", "2.00", "2.50x", "800", "1000", "400", "500"]
    assert lines[5].split() == ["2", "-", "2.50", "-", "-", "2000", "-", "1000"]
    assert bench.phase_line("coqui", runs[0]["peer"]) == "  coqui, 0 workers: loader 17%, forward 50%"


def test_the_memory_helpers_read_this_process(bench):
    peer = importlib.import_module("_xtts_finetune_peer")
    mem = peer.peak_rss_mb()
    assert mem["peak_rss_mb"] == pytest.approx(mem["main_rss_mb"] + mem["workers_rss_mb"])
    assert mem["main_rss_mb"] > 0
    pss = peer.PssPeak(every=0.01).start()
    assert pss.stop() > 0


def test_rounds_combine_to_medians_with_the_median_of_each_rounds_ratio(bench):
    rounds = [{0: {"peer": _run(0, 2.0, 1000), "mine": _run(0, 5.0, 800)}},
              {0: {"peer": _run(0, 1.0, 1100), "mine": _run(0, 2.2, 900)}},
              {0: {"peer": _run(0, 3.0, 900), "mine": _run(0, 6.3, 700)}}]
    got = bench.combine(rounds)[0]
    assert got["round_ratios"] == pytest.approx([2.5, 2.2, 2.1])
    assert got["ratio"] == pytest.approx(2.2)  # not 5.0 / 2.0, the medians' ratio
    assert got["mine"]["utterances_per_s"] == 5.0 and got["peer"]["utterances_per_s"] == 2.0
    assert got["mine"]["peak_rss_mb"] == 900 and got["peer"]["peak_rss_mb"] == 1100
    assert bench.figures(bench.combine(rounds))["ratio_0_workers"] == pytest.approx(2.2)
    line = bench.render(bench.combine(rounds), ["h"]).splitlines()[4].split()
    assert line[:4] == ["0", "5.00", "2.00", "2.20x"]
