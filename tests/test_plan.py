import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from planner_fixture import CFG, H100, REPORT

from cgtool.documents.plan_document import Plan
from cgtool.errors import CgtoolError
from cgtool.planner.memory import check_plan_safety
from cgtool.planner.plan import plan_batches, plan_requests
from cgtool.planner.request import PlanRequest
from cgtool.planner.scenarios import HELD_OUT_SPLIT
from cgtool.specs.config import load_model_config
from cgtool.specs.gpus import gpu_spec
from cgtool.traces.convert_public import convert_azure, convert_mooncake

# The public traces sit beside the checkout (../shared/traces); tests that need them skip without.
TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason="../shared/traces is not here")


def synthetic(n=4000, rate=6.0, seed=0):
    """Chat-like traffic: Poisson arrivals, log-normal prompt and output lengths."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1 / rate, n))
    prompt = np.minimum(rng.lognormal(6.8, 0.9, n).astype(int) + 1, 12000)
    output = np.minimum(rng.lognormal(5.0, 0.8, n).astype(int) + 1, 1500)
    return arrival, prompt, output, np.zeros(n, dtype=int)


@pytest.fixture(scope="module")
def base_plan():
    return plan_requests(*synthetic(), PlanRequest(CFG, H100, trace_name="synthetic"))


def rows(plan):
    return {row.schedule: row for row in plan.comparison}


# The plan is the least worst regret over every (load scenario, eager assumption) pair, and
# the default is one of the candidates; at the headline pair alone (1x, held out) it may
# trail the default by a hair (Mooncake, vLLM, 5 replicas: 1.0006).
HEADLINE_SLACK = 0.002


def assert_dominates(plan):
    plan_row, default = rows(plan)["plan"], rows(plan)["default"]
    assert plan_row.expected_step_ms <= default.expected_step_ms * (1 + HEADLINE_SLACK)
    # Fewer graphs or less graph memory, unless the default itself regrets least, or the closed
    # loop took the default's sizes because the plan's own set trailed one of its tails (it says
    # so, naming the sizes; tests/test_closed_loop.py holds that rule). Whether it tips there
    # moves with the cost model: pricing the server's graph gap (2026-11-28) tipped two of these
    # traces (a tail 2% and 4% behind at 2x load), and the plans still ran no slower.
    is_default = plan.decode.capture_bs == plan.decode.default_capture_bs and (
        plan.piecewise.capture_num_tokens == plan.piecewise.default_capture_num_tokens
    )
    took_defaults = [w for w in plan.warnings if w.startswith("closed loop:") and "added the default's" in w]
    assert (
        plan_row.num_graphs < default.num_graphs
        or plan_row.graph_bytes < default.graph_bytes
        or is_default
        or took_defaults
    )


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize("seed, rate", [(0, 3.0), (1, 8.0), (2, 20.0)])
def test_plan_dominates_the_default_on_synthetic_traffic(engine, seed, rate):
    assert_dominates(
        plan_requests(*synthetic(3000, rate, seed), PlanRequest(CFG, H100, engine=engine))
    )


@needs_traces
@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize(
    "name, convert",
    [
        ("AzureLLMInferenceTrace_conv.csv", convert_azure),
        ("mooncake_fast25_conversation_trace.jsonl", convert_mooncake),
    ],
)
def test_plan_dominates_the_default_on_the_real_traces(engine, name, convert):
    trace = convert(TRACES / name).trace
    plan = plan_requests(
        trace.arrival_s,
        trace.input_len,
        trace.output_len,
        trace.cached_len,
        PlanRequest(CFG, H100, engine=engine, trace_name=name),
    )
    assert_dominates(plan)


def test_plan_dominates_on_a_batch_trace(base_plan):
    decode, extend = base_plan.decode.histogram, base_plan.piecewise.histogram
    plan = plan_batches(
        decode.sizes, decode.counts, extend.sizes, extend.counts, PlanRequest(CFG, H100)
    )
    assert_dominates(plan)
    assert plan.inputs.trace_kind == "batches"
    assert any("context assumed" in w for w in plan.warnings)


def test_plan_dict_follows_the_contract_and_the_loader_accepts_it(base_plan):
    data = json.loads(json.dumps(base_plan.to_dict()))
    Plan.from_dict(data, "plan.json")
    assert set(data["inputs"]) >= {
        "trace",
        "trace_kind",
        "model",
        "gpu",
        "engine",
        "engine_version",
        "profile",
        "tp_size",
        "chunked_prefill_size",
        "max_running_requests",
        "context_len",
    }
    assert set(data["memory"]) >= {
        "gpu_memory_bytes",
        "weights_bytes",
        "graph_bytes",
        "activation_bytes",
        "margin_bytes",
        "kv_bytes",
        "kv_tokens",
        "mem_fraction_static",
        "default_mem_fraction_static",
        "default_kv_tokens",
        "peak_kv_demand_tokens",
        "warnings",
    }
    assert set(data["simulation"]) >= {
        "num_requests",
        "dropped_requests",
        "duration_s",
        "steps",
        "mean_queue_s",
        "p99_queue_s",
    }
    assert set(data["flags"]) == {"sglang", "vllm", "trtllm"}
    assert data["decode"]["max_bs"] == max(data["decode"]["capture_bs"])
    hist = data["decode"]["histogram"]
    assert len(hist["sizes"]) == len(hist["counts"]) == len(hist["time_s"])


def test_histogram_counts_add_up_to_the_simulated_steps(base_plan):
    steps = sum(base_plan.decode.histogram.counts) + sum(base_plan.piecewise.histogram.counts)
    assert steps == base_plan.simulation.steps


def test_token_bins_never_exceed_the_chunked_prefill_size():
    plan = plan_requests(*synthetic(1500), PlanRequest(CFG, H100, chunked_prefill_size=512))
    assert plan.piecewise.capture_num_tokens and max(plan.piecewise.capture_num_tokens) <= 512
    assert max(plan.piecewise.histogram.sizes) <= 512


def test_graph_budget_caps_the_total_number_of_graphs():
    plan = plan_requests(*synthetic(1500), PlanRequest(CFG, H100, budget_graphs=6))
    assert len(plan.decode.capture_bs) + len(plan.piecewise.capture_num_tokens) <= 6


def test_memory_budget_caps_graph_memory():
    budget = 200 << 20
    plan = plan_requests(*synthetic(1500), PlanRequest(CFG, H100, budget_memory_bytes=budget))
    assert plan.memory.graph_bytes <= budget
    assert rows(plan)["plan"].graph_bytes == plan.memory.graph_bytes


def test_the_engine_version_picks_the_flag_names(base_plan):
    old = plan_requests(*synthetic(800), PlanRequest(CFG, H100, engine_version="0.5.10"))
    assert any(line.startswith("--cuda-graph-bs ") for line in old.flags["sglang"])
    assert any(line.startswith("--cuda-graph-bs-decode ") for line in base_plan.flags["sglang"])
    assert (
        old.inputs.engine_version == "0.5.10" and base_plan.inputs.engine_version == "0.5.23"
    )


def test_batches_above_the_default_graph_ceiling_are_captured_and_reported():
    # Many short requests at once: the decode batch reaches several hundred.
    rng = np.random.default_rng(5)
    n = 3000
    trace = (
        np.sort(rng.uniform(0, 5, n)),
        rng.integers(50, 200, n),
        rng.integers(200, 400, n),
        None,
    )
    plan = plan_requests(*trace, PlanRequest(CFG, H100))
    default_max = max(plan.decode.default_capture_bs)
    assert max(plan.decode.histogram.sizes) > default_max
    assert plan.decode.max_bs > default_max
    assert any("below batches the trace reaches" in w for w in plan.warnings)


def test_a_profile_sets_measured_beside_predicted_graph_memory():
    plan = plan_requests(
        *synthetic(800), PlanRequest(CFG, H100, profile=REPORT, profile_name="report.json")
    )
    assert (
        plan.memory.graph_bytes_measured
        == REPORT["totals"]["graph_pool_bytes"] + REPORT["totals"]["non_torch_bytes"]
    )
    assert plan.memory.graph_bytes_predicted > 0
    assert plan.inputs.profile == "report.json"
    assert_dominates(plan)


def test_dropped_requests_are_reported():
    arrival, prompt, output, cached = synthetic(500)
    prompt[:3] = CFG.max_context_len + 1
    plan = plan_requests(arrival, prompt, output, cached, PlanRequest(CFG, H100))
    assert plan.simulation.dropped_requests == 3
    assert any("dropped" in w for w in plan.warnings)


def test_safety_check_refuses_bins_above_the_chunk_or_context(base_plan):
    with pytest.raises(CgtoolError, match="chunked prefill size"):
        check_plan_safety([256, 9000], 8192, 131072, base_plan.memory)
    with pytest.raises(CgtoolError, match="context length"):
        check_plan_safety([256, 5000], 8192, 4096, base_plan.memory)


def test_safety_check_remedy_for_bins_past_the_context_lowers_the_chunk(base_plan):
    # Raising --chunked-prefill-size, as it said before, only adds bins past the context.
    with pytest.raises(CgtoolError) as exc:
        check_plan_safety([256, 5000], 8192, 4096, base_plan.memory)
    assert "lower --chunked-prefill-size to 4096 or less" in exc.value.remedy
    with pytest.raises(CgtoolError) as exc:
        check_plan_safety([256, 9000], 8192, 131072, base_plan.memory)
    assert "raise --chunked-prefill-size" in exc.value.remedy


def test_a_model_whose_context_is_below_the_chunk_plans_without_flags():
    # tiny's context (2,048) is below SGLang's H100 chunk (8,192); a burst of prompts fills
    # extend steps past the context, where the default's bins win: chosen whole, they broke
    # the plan with "token bins [2304, ..., 8192] exceed the context length".
    rng = np.random.default_rng(0)
    n = 2000
    arrival = np.cumsum(rng.exponential(1 / 20000, n))
    prompt, output = rng.integers(200, 1800, n), rng.integers(1, 200, n)
    tiny = load_model_config("tiny")
    plan = plan_requests(arrival, prompt, output, np.zeros(n, int), PlanRequest(tiny, H100))
    assert plan.status == "complete"
    assert max(plan.piecewise.capture_num_tokens) <= tiny.max_context_len == 2048


def test_safety_check_refuses_a_fraction_that_eats_the_margin(base_plan):
    greedy = replace(base_plan.memory, mem_fraction_static=0.99)
    with pytest.raises(CgtoolError, match="margin") as exc:
        check_plan_safety([], 8192, 131072, greedy)
    assert "--budget-memory" in exc.value.remedy


def test_planning_reports_progress():
    seen = []
    plan_requests(
        *synthetic(300), PlanRequest(CFG, H100), progress=lambda stage, f: seen.append((stage, f))
    )
    assert ("simulate", 1.0) in seen and ("optimise", 1.0) in seen


def test_a_trace_whose_requests_all_exceed_the_context_is_refused():
    with pytest.raises(CgtoolError, match="all 2 requests are longer"):
        plan_requests(
            np.zeros(2),
            np.full(2, 10**6),
            np.full(2, 10),
            None,
            PlanRequest(CFG, H100, trace_name="t"),
        )


def test_a_single_request_gets_a_plan():
    plan = plan_requests(np.zeros(1), np.array([100]), np.array([10]), None, PlanRequest(CFG, H100))
    assert plan.decode.capture_bs[0] == 1
    # 100 tokens, on the grid; SGLang 0.5.23 captures prefill graphs through the chunk too.
    assert plan.piecewise.capture_num_tokens == [112, 8192]


def test_batch_sizes_listed_twice_are_merged():
    plan = plan_batches(
        np.array([4, 4, 9]),
        np.array([10, 5, 1]),
        np.array([100]),
        np.array([2]),
        PlanRequest(CFG, H100),
    )
    assert plan.decode.histogram.sizes == [4, 9]
    assert plan.decode.histogram.counts == [15, 1]
    assert all(t > 0 for t in plan.decode.histogram.time_s)  # estimated under the default schedule


def test_a_budget_that_slows_the_plan_says_so():
    plan = plan_requests(*synthetic(800), PlanRequest(CFG, H100, budget_graphs=0))
    assert plan.decode.capture_bs == [] and plan.piecewise.capture_num_tokens == []
    assert rows(plan)["plan"].expected_step_ms > rows(plan)["default"].expected_step_ms
    assert any("slower than the default" in w for w in plan.warnings)


@pytest.fixture(scope="module")
def tp2_plan():
    return plan_requests(*synthetic(), PlanRequest(CFG, H100, tp_size=2, trace_name="synthetic"))


def test_tp2_plan_is_sized_per_gpu_and_records_tp(tp2_plan, base_plan):
    assert tp2_plan.inputs.tp_size == 2
    memory = tp2_plan.memory
    assert memory.tp_size == 2 and memory.kv_heads_per_rank == 4
    assert memory.weights_bytes < 0.51 * base_plan.memory.weights_bytes
    assert memory.kv_bytes == memory.kv_tokens * CFG.kv_bytes_per_token(2) // 2
    assert memory.kv_tokens > 2 * base_plan.memory.kv_tokens  # half a token's KV, less weight
    data = json.loads(json.dumps(tp2_plan.to_dict()))
    Plan.from_dict(data, "plan.json")
    assert data["memory"]["tp_size"] == 2 and data["flags"]["sglang"][0] == "--tp-size 2"
    assert "--tensor-parallel-size 2" in data["flags"]["vllm"]


def test_tp2_steps_carry_the_all_reduces_and_the_plan_still_dominates(tp2_plan, base_plan):
    assert_dominates(tp2_plan)
    plan_row, default_row = rows(tp2_plan)["plan"], rows(tp2_plan)["default"]
    assert 0 < plan_row.comm_ms < plan_row.expected_step_ms
    assert default_row.comm_ms > 0
    assert rows(base_plan)["plan"].comm_ms == 0.0
    # half the weights to stream a step, less than half back in all-reduces
    assert plan_row.expected_step_ms < rows(base_plan)["plan"].expected_step_ms


def test_more_ranks_than_kv_heads_warns_that_they_are_replicated():
    tiny = load_model_config("tiny")
    arrival, prompt, output, cached = synthetic(300)
    prompt, output = np.minimum(prompt, 200), np.minimum(output, 100)  # tiny's short context
    plan = plan_requests(arrival, prompt, output, cached, PlanRequest(tiny, H100, tp_size=4))
    assert plan.memory.kv_heads_per_rank == 1
    assert any("replicated on 2 ranks" in w for w in plan.warnings)


def test_a_tp_size_the_model_cannot_split_into_is_refused_before_planning():
    with pytest.raises(CgtoolError, match="--tp 3 does not divide") as exc:
        PlanRequest(CFG, H100, tp_size=3)
    assert "1, 2, 4 or 8" in exc.value.remedy


# ---- held-out check, load scenarios, one consistent server


def test_the_headline_comparison_is_the_held_out_one_and_the_fit_is_kept(base_plan):
    held = {
        r.schedule: r
        for r in base_plan.scenarios
        if r.part == "held_out" and r.load == 1.0 and r.eager == "low"
    }
    fit = {
        r.schedule: r
        for r in base_plan.scenarios
        if r.part == "fit" and r.load == 1.0 and r.eager == "low"
    }
    assert rows(base_plan)["plan"].expected_step_ms == held["plan"].expected_step_ms
    assert base_plan.comparison_fit[0].expected_step_ms == fit["plan"].expected_step_ms
    assert base_plan.basis.held_out_steps > 0 and base_plan.basis.fit_steps > 0
    assert "predictions" in base_plan.basis.statement


def test_every_load_and_eager_assumption_is_scored_for_plan_and_default(base_plan):
    keys = {(r.part, r.load, r.eager, r.schedule) for r in base_plan.scenarios}
    for part in ("fit", "held_out"):
        for load in (1.0, 2.0):
            for eager in ("low", "high"):
                assert {(part, load, eager, "plan"), (part, load, eager, "default")} <= keys
    loads = base_plan.simulation.loads
    assert [run.load for run in loads] == [1.0, 2.0]
    assert loads[1].duration_s < loads[0].duration_s  # twice the rate


def test_held_out_decode_coverage_is_full_at_every_load(base_plan):
    for r in base_plan.scenarios:
        if r.part == "held_out" and r.schedule == "plan":
            assert r.decode_coverage >= 0.99


def test_sizes_are_fitted_on_the_default_server_and_each_schedule_served_on_its_own_pool(base_plan):
    assert base_plan.simulation.simulated_kv_tokens == base_plan.memory.default_kv_tokens
    pools = {row.schedule: row.kv_tokens for row in base_plan.closed_loop}
    assert pools == {"plan": base_plan.memory.kv_tokens,
                     "default": base_plan.memory.default_kv_tokens}


def test_replicas_split_the_trace_between_servers():
    one = plan_requests(*synthetic(1000), PlanRequest(CFG, H100, loads=(1.0,)))
    two = plan_requests(*synthetic(1000), PlanRequest(CFG, H100, loads=(1.0,), replicas=2))
    assert two.inputs.replicas == 2
    assert two.simulation.num_requests == one.simulation.num_requests // 2


def test_an_overloaded_server_says_so_and_is_planned_per_replica():
    # 20 requests a second of long prompts on one H100: far more than one server sustains.
    arrival, prompt, output, cached = synthetic(6000, rate=20.0, seed=4)
    plan = plan_requests(
        arrival, prompt * 4, output * 4, cached, PlanRequest(CFG, H100, loads=(1.0,))
    )
    overload = [w for w in plan.warnings if w.startswith("overloaded")]
    assert len(overload) == 1 and "requests/s" in overload[0]
    assert plan.basis.replicas > 1 and f"--replicas {plan.basis.replicas}" in overload[0]
    assert not any(run.overloaded for run in plan.simulation.loads)


def test_the_replica_count_a_plan_names_is_found_again_when_planned_at_that_count():
    # verify re-simulates the trace at the plan's --replicas; so does a user who pastes it.
    arrival, prompt, output, cached = synthetic(6000, rate=20.0, seed=4)
    arrays = (arrival, prompt * 4, output * 4, cached)
    first = plan_requests(*arrays, PlanRequest(CFG, H100, loads=(1.0, 2.0)))
    named = first.basis.replicas
    again = plan_requests(*arrays, PlanRequest(CFG, H100, loads=(1.0, 2.0), replicas=named))
    assert again.basis.replicas == named > 1
    assert not any(w.startswith("overloaded") for w in again.warnings)
    assert again.decode.histogram.counts == first.decode.histogram.counts


def test_a_round_of_the_replica_search_that_is_redone_stops_early_and_plans_the_same(
    monkeypatch,
):
    from cgtool.planner import sim_alone, simulator

    monkeypatch.setattr(sim_alone, "FORK_MIN_REQUESTS", 1)
    monkeypatch.setattr(simulator, "POLL_EVERY_REQUESTS", 100)
    arrival, prompt, output, cached = synthetic(6000, rate=20.0, seed=4)
    arrays = (arrival, prompt * 4, output * 4, cached)
    req = PlanRequest(CFG, H100, loads=(1.0, 2.0))
    flags = []
    real = sim_alone.DropWhole.shared_flag

    def spy():
        flags.append(real())
        return flags[-1]

    monkeypatch.setattr(sim_alone.DropWhole, "shared_flag", staticmethod(spy))
    early = plan_requests(*arrays, req).to_dict()
    # The first round overloads: its fit runs raised the flag that stops its whole runs (whether
    # a whole run saw it before ending is a race, tested with the flag up in test_sim_alone).
    assert any(flag[0] == 1 for flag in flags)
    monkeypatch.setattr(sim_alone.DropWhole, "raised", lambda self: False)
    whole = plan_requests(*arrays, req).to_dict()
    for key in ("created", "commit", "dirty", "argv"):
        early.pop(key, None), whole.pop(key, None)
    assert early == whole


def test_an_existing_plan_is_scored_beside_the_new_one(base_plan):
    old = (tuple(base_plan.decode.default_capture_bs[:5]), (512,), 100_000)
    plan = plan_requests(*synthetic(800), PlanRequest(CFG, H100, compare=old, compare_name="o"))
    current = [r for r in plan.scenarios if r.schedule == "current"]
    assert current and all(r.num_graphs == 6 and r.kv_tokens == 100_000 for r in current)
    assert plan.inputs.compare_plan == "o"


def test_batch_trace_steps_beyond_the_limits_are_counted_and_reported():
    plan = plan_batches(
        np.array([4, 5000]),
        np.array([10, 7]),
        np.array([100, 50_000]),
        np.array([2, 3]),
        PlanRequest(CFG, H100),
    )
    notes = " ".join(plan.warnings)
    assert "7 decode steps" in notes and "3 extend steps" in notes
    assert plan.decode.capture_bs  # graphs are still recommended for the steps within the limits


@pytest.mark.parametrize("bad", [{"loads": (0.0,)}, {"loads": ()}, {"replicas": 0}])
def test_bad_loads_and_replicas_are_refused(bad):
    with pytest.raises(CgtoolError):
        PlanRequest(CFG, H100, **bad)


def test_vllm_full_decode_graphs_stop_at_the_running_limit():
    plan = plan_requests(
        *synthetic(1500), PlanRequest(CFG, H100, engine="vllm", max_running_requests=64)
    )
    assert max(plan.decode.capture_bs) <= 64
    assert set(plan.decode.capture_bs) <= set(plan.piecewise.capture_num_tokens)


def test_vllm_plans_write_sglang_decode_flags_only_from_the_decode_part():
    plan = plan_requests(*synthetic(1500), PlanRequest(CFG, H100, engine="vllm"))
    line = next(f for f in plan.flags["sglang"] if f.startswith("--cuda-graph-bs-decode "))
    sizes = [int(s) for s in line.split()[1:]]
    reached = plan.basis.largest_batch_fitted
    assert max(sizes) >= reached and max(sizes) < max(plan.decode.capture_bs)
    assert "vLLM also captures a full graph" in plan.basis.max_bs_reason


def test_a_vllm_plan_for_an_a100_uses_its_smaller_defaults():
    plan = plan_requests(*synthetic(300), PlanRequest(CFG, gpu_spec("A100-80GB"), engine="vllm"))
    assert plan.inputs.max_running_requests == 256
    assert plan.inputs.chunked_prefill_size == 2048


def test_a_vllm_plan_states_one_default_kv_pool():
    # The memory table said 453,600 default KV tokens (from the fraction rounded to 3
    # decimals) while the comparison beside it scored the default at 453,342.
    plan = plan_requests(*synthetic(600), PlanRequest(CFG, H100, engine="vllm"))
    scored = {row.kv_tokens for row in plan.comparison if row.schedule == "default"}
    assert scored == {plan.memory.default_kv_tokens}


def test_the_max_bs_reason_names_the_batch_of_the_fitted_requests(base_plan):
    # plan.json's loads count the whole trace; the reason counts the part sizes were fitted on.
    reached = base_plan.basis.largest_batch_fitted
    assert f"the fitted requests reached at any load ({reached})" in base_plan.basis.max_bs_reason


def _same_fit(plan_a, plan_b):
    return (plan_a.basis.fit_steps == plan_b.basis.fit_steps
            and plan_a.decode.capture_bs == plan_b.decode.capture_bs
            and plan_a.piecewise.capture_num_tokens == plan_b.piecewise.capture_num_tokens)


def test_the_fit_part_does_not_depend_on_whether_the_first_held_out_request_fits():
    # A decode run went on past the split when the request arriving there could not be
    # admitted: 19 steps more in the fit part when that request was too long for the model.
    arrival, prompt, output, cached = synthetic(3000)
    first_held = min(math.ceil(HELD_OUT_SPLIT * 3000), 2999)
    too_long = prompt.copy()
    too_long[first_held] = CFG.max_context_len + 10
    kept = plan_requests(arrival, prompt, output, cached, PlanRequest(CFG, H100))
    dropped = plan_requests(arrival, too_long, output, cached, PlanRequest(CFG, H100))
    assert dropped.simulation.dropped_requests == 1
    assert _same_fit(kept, dropped)
    assert "1 request longer than the context or the KV pool dropped" in " ".join(dropped.warnings)


def _light_and_heavy_held_out_plans():
    """Plans of 700 light requests every 0.5 s followed by 300 held-out requests: light ones
    as before, or heavy ones in a burst."""
    n, first_held = 1000, 700
    arrival, prompt, output = np.arange(n) * 0.5, np.full(n, 500), np.full(n, 100)
    heavy_arrival, heavy_prompt, heavy_output = arrival.copy(), prompt.copy(), output.copy()
    heavy_arrival[first_held:] = arrival[first_held] + np.arange(n - first_held) * 0.001
    heavy_prompt[first_held:], heavy_output[first_held:] = 8000, 4000
    light = plan_requests(arrival, prompt, output, np.zeros(n, int), PlanRequest(CFG, H100))
    heavy = plan_requests(heavy_arrival, heavy_prompt, heavy_output, np.zeros(n, int),
                          PlanRequest(CFG, H100))
    return light, heavy


def test_held_out_requests_do_not_choose_the_replica_count():
    # 700 light requests every 0.5 s, then 300 heavy ones in a burst: judged on the whole
    # trace, one server overloaded and the plan was for one of 20 replicas, fitted on 7,000
    # steps instead of 89,015 (86,997 since decode graphs price the server's graph gap).
    light, heavy = _light_and_heavy_held_out_plans()
    assert light.simulation.replicas == heavy.simulation.replicas == 1
    assert light.basis.fit_steps == heavy.basis.fit_steps == 86_997


def test_held_out_requests_do_not_move_the_sizes_the_closed_loop_adds():
    # The same two traces: served with its own step times over the whole trace, the heavy
    # burst pushed the plan's decode batches to 56 and its decode graphs followed (they were
    # [1, 2, 4] for the light trace). What the closed loop adds is judged on the fit requests.
    light, heavy = _light_and_heavy_held_out_plans()
    assert heavy.decode.capture_bs == light.decode.capture_bs
    assert heavy.piecewise.capture_num_tokens == light.piecewise.capture_num_tokens
    assert max(r.largest_decode_batch for r in heavy.closed_loop if r.schedule == "plan") > max(
        light.decode.capture_bs)
