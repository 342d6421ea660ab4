"""A plan's comparison and memory tables: one builder, the same rows in every view."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest
from rich.console import Console

from cgtool.documents.plan_document import Plan
from cgtool.documents.results import load_plan
from cgtool.reports.html import plan_html
from cgtool.reports.plan_tables import plan_comparison_rows, plan_memory_rows
from cgtool.reports.plan_view import comparison_table, memory_table
from cgtool.reports.render import printed_tables

ROOT = Path(__file__).resolve().parents[1]
OLD_PLAN = ROOT / "tests" / "data" / "reports" / "plan-llama-3.1-8b"
NEW_PLAN = ROOT / "tests" / "data" / "plans" / "plan-1.3-example.json"


def _tp2(plan: Plan) -> Plan:
    data = plan.to_dict()
    data["inputs"]["tp_size"] = data["memory"]["tp_size"] = 2
    data["memory"]["kv_heads_per_rank"] = 4
    return Plan.from_dict(data)


def _cells(fitted) -> list[list[str]]:
    # A wide console: the table comes as one rich Table, whose cells are read back.
    (table,) = fitted.tables(Console(width=300), 300)
    columns = [list(map(str, column._cells)) for column in table.columns]
    return [list(row) for row in zip(*columns)]


@pytest.fixture(params=["1.0 plan", "1.1 plan", "--tp 2"])
def plan(request) -> Plan:
    if request.param == "1.0 plan":
        return load_plan(OLD_PLAN)
    return load_plan(NEW_PLAN) if request.param == "1.1 plan" else _tp2(load_plan(NEW_PLAN))


@pytest.mark.parametrize(
    "build, terminal", [(plan_comparison_rows, comparison_table), (plan_memory_rows, memory_table)]
)
def test_terminal_html_and_report_show_the_builders_rows_in_order(plan, build, terminal):
    data = build(plan)
    assert _cells(terminal(plan)) == data.rows
    assert terminal(plan).data.title == data.title
    assert any(t.rows == data.rows and t.title == data.title for t in printed_tables(plan))
    page = html.unescape(plan_html(plan, []))
    at = 0
    for row in data.rows:  # every row in the page, in the builder's order
        at = page.index(f"<td>{row[0]}</td>", at)
        for cell in row[1:]:
            assert f"<td>{cell}</td>" in page
    assert data.title in page


def test_the_comparison_puts_plan_and_default_side_by_side_per_metric():
    data = plan_comparison_rows(load_plan(NEW_PLAN))
    assert data.columns == ["", "plan", "default"]
    assert [data.rows[i][0] for i in sorted(data.headings)] == [
        "step time", "graphs: set by the sizes",
        "KV cache: set by the memory fraction, not the sizes"]
    tp2 = plan_comparison_rows(_tp2(load_plan(NEW_PLAN)))
    assert "  of the step: all-reduces (estimated)" in [row[0] for row in tp2.rows]


def test_an_old_plan_shows_a_dash_where_it_lacks_a_figure():
    rows = {r[0]: r[1:] for r in plan_memory_rows(load_plan(OLD_PLAN)).rows}
    assert rows["vLLM --gpu-memory-utilization"][0] == "-"
    assert rows["TRT-LLM free_gpu_memory_fraction"][0] == "-"
    assert all(cell.strip() for cells in rows.values() for cell in cells)


def test_a_plan_with_a_profile_adds_the_predicted_and_measured_graph_row():
    data = json.loads(NEW_PLAN.read_text())
    data["memory"]["graph_bytes_predicted"], data["memory"]["graph_bytes_measured"] = 3 << 30, 2 << 30
    rows = {r[0]: r[1:] for r in plan_memory_rows(Plan.from_dict(data)).rows}
    assert rows["report's graphs: predicted, measured"] == ["3.00 GiB", "2.00 GiB (+50% off)"]


def test_plan_html_puts_each_flag_and_each_comment_on_its_own_line():
    plan = load_plan(NEW_PLAN)
    plan.flags["sglang"] = ["--cuda-graph-bs-decode 1 2 4", "--mem-fraction-static 0.88",
                            "# assumes SGLANG_ENABLE_POST_CAPTURE_KV_SIZING=0"]
    page = html.unescape(plan_html(plan, []))
    block = page.split("<b>sglang</b><pre>", 1)[1].split("</pre>", 1)[0]
    assert block.splitlines() == ["--cuda-graph-bs-decode 1 2 4 \\", "--mem-fraction-static 0.88",
                                  "# assumes SGLANG_ENABLE_POST_CAPTURE_KV_SIZING=0"]
