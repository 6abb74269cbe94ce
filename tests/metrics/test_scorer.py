"""Summaries and the table: means per metric, error rates pooled, RTF as time over audio,
a metric nobody computed printed as '-'."""

from __future__ import annotations

import math

import pytest

from myxtts.metrics.asr import ErrorCounts
from myxtts.metrics.scorer import ClipScores, packages, summarize
from myxtts.metrics.table import table


def test_summaries_pool_error_rates_and_leave_out_what_was_not_measured():
    a = ClipScores(errors=ErrorCounts(1, 10, 1, 2), similarity=0.8,
                   truth={"mcd_db": 2.0, "f0_rmse_cents": math.nan, "voicing_error": 0.1,
                          "duration_ratio": 1.2}, seconds=2.0, synthesis_s=1.0)
    b = ClipScores(errors=ErrorCounts(9, 30, 3, 6), similarity=0.6,
                   truth={"mcd_db": 4.0, "f0_rmse_cents": 50.0, "voicing_error": 0.3,
                          "duration_ratio": 0.8}, seconds=6.0, synthesis_s=1.0)
    s = summarize([a, b])
    assert s["cer"] == pytest.approx(10 / 40) and s["wer"] == pytest.approx(4 / 8)
    assert s["similarity"] == pytest.approx(0.7) and s["mcd_db"] == pytest.approx(3.0)
    assert s["f0_rmse_cents"] == 50.0  # the NaN of a clip without voiced pairs is left out
    assert s["rtf"] == pytest.approx(2 / 8) and s["utterances"] == 2
    assert s["ovrl"] is None  # nobody ran DNSMOS
    assert a.flat()["rtf"] == pytest.approx(0.5) and ClipScores(seconds=1.0).flat()["rtf"] is None


def test_the_table_prints_a_block_per_language_and_dashes_for_the_missing():
    rows = {"model": {"cer": 0.5, "mcd_db": 3.25, "rtf": 0.4, "utterances": 2.0},
            "truth": {"cer": 0.25, "mcd_db": 0.0, "rtf": None, "utterances": 2.0}}
    lines = table({"en": rows}).splitlines()
    assert lines[0].split()[:3] == ["CER", "WER", "SIM"]
    assert lines[1] == "en (2 utterances)"
    model = lines[2].split()
    assert model[:3] == ["model", "0.500", "-"] and "3.25" in model and model[-1] == "0.40"
    assert lines[3].split()[-1] == "-"


def test_the_packages_each_family_needs():
    assert packages("pocketsphinx") == ["pocketsphinx", "resemblyzer", "speechmos",
                                        "onnxruntime", "librosa"]
    assert packages("none", speaker=False, mos=False) == []
    assert packages("whisper:small", mos=False) == ["resemblyzer"]
