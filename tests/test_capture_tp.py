"""merge_rank_partials: what interrupted ranks sent, put together into one report (no GPU)."""

from __future__ import annotations

import json
from pathlib import Path

from cgtool.capture.tp import merge_rank_partials
from cgtool.documents.results import CaptureReport

REPORT = Path(__file__).parent / "data" / "reports" / "h100-llama-3.1-8b" / "report.json"


def _rank_partial(rank: int, sizes: int) -> dict:
    data = json.loads(REPORT.read_text())
    data["settings"]["tp_size"] = 2
    data["sizes"] = data["sizes"][:sizes]
    data["totals"]["kv_tokens"] = 1000 + rank  # tells the ranks' totals apart
    data["status"], data["incomplete_reason"] = "incomplete", "interrupted"
    return data


def test_every_ranks_rows_are_kept_under_its_rank_with_its_totals():
    report = merge_rank_partials({1: _rank_partial(1, 2), 0: _rank_partial(0, 3)}, 2,
                                 "interrupted by SIGINT")
    assert report is not None and report.status == "incomplete"
    assert report.incomplete_reason == "interrupted by SIGINT"
    assert [row.rank for row in report.sizes] == [0, 0, 0, 1, 1]
    assert [t.kv_tokens for t in report.rank_totals] == [1000, 1001]
    assert CaptureReport.from_dict(report.to_dict()).sizes == report.sizes  # loads back


def test_a_rank_that_sent_nothing_is_named_and_no_partial_totals_are_invented():
    report = merge_rank_partials({0: _rank_partial(0, 2)}, 2, "interrupted by SIGTERM")
    assert report is not None
    assert report.incomplete_reason == (
        "interrupted by SIGTERM; rank 1 sent nothing (see its rank log)")
    assert report.rank_totals == [] and {row.rank for row in report.sizes} == {0}
    CaptureReport.from_dict(report.to_dict())


def test_no_partials_means_no_report():
    assert merge_rank_partials({}, 2, "interrupted by SIGINT") is None
