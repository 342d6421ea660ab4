import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from planner_fixture import CFG, H100, roofline_8b

from cgtool.planner.closed_loop import basin_lines, closed_loop, in_basin, worse_lines
from cgtool.planner.eager import EagerAssumption
from cgtool.planner.plan import plan_requests
from cgtool.planner.request import PlanRequest
from cgtool.planner.robust import Schedule
from cgtool.planner.scenarios import Traffic
from cgtool.planner.scoring import schedule_step_cost
from cgtool.planner.simulator import simulate
from cgtool.planner.tails import TAIL_TOLERANCE
from cgtool.specs.gpus import gpu_spec
from cgtool.traces.trace import read_trace

EXAMPLE = Path(__file__).parents[1] / "examples" / "azure-conv-first-1000.jsonl"
LIMITS = {"max_running_requests": 512, "chunked_prefill_size": 8192, "context_len": 131072}


def chat(n=1500, rate=20.0, seed=0):
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1 / rate, n))
    return arrival, rng.integers(50, 400, n), rng.integers(20, 300, n)


def assumption(name, eager_factor):
    cost = roofline_8b()
    cost = replace(cost, decode_eager_ms=cost.decode_graph_ms * eager_factor,
                   extend_eager_ms=cost.extend_graph_ms * eager_factor)
    return EagerAssumption(name, f"eager {eager_factor}x a replay", cost)


TOKENS = tuple(range(1, 8193))  # every extend step on a graph: decode graphs alone differ


def loop_rows(schedules, assumptions, rate=20.0):
    arrival, inp, out = chat(rate=rate)
    jobs = Traffic(arrival, inp, out, None).load_jobs((1.0,), 1)
    return closed_loop([(s, 400_000) for s in schedules], assumptions, jobs, LIMITS)


def test_each_schedule_is_served_with_its_own_step_times():
    # Graphs to 8 only: under a 4x eager cost its decode steps above 8 are slower than the
    # plan's, so its clients wait longer per token; with eager as fast as a graph they do not.
    wide = Schedule("plan", tuple(range(1, 257)), TOKENS)
    narrow = Schedule("default", (1, 2, 4, 8), TOKENS)
    rows = loop_rows([wide, narrow], (assumption("low", 1.0), assumption("high", 4.0)))
    by = {(r.schedule, r.eager): r for r in rows}
    assert by[("default", "high")].tpot_p50_ms > 1.5 * by[("plan", "high")].tpot_p50_ms
    # Eager as fast as a replay: only padding to 1, 2, 4, 8 tells the two apart.
    assert by[("default", "low")].tpot_p50_ms == pytest.approx(by[("plan", "low")].tpot_p50_ms,
                                                               rel=0.02)
    assert by[("default", "high")].decode_eager_share > 0.5
    assert by[("plan", "high")].decode_eager_share == 0.0


def test_a_run_that_would_take_the_same_steps_is_reused_and_equals_a_fresh_one():
    # The plan never runs eagerly, so its low and high runs take the same steps.
    wide = Schedule("plan", tuple(range(1, 513)), tuple(range(1, 8193)))
    rows = loop_rows([wide], (assumption("low", 1.0), assumption("high", 4.0)))
    assert rows[0] == replace(rows[1], eager="low")
    arrival, inp, out = chat(rate=20.0)
    fresh = simulate(arrival, inp, out, None, cost=schedule_step_cost(
        assumption("high", 4.0).cost, wide.decode_bs, wide.tokens), kv_capacity_tokens=400_000,
        **LIMITS)
    assert rows[1].duration_s == fresh.duration_s


def test_the_eager_basin_is_named_on_a_constructed_trace():
    # Batches of about 25 with graphs; eager steps 4x slower push them far past that.
    wide = Schedule("plan", tuple(range(1, 257)), TOKENS)
    narrow = Schedule("default", (1, 2, 4, 8), TOKENS)
    current = Schedule("current", tuple(range(1, 65)), TOKENS)  # --compare-plan: covers them
    rows = loop_rows([wide, narrow, current], (assumption("high", 4.0),))
    by = {r.schedule: r for r in rows}
    assert by["default"].median_decode_batch > 2 * by["plan"].median_decode_batch
    assert in_basin(by["default"], by["plan"])
    assert not in_basin(by["plan"], by["plan"]) and not in_basin(by["current"], by["plan"])
    lines = basin_lines(rows)
    assert len(lines) == 1 and "engine default's decode graphs stop at batch 8" in lines[0]
    assert worse_lines(rows) == []


