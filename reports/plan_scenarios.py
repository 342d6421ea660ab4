"""A plan's per-scenario tables, built once as TableData for the terminal, plan.html and
`cgtool report --format csv|json`: every load and eager assumption scored held out, the
figures each schedule reached there, the simulation per load, and what the plan was made from."""

from __future__ import annotations

import dataclasses

from cgtool.documents.compare import plan_verdict
from cgtool.documents.plan_document import Plan, ScenarioScore
from cgtool.reports.metric_cells import extra_figures, label_cell, metric_cell
from cgtool.reports.plan_tables import (
    LOOP_HEADLINE,
    SCHEDULE_NAMES,
    part_label,
    plan_comparison_rows,
    plan_memory_rows,
    plan_sizes_rows,
)
from cgtool.reports.tables import Cell, TableData

# Fields of a scenario row that say what it is, or that the step-time table already shows.
_STEP_TABLE = {"part", "load", "eager", "schedule", "expected_step_ms", "decode_coverage",
               "extend_coverage", "padding_waste", "num_graphs", "graph_bytes", "capture_s",
               "kv_tokens", "comm_ms"}


def headline_part(plan: Plan) -> str:
    return "held_out" if any(r.part == "held_out" for r in plan.scenarios) else "fit"


def _ratio(a: ScenarioScore, b: ScenarioScore) -> Cell:
    # A schedule with no steps at all scores 0 ms: no ratio, rather than a division by zero.
    if not b.expected_step_ms:
        return Cell("-", None)
    value = a.expected_step_ms / b.expected_step_ms
    return Cell(f"{value:.3f}", value)


def _ms(row: ScenarioScore) -> Cell:
    return Cell(f"{row.expected_step_ms:.3f}", row.expected_step_ms)


def plan_scenario_rows(plan: Plan) -> TableData | None:
    """Expected step per load and eager assumption, held out (and the in-sample ratio beside
    it); with --compare-plan, the old plan's sizes on the same steps."""
    rows = plan.scenarios
    if not rows:
        return None
    index = {(r.part, r.load, r.eager, r.schedule): r for r in rows}
    part = headline_part(plan)
    current = any(r.schedule == "current" for r in rows)
    columns = ["load", "eager", Cell("plan ms", "plan_step_ms"), Cell("default ms", "default_step_ms"),
               Cell("ratio", "plan_over_default"), Cell("in-sample", "fit_plan_over_default"),
               Cell("decode cov.", "plan_decode_coverage")]
    columns += [Cell("--compare-plan ms", "compare_step_ms"),
                Cell("--compare-plan ratio", "compare_over_default")] if current else []
    table_rows: list[list[str]] = []
    for load, eager in dict.fromkeys((r.load, r.eager) for r in rows if r.part == part):
        p, d = index[(part, load, eager, "plan")], index[(part, load, eager, "default")]
        fp, fd = index[("fit", load, eager, "plan")], index[("fit", load, eager, "default")]
        cells = [Cell(f"{load:g}x", load), eager, _ms(p), _ms(d), _ratio(p, d), _ratio(fp, fd),
                 Cell(f"{p.decode_coverage:.1%}", p.decode_coverage)]
        c = index.get((part, load, eager, "current"))
        if current:
            cells += [_ms(c), _ratio(c, d)] if c else [Cell("-", None)] * 2
        table_rows.append(cells)
    return TableData(f"Every scenario on {part_label(plan)}, predicted; ratio = plan / default",
                     columns, table_rows, wrapping={1},
                     caption="in-sample: the same ratio on the steps the sizes were fitted on")


def plan_serving_rows(plan: Plan) -> TableData | None:
    """Whatever figures the scenario rows carry beyond step time (time to first token, time
    per output token, throughput, ...), per load, eager assumption and schedule: one column
    each, named from the field, so figures added to plan.json show without a new table."""
    part = headline_part(plan)
    rows = [r for r in plan.scenarios if r.part == part]
    names = list(dict.fromkeys(n for r in rows for n in extra_figures(r, _STEP_TABLE)))
    if not names:
        return None
    columns = ["load", "eager", "schedule", *(label_cell(n) for n in names)]
    body = [[Cell(f"{r.load:g}x", r.load), r.eager, SCHEDULE_NAMES.get(r.schedule, r.schedule),
             *(metric_cell(n, getattr(r, n, None)) for n in names)] for r in rows]
    return TableData(f"Serving figures per scenario on {part_label(plan)} (predicted)", columns, body)


_LOOP_KEYS = {"schedule", "load", "eager"}


