"""plan.html and `cgtool report`: the held-out table, --compare-plan's scores and verdict,
the engine's own flag, clean cells, and figures a plan gains later shown without new code."""

from __future__ import annotations

import dataclasses
import html
import re
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from cgtool.documents.compare import compare_plan_warnings, plan_verdict
from cgtool.documents.plan_document import Plan, ScenarioScore
from cgtool.documents.results import load_plan
from cgtool.reports.html import plan_html
from cgtool.reports.plan_scenarios import plan_serving_rows, plan_tables
from cgtool.reports.plan_tables import plan_comparison_rows

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "tests" / "data" / "plans" / "plan-1.3-example.json"  # loads 1 and 2, held out


def _with_current(plan: Plan, factor: float) -> Plan:
    """The plan as `--compare-plan` leaves it: an old plan's sizes ("current") scored on
    every scenario, here with the expected step `factor` times the new plan's."""
    current = [replace(r, schedule="current", expected_step_ms=r.expected_step_ms * factor)
               for r in plan.scenarios if r.schedule == "plan"]
    inputs = replace(plan.inputs, compare_plan="old/plan.json")
    return replace(plan, scenarios=plan.scenarios + current, inputs=inputs)


def _table_cells(page: str) -> list[str]:
    return [html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", page, flags=re.DOTALL)]


def test_plan_html_cells_hold_no_python_lists_dicts_or_none():
    cells = _table_cells(plan_html(load_plan(PLAN), []))
    assert cells
    assert not [c for c in cells if c == "None" or c.startswith(("[", "{")) or "{'" in c]
    assert "1x 2x" in cells  # the loads, as a person writes them


def test_plan_html_shows_the_held_out_table_and_every_load():
    page = html.unescape(plan_html(load_plan(PLAN), []))
    assert "Every scenario on held-out traffic" in page
    assert "Simulation per load" in page
    cells = _table_cells(page)
    assert "1x" in cells and "2x" in cells


def test_plan_html_shows_compare_plan_scores_and_its_verdict():
    plan = _with_current(load_plan(PLAN), 1.05)
    page = html.unescape(plan_html(plan, []))
    assert "--compare-plan ms" in page and "--compare-plan ratio" in page
    assert "take the new plan" in page
    comparison = plan_comparison_rows(plan)
    assert comparison.columns == ["", "plan", "default", "--compare-plan"]


@pytest.mark.parametrize("engine, flag, value", [
    ("vllm", "--gpu-memory-utilization", "gpu_memory_utilization"),
    ("sglang", "--mem-fraction-static", "mem_fraction_static"),
])
def test_plan_html_headline_card_is_the_planned_engines_flag(engine, flag, value):
    plan = load_plan(PLAN)
    plan = replace(plan, inputs=replace(plan.inputs, engine=engine))
    page = html.unescape(plan_html(plan, []))
    card = re.search(r"<div class='card'><b>([^<]*)</b><span>([^<]*)</span>", page)
    assert card is not None
    assert card.group(2) == flag
    assert card.group(1) == f"{getattr(plan.memory, value):.3f}"


def test_verdict_keeps_current_sizes_when_the_gain_is_under_one_percent():
    verdict = plan_verdict(_with_current(load_plan(PLAN), 1.002))
    assert verdict is not None and verdict.keep_current
    assert verdict.sentence.startswith("keep your current sizes")


def test_verdict_takes_the_new_plan_when_it_saves_several_percent_everywhere():
    verdict = plan_verdict(_with_current(load_plan(PLAN), 1.04))
    assert verdict is not None and not verdict.keep_current
    assert verdict.best_gain == pytest.approx(1 - 1 / 1.04)
    assert verdict.sentence.startswith("take the new plan")


def test_no_verdict_without_compare_plan():
    assert plan_verdict(load_plan(PLAN)) is None


def test_compare_plan_from_another_model_or_engine_is_named_in_a_warning():
    old = load_plan(PLAN)
    new_inputs = replace(old.inputs, model="qwen2.5-7b", engine="vllm")
    (warning,) = compare_plan_warnings(old, new_inputs)
    assert "model llama-3.1-8b (now qwen2.5-7b)" in warning
    assert "engine sglang (now vllm)" in warning
    assert compare_plan_warnings(old, old.inputs) == []


@dataclass(frozen=True, slots=True, kw_only=True)
class _ServedScore(ScenarioScore):
    # Figures a closed-loop simulation may add to each scenario row.
    ttft_p99_ms: float
    output_tokens_per_s: float


def test_figures_a_scenario_row_gains_later_show_as_columns_and_rows():
    plan = load_plan(PLAN)
    rows = [_ServedScore(**dataclasses.asdict(r), ttft_p99_ms=412.25,
                         output_tokens_per_s=1234.5) for r in plan.scenarios]
    plan = replace(plan, scenarios=rows, comparison=[r for r in rows if r.part == "held_out"
                                                     and r.load == 1.0 and r.eager == "low"])
    serving = plan_serving_rows(plan)
    assert serving is not None
    assert serving.columns[3:] == ["TTFT p99", "output tokens/s"]
    assert "412.250 ms" in [row[3] for row in serving.rows]
    assert "1,234.5/s" in [row[4] for row in serving.rows]
    labels = [row[0].strip() for row in plan_comparison_rows(plan).rows]
    assert "TTFT p99" in labels and "serving" in labels
    assert serving.title in html.unescape(plan_html(plan, []))
    assert any(t.title == serving.title for t in plan_tables(plan))


@dataclass(frozen=True, slots=True)
class _LoopRow:
    # The shape of a closed-loop row: a schedule served at one load under one eager cost.
    schedule: str
    load: float
    eager: str
    ttft_p99_s: float
    tpot_p50_ms: float
    output_tokens_per_s: float
    decode_eager_share: float
    kv_tokens: int


@dataclass(slots=True, kw_only=True)
class _LoopPlan(Plan):
    closed_loop: list = dataclasses.field(default_factory=list)


def _loop_plan() -> Plan:
    plan = load_plan(PLAN)
    rows = [_LoopRow(schedule, load, eager, 1.5 * load, 20.0 + (eager == "high"), 950.5, 0.25,
                     123456) for load in (1.0, 2.0) for eager in ("low", "high")
            for schedule in ("plan", "default")]
    fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(Plan)}
    fields["closed_loop"] = rows
    # A plan that has no closed_loop field yet gets one, as plan.json 1.4 adds it.
    return (Plan if hasattr(plan, "closed_loop") else _LoopPlan)(**fields)