def test_a_compared_plan_in_its_basin_is_named_too():
    wide = Schedule("plan", tuple(range(1, 257)), TOKENS)
    old = Schedule("current", (1, 2, 4, 8), TOKENS)
    lines = basin_lines(loop_rows([wide, old], (assumption("high", 4.0),)))
    assert len(lines) == 1 and "current plan's decode graphs stop at batch 8" in lines[0]


def test_a_plan_whose_clients_fare_worse_than_the_default_s_says_so():
    narrow = Schedule("plan", (1, 2, 4, 8), TOKENS)
    wide = Schedule("default", tuple(range(1, 257)), TOKENS)
    lines = worse_lines(loop_rows([narrow, wide], (assumption("high", 4.0),)))
    assert len(lines) == 1 and "1x (high eager cost)" in lines[0]


def l40s_request(**kwargs):
    return PlanRequest(CFG, gpu_spec("L40S"), trace_name="azure-conv-first-1000", **kwargs)


def test_sglang_default_on_an_l40s_falls_into_its_eager_basin_at_2x():
    trace = read_trace(EXAMPLE)
    plan = plan_requests(trace.arrival_s, trace.input_len, trace.output_len, trace.cached_len,
                         l40s_request(loads=(1.0, 2.0)))
    basin = [w for w in plan.warnings if w.startswith("eager basin")]
    assert plan.decode.default_capture_bs[-1] == 32
    assert len(basin) == 1 and "engine default" in basin[0] and "from 2x load" in basin[0]
    rows = {(r.schedule, r.load, r.eager): r for r in plan.closed_loop}
    assert {(s, load) for s, load, _ in rows} == {(s, x) for s in ("plan", "default")
                                                  for x in (1.0, 2.0)}
    assert rows[("default", 2.0, "low")].ttft_p99_s > rows[("plan", 2.0, "low")].ttft_p99_s


def plan_dict(arrival, trace, **kwargs):
    req = PlanRequest(CFG, H100, trace_name="t", **kwargs)
    plan = plan_requests(arrival, trace.input_len, trace.output_len, trace.cached_len, req)
    body = plan.to_dict()
    for key in ("created", "provenance"):
        body.pop(key)
    return body


def test_a_trace_stamped_in_unix_time_plans_exactly_as_the_same_trace_from_zero():
    trace = read_trace(EXAMPLE)
    stamped = trace.arrival_s + 1.7e9
    shifted = plan_dict(stamped, trace)
    from_zero = plan_dict(stamped - stamped[0], trace)
    assert shifted == from_zero
    assert shifted["inputs"]["replicas"] == 1 and shifted["status"] == "complete"
    assert shifted["simulation"]["num_requests"] == 1000


def test_a_late_start_is_not_service_time():
    trace = read_trace(EXAMPLE)
    late = plan_dict(trace.arrival_s + 10_000.0, trace)
    assert late["inputs"]["replicas"] == 1
    assert not any(w.startswith("overloaded") for w in late["warnings"])
    assert late["simulation"]["duration_s"] < 4000


@pytest.mark.parametrize("how", ["at_once", "huge_load"])
def test_requests_arriving_at_once_plan_like_an_offline_batch(how):
    trace = read_trace(EXAMPLE)
    if how == "at_once":
        arrival, kwargs = np.zeros(len(trace)), {}
    else:
        arrival, kwargs = trace.arrival_s, {"loads": (1e9,)}
    body = plan_dict(arrival, trace, **kwargs)
    assert body["status"] == "complete" and body["inputs"]["replicas"] == 1
    assert body["decode"]["max_bs"] >= 128  # the batch job runs wide, not at bs 1
    assert any(w.startswith("offline batch") for w in body["warnings"])
    assert any(w.startswith("in-sample") for w in body["warnings"])
    assert body["basis"]["held_out_steps"] == 0
    json.dumps(body)  # plain numbers throughout


