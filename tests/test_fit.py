"""reports/fit.py: tables in an 80- or 100-column terminal keep every number whole."""

from __future__ import annotations

import io
import re
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from cgtool.documents.compare import compare_reports
from cgtool.documents.results import load_plan, load_report
from cgtool.reports.fit import FittedTable
from cgtool.reports.plan_scenarios import plan_tables
from cgtool.reports.plan_view import plan_view
from cgtool.reports.render import printed_tables
from cgtool.reports.tables import TableData, comparison_rows, for_people, to_rich

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "tests" / "data" / "plans" / "plan-1.3-example.json"
REPORT = ROOT / "tests" / "data" / "reports" / "h100-llama-3.1-8b"
WIDTHS = (80, 100)


def _plan_with_compare():
    plan = load_plan(PLAN)
    current = [replace(r, schedule="current", expected_step_ms=r.expected_step_ms * 1.01)
               for r in plan.scenarios if r.schedule == "plan"]
    return replace(plan, scenarios=plan.scenarios + current,
                   inputs=replace(plan.inputs, compare_plan="old/plan.json"))


def _printed(renderables, width: int) -> str:
    console = Console(file=io.StringIO(), width=width)
    for renderable in renderables:
        console.print(renderable)
    return console.file.getvalue()


def _words(text: str) -> set[str]:
    return set(re.split(r"[\s│┃|]+", text))


def _numbers(tables: list[TableData]) -> set[str]:
    """Every word of every cell that holds a digit: each must be printed whole."""
    return {word for t in tables for row in for_people(t).rows for cell in row
            for word in str(cell).split() if any(ch.isdigit() for ch in word)}


def _cases():
    report = load_report(REPORT)
    plan = _plan_with_compare()
    return {
        "capture report": printed_tables(report),
        "check": [comparison_rows(compare_reports(report, report))],
        "plan": plan_tables(plan),
    }


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("case", ["capture report", "check", "plan"])
def test_no_number_is_cut_and_no_line_runs_past_the_terminal(case, width):
    tables = _cases()[case]
    text = _printed([to_rich(t) for t in tables], width)
    assert "…" not in text
    assert max(len(line.rstrip()) for line in text.splitlines()) <= width
    missing = _numbers(tables) - _words(text)
    assert not missing, sorted(missing)[:10]


@pytest.mark.parametrize("width", WIDTHS)
def test_the_plan_view_keeps_every_table_number_whole(width):
    plan = _plan_with_compare()
    text = _printed([plan_view(plan)], width)
    assert "…" not in text
    missing = _numbers(plan_tables(plan)[1:3]) - _words(text)  # comparison and held-out tables
    assert not missing, sorted(missing)[:10]


def test_a_table_too_wide_for_the_terminal_continues_with_its_label_column_repeated():
    data = TableData("wide", ["size", *(f"metric {i}" for i in range(12))],
                     [["decode bs 8", *(f"{1234567.891 * (i + 1):,.3f}" for i in range(12))]])
    tables = list(FittedTable(data).tables(Console(width=80), 80))
    assert len(tables) > 1
    assert all(t.columns[0].header == "size" for t in tables)
    assert sum(len(t.columns) - 1 for t in tables) == 12
    assert tables[1].title == "wide (continued)"


def test_a_table_that_fits_stays_one_table():
    data = TableData("narrow", ["", "value"], [["weights", "15,316.5 MiB"]])
    assert len(list(FittedTable(data).tables(Console(width=80), 80))) == 1