def test_closed_loop_rows_show_every_figure_they_carry_in_the_page_and_the_data():
    plan = _loop_plan()
    tables = {t.title: t for t in plan_tables(plan)}
    loop = tables["Served with its own step times (closed loop, predicted)"]
    assert loop.columns == ["load", "eager", "schedule", "TTFT p99", "TPOT p50",
                            "output tokens/s", "decode eager share", "KV tokens"]
    assert ["1x", "low", "plan", "1.500 s", "20.000 ms", "950.5/s", "25.0%", "123,456"] in loop.rows
    page = html.unescape(plan_html(plan, []))
    assert loop.title in page and "950.5/s" in page
    served = {row[0].strip(): row[1:] for row in plan_comparison_rows(plan).rows}
    assert served["TTFT p99"] == ["1.500 s", "1.500 s"]  # plan and default at the headline
    labels = [row[0].strip() for row in plan_comparison_rows(plan).rows]
    assert labels.count("KV tokens") == 1  # the closed loop's repeat of a shown figure is left out


def test_eager_assumptions_with_the_same_closed_loop_figures_share_a_row():
    plan = _loop_plan()
    plan.closed_loop = [replace(r, tpot_p50_ms=20.0) for r in plan.closed_loop]
    loop = next(t for t in plan_tables(plan) if t.title.startswith("Served"))
    assert [row[1] for row in loop.rows] == ["low, high"] * 4  # two loads, two schedules


def test_no_keep_or_switch_verdict_when_the_old_plan_was_for_another_engine():
    plan = _with_current(load_plan(PLAN), 1.002)
    old = replace(plan, inputs=replace(plan.inputs, engine="vllm"))
    plan.warnings.extend(compare_plan_warnings(old, plan.inputs))
    verdict = plan_verdict(plan)
    assert verdict is not None and verdict.keep_current is None
    assert verdict.sentence.startswith("no verdict: the old plan was made for another deployment "
                                       "(engine vllm (now sglang))")