def test_a_closed_loop_client_plans_from_lengths_alone():
    trace = read_trace(EXAMPLE)
    traffic = Traffic(None, trace.input_len, trace.output_len, trace.cached_len, concurrency=16)
    from cgtool.planner.plan import plan_traffic

    plan = plan_traffic(traffic, PlanRequest(CFG, H100, trace_name="t"))
    rows = {(r.schedule, r.load): r for r in plan.closed_loop if r.eager == "low"}
    # 16 in flight at 1x, 32 at 2x: the batch never exceeds the requests in flight.
    assert rows[("plan", 1.0)].largest_decode_batch <= 16
    assert 16 < rows[("plan", 2.0)].largest_decode_batch <= 32
    assert plan.inputs.replicas == 1
    assert any(w.startswith("closed-loop client") for w in plan.warnings)


def test_an_offline_batch_plan_renders_and_reports(tmp_path):
    from cli_run import cgtool

    trace = tmp_path / "batch.jsonl"
    lines = EXAMPLE.read_text().splitlines()
    trace.write_text("".join(
        json.dumps(json.loads(line) | {"arrival": 0}) + "\n" for line in lines * 2
    ))
    shown = cgtool("plan", "--trace", trace, "--gpu", "H100-80GB", "--out", tmp_path / "out")
    assert shown.exit_code == 0, shown.output
    assert "closed loop" in shown.output and "offline batch" in shown.output
    again = cgtool("report", tmp_path / "out")
    assert again.exit_code == 0, again.output


def test_a_part_without_steps_shows_a_dash_not_a_division_by_zero():
    from rich.console import Console

    from cgtool.reports.plan_view import scenario_table

    trace = read_trace(EXAMPLE)
    plan = plan_requests(trace.arrival_s, trace.input_len, trace.output_len, trace.cached_len,
                         PlanRequest(CFG, H100, trace_name="t"))
    plan.scenarios = [replace(r, expected_step_ms=0.0) if r.schedule == "default" else r
                      for r in plan.scenarios]
    console = Console(width=200, record=True)
    console.print(scenario_table(plan))
    assert " - " in console.export_text()


def test_the_fit_runs_stand_for_the_default_s_own_closed_loop():
    # The plan reuses its fit runs as the default's rows under the first eager cost: they must
    # be what simulating the default afresh gives.
    from cgtool.planner.server import server_for

    trace = read_trace(EXAMPLE)
    req = PlanRequest(CFG, H100, trace_name="t", loads=(1.0, 2.0))
    plan = plan_requests(trace.arrival_s, trace.input_len, trace.output_len, trace.cached_len, req)
    server = server_for(req)
    d = server.default
    default = Schedule("default", d.decode_bs, d.piecewise_tokens, d.pads)
    jobs = Traffic(trace.arrival_s, trace.input_len, trace.output_len, trace.cached_len).load_jobs(
        req.loads, 1)
    limits = {"max_running_requests": server.max_running, "chunked_prefill_size": server.chunk,
              "context_len": server.context_len}
    fresh = closed_loop([(default, server.default_kv_tokens)], server.assumptions[:1], jobs, limits)
    planned = [r for r in plan.closed_loop if r.schedule == "default" and r.eager == "low"]
    assert planned == fresh


def test_the_bundled_examples_plan_keeps_the_defaults_tails_at_every_load():
    # SGLang 0.5.23 captures prefill through the chunk: the rare steps above the plan's fitted
    # ceiling padded to 8,192 and its TTFT p99 trailed the default's by 45% until some of the
    # default's sizes were added back (cgtool.planner.tails).
    trace = read_trace(EXAMPLE)
    plan = plan_requests(trace.arrival_s, trace.input_len, trace.output_len, trace.cached_len,
                         PlanRequest(CFG, H100, loads=(1.0, 2.0)))
    rows = {(r.schedule, r.load, r.eager): r for r in plan.closed_loop}
    # Sizes are matched on the fit requests alone: over the whole trace the plan keeps the
    # default's tails, or a line says by how much it does not.
    whole = [w for w in plan.warnings if w.startswith("closed loop: over the whole trace")]
    for (name, load, eager), ours in rows.items():
        if name != "plan":
            continue
        default = rows[("default", load, eager)]
        assert ours.num_graphs < default.num_graphs and ours.graph_bytes < default.graph_bytes
    assert any(w.startswith("closed loop: the plan's TTFT p99") and "of the fit requests" in w
               for w in plan.warnings)
    worst = max(getattr(rows[("plan", x, e)], f) / getattr(rows[("default", x, e)], f) - 1
                for (n, x, e) in rows if n == "plan" for f in ("ttft_p99_s", "tpot_p99_ms"))
    assert (worst > TAIL_TOLERANCE) == bool(whole)
    assert all(f"by {worst:.0%}" in w for w in whole)