def plan_closed_loop_rows(plan: Plan, headline_only: bool = False) -> TableData | None:
    """plan.json's `closed_loop`: each schedule served with its own step times, per load and
    eager assumption, one column per figure the rows carry (named from the field). Eager
    assumptions whose rows agree on every schedule at a load share a row."""
    rows = list(getattr(plan, "closed_loop", None) or [])
    if not rows:
        return None
    names = extra_figures(rows[0], _LOOP_KEYS)
    if headline_only:
        names = [n for n in names if n in LOOP_HEADLINE] or names
    body: list[list[str]] = []
    for load in dict.fromkeys(r.load for r in rows):
        at_load = [r for r in rows if r.load == load]
        groups: dict[tuple, list[str]] = {}
        for eager in dict.fromkeys(r.eager for r in at_load):
            figures = tuple((r.schedule, *(getattr(r, n) for n in names))
                            for r in at_load if r.eager == eager)
            groups.setdefault(figures, []).append(eager)
        for eagers in groups.values():
            for r in (x for x in at_load if x.eager == eagers[0]):
                body.append([Cell(f"{load:g}x", load), Cell(", ".join(eagers), eagers),
                             SCHEDULE_NAMES.get(r.schedule, r.schedule),
                             *(metric_cell(n, getattr(r, n)) for n in names)])
    columns = ["load", "eager", "schedule", *(label_cell(n) for n in names)]
    return TableData("Served with its own step times (closed loop, predicted)", columns, body,
                     wrapping={1})


def plan_load_rows(plan: Plan) -> TableData | None:
    """The simulation at each load: how long it ran, how long requests queued, how far the
    KV pool and the decode batch reached."""
    loads = plan.simulation.loads
    if not loads:
        return None
    names = [f.name for f in dataclasses.fields(loads[0]) if f.name != "load"]
    columns = ["load", *(label_cell(n) for n in names)]
    rows = [[Cell(f"{s.load:g}x", s.load), *(metric_cell(n, getattr(s, n)) for n in names)]
            for s in loads]
    return TableData("Simulation per load", columns, rows)


def plan_inputs_rows(plan: Plan) -> TableData:
    """What the plan was made from: a missing input reads "-", loads read "1x 2x"."""
    rows = []
    for name, value in dataclasses.asdict(plan.inputs).items():
        if name == "loads":
            cell = Cell(" ".join(f"{v:g}x" for v in value), list(value))
        else:
            cell = metric_cell(name, value) if value is not None else Cell("-", None)
        rows.append([label_cell(name, name.replace("_", " ")), cell])
    return TableData("Inputs", ["", "value"], rows, wrapping={1})


def plan_simulation_rows(plan: Plan) -> TableData:
    """The first load's simulation in one column (every load: plan_load_rows)."""
    rows = [[label_cell(name), metric_cell(name, value)]
            for name, value in dataclasses.asdict(plan.simulation).items()
            if value is not None and name != "loads"]
    return TableData("Simulation (first load)", ["", "value"], rows)


def plan_verdict_rows(plan: Plan) -> TableData | None:
    """--compare-plan's verdict: keep the old sizes, or take the new plan, and why."""
    verdict = plan_verdict(plan)
    if verdict is None:
        return None
    rows = [
        [label_cell("keep_current"),
         Cell({True: "yes", False: "no", None: "no verdict"}[verdict.keep_current],
              verdict.keep_current)],
        [label_cell("verdict"), verdict.sentence],
        [label_cell("best_gain", "new plan's largest step-time gain"),
         Cell(f"{verdict.best_gain:+.2%}", verdict.best_gain)],
        [label_cell("worst_gain", "new plan's smallest step-time gain"),
         Cell(f"{verdict.worst_gain:+.2%}", verdict.worst_gain)],
        [label_cell("scenarios", "scenarios compared"), Cell(str(verdict.scenarios), verdict.scenarios)],
    ]
    return TableData(f"--compare-plan {plan.inputs.compare_plan or ''}".strip(), ["", "value"],
                     rows, wrapping={1})


def plan_tables(plan: Plan) -> list[TableData]:
    """Every table of a plan, in the order plan.html and `cgtool report --format` give them."""
    tables = [plan_sizes_rows(plan), plan_comparison_rows(plan), plan_closed_loop_rows(plan),
              plan_scenario_rows(plan), plan_serving_rows(plan), plan_verdict_rows(plan),
              plan_memory_rows(plan),
              plan_load_rows(plan), plan_inputs_rows(plan), plan_simulation_rows(plan)]
    return [t for t in tables if t is not None]
