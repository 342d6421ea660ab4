"""Tensor-parallel reports: per-rank rows and totals in report.json, the spread, and `check` rank by rank."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from cgtool.capture.ranks import rank_spread
from cgtool.commands.main import app
from cgtool.documents.compare import compare_reports
from cgtool.documents.results import load_report, write_report
from cgtool.errors import InputError
from cgtool.reports.capture_view import print_capture_summary
from cgtool.reports.csv import sizes_frame
from cgtool.reports.html import report_html

FIXTURES = Path(__file__).parent / "data" / "reports"
TP1 = load_report(FIXTURES / "h100-llama-3.1-8b")
MIB = 1 << 20


def tp2_report():
    """The fixture's rows as rank 0's, a copy of them as rank 1's, both ranks' totals."""
    report = copy.deepcopy(TP1)
    report.settings.tp_size = 2
    report.sizes = report.sizes + [dataclasses.replace(s, rank=1) for s in report.sizes]
    report.rank_totals = [copy.deepcopy(report.totals), copy.deepcopy(report.totals)]
    return report


def _row(report, kind, size, rank):
    return next(s for s in report.sizes if (s.kind, s.size, s.rank) == (kind, size, rank))


def test_tp2_report_round_trips_with_per_rank_rows_and_totals(tmp_path):
    report = tp2_report()
    write_report(report, tmp_path / "report.json")
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["settings"]["tp_size"] == 2 and len(data["rank_totals"]) == 2
    assert {row["rank"] for row in data["sizes"]} == {0, 1}
    assert load_report(tmp_path) == report


def test_tp1_report_is_written_without_rank_totals(tmp_path):
    write_report(TP1, tmp_path / "report.json")
    assert "rank_totals" not in json.loads((tmp_path / "report.json").read_text())
    assert load_report(tmp_path).rank_totals == []


def test_sizes_of_reads_one_rank_rank_0_by_default():
    report = tp2_report()
    assert {s.rank for s in report.sizes_of("decode")} == {0}
    assert len(report.sizes_of("decode", 1)) == len(TP1.sizes_of("decode")) == 36


@pytest.mark.parametrize(("change", "field"), [
    (lambda d: d["sizes"][-1].update(rank=2), r"sizes\[83\]\.rank"),
    (lambda d: d["rank_totals"].pop(), "rank_totals"),
    (lambda d: d["settings"].update(tp_size=0), "settings.tp_size"),
])
def test_inconsistent_ranks_are_refused_naming_the_field(tmp_path, change, field):
    write_report(tp2_report(), tmp_path / "report.json")
    data = json.loads((tmp_path / "report.json").read_text())
    change(data)
    (tmp_path / "report.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match=field):
        load_report(tmp_path)


def test_spread_names_the_rank_that_differs():
    report = tp2_report()
    _row(report, "decode", 8, 1).retained_bytes += 3 * MIB
    _row(report, "decode", 8, 0).replay_ms += 0.5
    spread = {(r.kind, r.size): r for r in rank_spread(report)}
    assert len(spread) == 42
    row = spread[("decode", 8)]
    assert row.spread["retained_bytes"] == 3 * MIB and row.highest_rank["retained_bytes"] == 1
    assert row.spread["replay_ms"] == pytest.approx(0.5) and row.highest_rank["replay_ms"] == 0
    assert spread[("decode", 16)].spread["retained_bytes"] == 0
    assert rank_spread(TP1) == []


def test_check_compares_rank_by_rank():
    current = tp2_report()
    row = _row(current, "decode", 128, 1)
    row.retained_bytes = int(row.retained_bytes * 1.10)
    current.rank_totals[1].graph_pool_bytes = int(current.rank_totals[1].graph_pool_bytes * 1.10)
    result = compare_reports(tp2_report(), current)
    assert [c.label for c in result.regressions] == ["decode bs 128 rank 1", "total rank 1"]
    assert len(result.changes) == 2 * 42 + 2  # every size of both ranks, and both ranks' totals


def test_a_size_failing_on_one_rank_only_is_a_regression_of_that_rank():
    current = tp2_report()
    _row(current, "piecewise", 4096, 1).status = "unsafe"
    result = compare_reports(tp2_report(), current)
    assert [(c.label, c.note) for c in result.regressions] == [
        ("piecewise 4096 tokens rank 1", "ok -> unsafe")]


def test_cli_check_exits_1_naming_the_rank(tmp_path):
    current = tp2_report()
    grown = _row(current, "decode", 64, 1)
    grown.retained_bytes += 200 * MIB
    # As in a real run, the capture's peak, rank 1's pool and its free memory move with it.
    grown.peak_bytes += 200 * MIB
    current.rank_totals[1].graph_pool_bytes += 200 * MIB
    current.rank_totals[1].free_after_capture_bytes -= 200 * MIB
    write_report(tp2_report(), tmp_path / "base.json")
    write_report(current, tmp_path / "cur.json")
    result = CliRunner().invoke(app, ["check", str(tmp_path / "base.json"), str(tmp_path / "cur.json")])
    assert result.exit_code == 1
    assert "decode bs 64 rank 1" in result.output


def test_summary_html_and_csv_show_every_rank_and_the_spread(tmp_path):
    report = tp2_report()
    _row(report, "decode", 8, 1).retained_bytes += 3 * MIB
    console = Console(record=True, width=200)
    print_capture_summary(console, report, None, [])
    text = console.export_text()
    assert "decode graphs per rank" in text and "Totals per rank" in text
    assert "Spread between ranks" in text and "3.0 (r1)" in text
    assert "Tensor parallelism: 2 ranks" in report_html(report, [])
    frame = sizes_frame(report)
    assert len(frame) == 84 and set(frame["rank"]) == {0, 1}
    per_rank = frame.groupby("rank")["cumulative_retained_bytes"].max()
    assert per_rank[1] - per_rank[0] == 3 * MIB


def test_tp1_summary_has_no_rank_tables():
    console = Console(record=True, width=200)
    print_capture_summary(console, TP1, None, [])
    assert "per rank" not in console.export_text()