def _example_plan():
    trace = read_trace(EXAMPLE)
    req = PlanRequest(CFG, H100, loads=(1.0, 2.0))
    return plan_requests(trace.arrival_s, trace.input_len, trace.output_len, trace.cached_len, req)


def _sizes(plan):
    return plan.decode.capture_bs, plan.piecewise.capture_num_tokens, plan.memory.kv_tokens


def _tail_note(plan):
    return next(w for w in plan.warnings if w.startswith("closed loop: the plan's"))


def test_the_tail_search_on_the_first_requests_keeps_a_head_all_fit_requests_confirm(monkeypatch):
    # Searched on the first 200 of the bundled example's 700 fit requests (a long trace's
    # searches run on its first 50,000 per replica), the head kept must hold on all 700: served
    # afresh with the plan's sizes and pool, the plan trails the default by at most the tolerance.
    import cgtool.planner.plan as plan_module
    from cgtool.planner import tails
    from cgtool.planner.plan_runs import fit_traffic
    from cgtool.planner.server import server_for
    from cgtool.planner.tails import shortfall

    monkeypatch.setattr(tails, "PROBE_REQUESTS_PER_REPLICA", 200)
    served_sizes = []
    real = plan_module._closed_loop

    def spy(traffic, *args, **kwargs):
        served_sizes.append(len(traffic))
        return real(traffic, *args, **kwargs)

    monkeypatch.setattr(plan_module, "_closed_loop", spy)
    plan = _example_plan()
    assert "added the default's" in _tail_note(plan)
    assert served_sizes.count(200) >= 3  # the default on the probe, then the bisection's heads

    trace = read_trace(EXAMPLE)
    fit = fit_traffic(Traffic(trace.arrival_s, trace.input_len, trace.output_len, trace.cached_len))
    server = server_for(PlanRequest(CFG, H100, loads=(1.0, 2.0)))
    d = server.default
    ours = Schedule("plan", tuple(plan.decode.capture_bs), tuple(plan.piecewise.capture_num_tokens))
    theirs = Schedule("default", d.decode_bs, d.piecewise_tokens, d.pads)
    limits = {"max_running_requests": server.max_running, "chunked_prefill_size": server.chunk,
              "context_len": server.context_len}
    rows = closed_loop([(ours, plan.memory.kv_tokens), (theirs, server.default_kv_tokens)],
                       server.assumptions, fit.load_jobs((1.0, 2.0), 1), limits)
    assert shortfall(rows)[0] <= TAIL_TOLERANCE


def test_a_head_the_fit_requests_do_not_confirm_is_searched_again_on_all_of_them(monkeypatch):
    # A probe blind to every loss (its runs give no rows) finds the shortest head, one size; all
    # 700 fit requests need more, so the search runs again on them and the plan is the one
    # searched on all of them from the start.
    import cgtool.planner.plan as plan_module
    from cgtool.planner import tails

    searched_whole = _example_plan()
    added = _tail_note(searched_whole).split("added the default's ")[1].split(" (sizes")[0]
    assert len(added.replace(";", " ").split()) > 2  # a kind and more than one size
    monkeypatch.setattr(tails, "PROBE_REQUESTS_PER_REPLICA", 200)
    real = plan_module._closed_loop
    monkeypatch.setattr(plan_module, "_closed_loop", lambda traffic, *a, **k:
                        [] if len(traffic) == 200 else real(traffic, *a, **k))
    probed = _example_plan()
    assert _sizes(probed) == _sizes(searched_whole)
    assert _tail_note(probed) == _tail_note(searched_whole)
