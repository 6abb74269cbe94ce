"""The XTTS fine-tuning benchmark's own helpers (no training, no coqui-tts): the dataset it
hands both sides keeps exactly the accepted clips, turns add up and pair into ratios, the
JSON carries a ratio per worker count, the table shows both sides, a side process answers
commands whatever else it prints, and the memory helpers read this process."""

from __future__ import annotations

import importlib
import json
import sys
import textwrap

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


def _turn(utterances: int, seconds: float, loader: float = 0.5) -> dict:
    return {"seconds": seconds, "steps": 2, "utterances": utterances, "cpu_seconds": 1.0,
            "phases": {"loader": loader, "forward": seconds - loader}, "loss": seconds}


def _memory(workers: int, rss: float) -> dict:
    return {"peak_rss_mb": rss, "peak_pss_mb": rss / 2, "workers": workers, "batch_size": 3}


def _entry(bench, workers: int) -> dict:
    mine = [_turn(6, 1.0), _turn(6, 2.0), _turn(5, 1.0)]
    peer = [_turn(6, 3.0), _turn(6, 2.0), _turn(6, 3.0)]
    return bench.entry(mine, peer, {"mine": _memory(workers, 800), "peer": _memory(workers, 1000)})


def test_only_the_accepted_clips_are_kept_in_their_order(bench):
    metadata = "LJ1|A b.|A b.\nLJ2|C; d|C; d\nLJ3|E|E\n"
    assert bench.keep_rows(metadata, ["LJ3", "LJ1"]) == "LJ1|A b.|A b.\nLJ3|E|E\n"
    assert bench.keep_rows(metadata, []) == ""


def test_turns_add_up_to_the_ratio_and_each_pair_is_a_ratio_of_its_own(bench):
    got = _entry(bench, 0)
    assert got["ratio"] == pytest.approx((17 / 4) / (18 / 8))  # all turns: 4.25 / 2.25 utt/s
    # pairs: (6/1)/(6/3) = 3, (6/2)/(6/2) = 1, (5/1)/(6/3) = 2.5
    assert got["pair_ratios"] == pytest.approx([3.0, 1.0, 2.5])
    assert got["pairs_median"] == pytest.approx(2.5)
    assert got["cpu_pair_ratios"] == pytest.approx([1.0, 1.0, 5 / 6])  # by CPU time: 1 s each
    mine = got["mine"]
    assert mine["utterances"] == 17 and mine["steps"] == 6 and mine["seconds"] == 4.0
    assert mine["utterances_per_s"] == pytest.approx(17 / 4)
    assert mine["phases"] == pytest.approx({"loader": 1.5, "forward": 2.5})
    assert mine["loss"] == 1.0 and mine["peak_rss_mb"] == 800
    assert [t["seconds"] for t in got["turns"]["peer"]] == [3.0, 2.0, 3.0]
    with pytest.raises(ValueError):  # a side with a turn fewer is an error, not a short list
        bench.pair_ratios([_turn(6, 1.0)], [_turn(6, 1.0), _turn(6, 1.0)])


def test_the_json_has_a_ratio_per_worker_count(bench):
    out = json.loads(json.dumps(bench.figures({0: _entry(bench, 0), 2: _entry(bench, 2)})))
    assert out["ratio_0_workers"] == pytest.approx(4.25 / 2.25)
    assert out["ratio_2_workers"] == pytest.approx(4.25 / 2.25)
    assert out["runs"]["2"]["peer"]["utterances_per_s"] == pytest.approx(18 / 8)
    assert out["runs"]["0"]["pair_ratios"] == pytest.approx([3.0, 1.0, 2.5])


def test_the_table_shows_both_sides_their_ratio_and_the_pairs(bench):
    runs = {0: _entry(bench, 0)}
    lines = bench.render(runs, ["head line"]).splitlines()
    assert lines[0] == "head line"
    assert lines[2].split()[:4] == ["workers", "myxtts", "utt/s", "coqui"]
    assert lines[4].split() == ["0", "4.25", "2.25", "1.89x", "2.50x", "1.00-3.00", "800", "1000",
                                "400", "500"]
    assert bench.phase_line("coqui", runs[0]["peer"]) == "  coqui, 0 workers: loader 19%, forward 81%"


def test_a_side_answers_its_commands_whatever_else_it_prints(bench, tmp_path):
    script = tmp_path / "side.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO / "benchmarks")!r})
        from _xtts_finetune_peer import serve

        class Fake:
            def steps(self, n):
                print("a library's log line")  # goes to stderr, never among the answers
                return {{"seconds": 1.0, "steps": n, "utterances": 3 * n}}

            def epoch(self):
                return self.steps(7)

            def finish(self):
                return {{"peak_rss_mb": 1.0}}

        print("printed before serving")
        print(1)  # JSON, but no answer: answers are objects
        serve(Fake)
    """))
    side = bench.Side("a fake side", [sys.executable, str(script)], tmp_path / "log.txt")
    assert side.answer() == {"ready": True}
    assert side.ask("steps 4") == {"seconds": 1.0, "steps": 4, "utterances": 12}
    assert side.ask("epoch")["utterances"] == 21
    assert side.finish() == {"peak_rss_mb": 1.0}
    assert side.proc.returncode == 0
    assert "a library's log line" in (tmp_path / "log.txt").read_text()


def test_a_side_that_dies_is_named_with_the_end_of_its_log(bench, tmp_path):
    side = bench.Side("a broken side", [sys.executable, "-c", "import sys; sys.exit('no model')"],
                      tmp_path / "log.txt")
    with pytest.raises(SystemExit, match="(?s)a broken side stopped \\(exit 1\\).*no model"):
        side.answer()


def test_the_memory_helpers_read_this_process(bench):
    peer = importlib.import_module("_xtts_finetune_peer")
    mem = peer.peak_rss_mb()
    assert mem["peak_rss_mb"] == pytest.approx(mem["main_rss_mb"] + mem["workers_rss_mb"])
    assert mem["main_rss_mb"] > 0
    pss = peer.PssPeak(every=0.01).start()
    assert pss.stop() > 0
