"""A plan end to end: simulate the trace at each load, choose sizes, size memory, score.

The trace is run through the scheduler once per load scenario, with the engine default's step
times (the server as it runs today) and the KV pool the plan recommends (iterated to a fixed
point, since the pool depends on the graphs chosen). Sizes are fitted on the steps before the
held-out split (cgtool.planner.scenarios) under every eager-cost assumption
(cgtool.planner.robust); the plan, the default and an existing plan are then scored on the
same held-out steps. Every gain is a prediction of the cost model, and the plan says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from cgtool.errors import InputError
from cgtool.planner.flags import FlagValues, all_flags
from cgtool.planner.memory import MemoryPlan, check_plan_safety, plan_memory
from cgtool.planner.optimiser import Limits
from cgtool.planner.plan_notes import (
    ceiling_warnings,
    decode_part,
    plan_basis,
    replication_warnings,
)
from cgtool.planner.plan_scores import ScoreSet, plan_warnings, score_rows
from cgtool.planner.profile_fit import predicted_graph_bytes
from cgtool.planner.request import PlanRequest
from cgtool.planner.robust import RobustChoice, Scenario, choose_robust
from cgtool.planner.scenarios import (
    LoadRun,
    overload_warning,
    replica_share,
    replicas_needed,
    split_time,
)
from cgtool.planner.scoring import Histogram, ScheduleScore
from cgtool.planner.server import Server, default_step_cost, server_for
from cgtool.planner.sim_parallel import simulate_all
from cgtool.provenance import collect_provenance
from cgtool.results import Provenance, utc_now_iso

Progress = Callable[[str, float], None]
# A batch trace says nothing of context: each decode request is taken to hold this many tokens.
BATCH_TRACE_CONTEXT_TOKENS = 1024
# The KV pool is re-simulated until the recommended one moves by less than this share.
POOL_TOLERANCE = 0.02
POOL_ROUNDS = 3
# Replica estimates are re-simulated until one sustains every load scenario, at most this often.
REPLICA_ROUNDS = 4


@dataclass(slots=True)
class KindPlan:
    capture: list[int]
    max_size: int
    histogram: Histogram
    default_capture: list[int]


@dataclass(slots=True)
class Plan:
    inputs: dict[str, Any]
    decode: KindPlan
    piecewise: KindPlan
    memory: MemoryPlan
    comparison: list[ScheduleScore]  # held-out at the first load (fit when none is held out)
    flags: dict[str, list[str]]
    simulation: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    status: str = "complete"
    created: str = field(default_factory=utc_now_iso)
    provenance: Provenance = field(default_factory=collect_provenance)
    comparison_fit: list[ScheduleScore] = field(default_factory=list)
    scenarios: list[dict[str, Any]] = field(default_factory=list)
    basis: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        def kind(k: KindPlan, sizes_key: str, max_key: str, default_key: str) -> dict[str, Any]:
            return {
                sizes_key: k.capture,
                max_key: k.max_size,
                "histogram": k.histogram.to_dict(),
                default_key: k.default_capture,
            }

        return {
            "schema": "cgtool.plan",
            "version": "1.1",
            "status": self.status,
            "created": self.created,
            "provenance": asdict(self.provenance),
            "inputs": self.inputs,
            "decode": kind(self.decode, "capture_bs", "max_bs", "default_capture_bs"),
            "piecewise": kind(
                self.piecewise, "capture_num_tokens", "max_tokens", "default_capture_num_tokens"
            ),
            "memory": self.memory.to_dict(),
            "comparison": [asdict(row) for row in self.comparison],
            "comparison_fit": [asdict(row) for row in self.comparison_fit],
            "scenarios": self.scenarios,
            "basis": self.basis,
            "flags": self.flags,
            "simulation": self.simulation,
            "warnings": self.warnings,
        }


def _limits(req: PlanRequest, server: Server) -> Limits:
    return Limits(
        server.max_running,
        min(server.chunk, server.context_len),
        req.budget_graphs,
        req.budget_memory_bytes,
    )


def _choose_and_size(
    req: PlanRequest, server: Server, fit: list[Scenario], peak_kv: int, typical: int
) -> tuple[RobustChoice, MemoryPlan]:
    choice = choose_robust(
        fit, list(server.assumptions), server.default, _limits(req, server), req.engine
    )
    memory = plan_memory(
        req.cfg,
        req.gpu.memory_bytes,
        graph_bytes=server.cost.graph_bytes(choice.decode_bs, choice.tokens),
        chunked_prefill_size=server.chunk,
        max_running_requests=server.max_running,
        peak_kv_demand_tokens=peak_kv,
        typical_request_tokens=typical,
        default_mem_fraction_static=server.default_fraction,
        tp_size=req.tp_size,
    )
    return choice, memory


def _enough_replicas(
    arrays: tuple[Any, ...], req: PlanRequest, server: Server, kv: int,
    progress: Progress | None, stop: Callable[[], bool] | None,
) -> tuple[list[LoadRun], list[LoadRun], int]:
    """(runs at the asked-for replicas, runs at the fewest replicas from there up at which no
    load scenario overloads, that count). Each estimate is checked by simulating it, so
    re-planning at the count the plan names (as `verify` does, or a user pasting --replicas)
    finds it again."""
    replicas = req.replicas
    asked = runs = _simulate_loads(arrays, req, server, replicas, kv, progress, stop)
    for _ in range(REPLICA_ROUNDS):
        needed = replicas_needed(runs, replicas)
        if needed is None or runs[-1].result.completed_fraction < 1.0:
            break
        replicas = needed
        runs = _simulate_loads(arrays, req, server, replicas, kv, progress, stop)
    return asked, runs, replicas


def _provisional_kv(req: PlanRequest, server: Server) -> int:
    """The pool the plan would recommend with the default's graphs: the first guess."""
    d = server.default
    return plan_memory(
        req.cfg,
        req.gpu.memory_bytes,
        graph_bytes=server.cost.graph_bytes(d.decode_bs, d.piecewise_tokens),
        chunked_prefill_size=server.chunk,
        max_running_requests=server.max_running,
        peak_kv_demand_tokens=0,
        typical_request_tokens=1,
        default_mem_fraction_static=server.default_fraction,
        tp_size=req.tp_size,
    ).kv_tokens


def _simulate_loads(
    arrays: tuple,
    req: PlanRequest,
    server: Server,
    replicas: int,
    kv_tokens: int,
    progress: Progress | None,
    stop: Callable[[], bool] | None,
) -> list[LoadRun]:
    arrival, input_len, output_len, cached_len = replica_share(arrays, replicas)
    scaled = [np.asarray(arrival, dtype=np.float64) / load for load in req.loads]
    jobs = [
        {
            "arrival_s": at_load,
            "input_len": input_len,
            "output_len": output_len,
            "cached_len": cached_len,
            "cost": default_step_cost(server),
            "max_running_requests": server.max_running,
            "chunked_prefill_size": server.chunk,
            "kv_capacity_tokens": kv_tokens,
            "context_len": server.context_len,
            "split_s": split_time(at_load),
        }
        for at_load in scaled
    ]
    report = None if progress is None else (lambda f: progress("simulate", f))
    results = simulate_all(jobs, report, stop)
    return [
        LoadRun(load, result, float(at_load[-1] - at_load[0]))
        for load, result, at_load in zip(req.loads, results, scaled)
    ]


def plan_requests(
    arrival_s: np.ndarray,
    input_len: np.ndarray,
    output_len: np.ndarray,
    cached_len: np.ndarray | None,
    req: PlanRequest,
    progress: Progress | None = None,
    stop: Callable[[], bool] | None = None,
) -> Plan:
    """Plan from request-level arrays (seconds, tokens); `stop` ends the simulation early and
    the plan then covers the requests simulated so far, marked incomplete."""
    server = server_for(req)
    name = req.trace_name or "the trace"
    if len(arrival_s) == 0:
        raise InputError(f"{name} holds no request", "Plan from a trace with requests.")
    arrays = (arrival_s, input_len, output_len, cached_len)
    kv, notes = _provisional_kv(req, server), []
    asked, runs, replicas = _enough_replicas(arrays, req, server, kv, progress, stop)
    if replicas != req.replicas:
        notes.append(overload_warning(asked, req.replicas, replicas))
    first = runs[0].result
    if first.dropped_requests == first.num_requests:
        raise InputError(
            f"{name}: all {first.num_requests} requests are longer than {req.cfg.name}'s "
            f"context ({server.context_len}) or its KV pool ({kv} tokens)",
            "Plan for a model with a longer context, or a larger GPU.",
        )
    kv_ms = server.cost.kv_read_ms_per_token
    for rounds in range(1, POOL_ROUNDS + 1):
        if progress is not None:
            progress("optimise", 0.0)
        fit = [Scenario(r.load, *r.result.split_tallies()[0].histograms(kv_ms)) for r in runs]
        choice, memory = _choose_and_size(
            req,
            server,
            fit,
            runs[0].result.peak_kv_demand_tokens,
            runs[0].result.typical_request_tokens,
        )
        moved = abs(memory.kv_tokens - kv) > POOL_TOLERANCE * kv
        if not moved or rounds == POOL_ROUNDS or runs[-1].result.completed_fraction < 1.0:
            break
        kv = memory.kv_tokens
        runs = _simulate_loads(arrays, req, server, replicas, kv, progress, stop)
    held = [Scenario(r.load, *r.result.split_tallies()[1].histograms(kv_ms)) for r in runs]
    first = runs[0].result
    summary = {
        "num_requests": first.num_requests,
        "dropped_requests": first.dropped_requests,
        "duration_s": first.duration_s,
        "steps": first.steps,
        "mean_queue_s": first.mean_queue_s,
        "p99_queue_s": first.p99_queue_s,
        "simulated_kv_tokens": kv,
        "pool_rounds": rounds,
        "typical_request_tokens": first.typical_request_tokens,
        "loads": [run.summary() for run in runs],
        "replicas": replicas,
    }
    whole = first.tally().histograms(kv_ms)
    plan = _finish(req, server, choice, memory, fit, held, whole, summary, "requests", replicas)
    plan.warnings[:0] = notes
    if first.completed_fraction < 1.0 or len(runs) < len(req.loads):
        plan.status = "incomplete"
        done = ", ".join(f"{run.load:g}x" for run in runs)
        plan.warnings.insert(
            0,
            f"incomplete: simulation stopped after {first.completed_fraction:.0%} of the "
            "requests; sizes fit only the traffic simulated so far"
            if first.completed_fraction < 1.0
            else f"incomplete: stopped with only the {done} load simulated; sizes fit only it",
        )
    if first.dropped_requests:
        plan.warnings.append(
            f"{first.dropped_requests} requests were longer than the context or the KV pool "
            "and were dropped; the typical length and peak KV demand count only the rest"
        )
    if progress is not None:
        progress("optimise", 1.0)
    return plan


def plan_batches(
    decode_sizes: np.ndarray,
    decode_counts: np.ndarray,
    extend_sizes: np.ndarray,
    extend_counts: np.ndarray,
    req: PlanRequest,
    progress: Progress | None = None,
) -> Plan:
    """Plan from step histograms a server logged (no simulation, no held-out check)."""
    server = server_for(req)
    limits = _limits(req, server)
    decode_sizes, decode_counts, d_over = _clip(decode_sizes, decode_counts, limits.max_bs)
    extend_sizes, extend_counts, e_over = _clip(extend_sizes, extend_counts, limits.max_tokens)
    cost, step_cost = server.cost, default_step_cost(server)
    context_ms = decode_counts * decode_sizes * float(BATCH_TRACE_CONTEXT_TOKENS)
    context_ms = context_ms * cost.kv_read_ms_per_token
    attention = extend_counts * extend_sizes * (extend_sizes + 1) / 2.0 * cost.attention_ms_per_pair
    # No clock ran: time at each size is estimated as the default schedule would take it.
    decode_s = (decode_counts * step_cost.decode_ms[decode_sizes] + context_ms) / 1e3
    extend_s = (extend_counts * step_cost.extend_ms[extend_sizes] + attention) / 1e3
    decode = Histogram(decode_sizes, decode_counts, decode_s, context_ms)
    extend = Histogram(extend_sizes, extend_counts, extend_s, attention)
    if progress is not None:
        progress("optimise", 0.0)
    fit = [Scenario(1.0, decode, extend)]
    choice, memory = _choose_and_size(req, server, fit, 0, BATCH_TRACE_CONTEXT_TOKENS)
    summary = dict.fromkeys(("num_requests", "dropped_requests", "mean_queue_s", "p99_queue_s"), 0)
    summary["steps"] = int(decode_counts.sum() + extend_counts.sum())
    summary["duration_s"] = float(decode_s.sum() + extend_s.sum())
    plan = _finish(req, server, choice, memory, fit, [], (decode, extend), summary, "batches", 1)
    plan.warnings.append(
        f"batch trace: decode context assumed {BATCH_TRACE_CONTEXT_TOKENS} tokens a request; "
        "no arrival times, so no held-out check and no load scenarios"
    )
    for steps, kind, limit, flag in (
        (d_over, "decode steps", limits.max_bs, "--max-running-requests"),
        (e_over, "extend steps", limits.max_tokens, "--chunked-prefill-size"),
    ):
        if steps:
            plan.warnings.append(
                f"{steps:,} {kind} of the trace exceed this server's limit ({limit}, {flag}) "
                "and are left out of the plan: the log is from a server with larger limits"
            )
    if progress is not None:
        progress("optimise", 1.0)
    return plan


def _clip(sizes: np.ndarray, counts: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray, int]:
    """One entry per size within `limit`, ascending, and how many steps lay beyond it."""
    sizes, counts = np.asarray(sizes, np.int64), np.asarray(counts, np.int64)
    keep = (sizes >= 1) & (sizes <= limit) & (counts > 0)
    over = int(counts[(sizes > limit) & (counts > 0)].sum())
    unique, index = np.unique(sizes[keep], return_inverse=True)
    merged = np.bincount(index, weights=counts[keep], minlength=len(unique)).astype(np.int64)
    return unique, merged, over


def _finish(
    req: PlanRequest,
    server: Server,
    choice: RobustChoice,
    memory: MemoryPlan,
    fit: list[Scenario],
    held: list[Scenario],
    whole: tuple[Histogram, Histogram],
    summary: dict[str, Any],
    trace_kind: str,
    replicas: int,
) -> Plan:
    default = server.default
    decode_bs, tokens = choice.decode_bs, choice.tokens
    if req.profile is not None:
        predicted, measured = predicted_graph_bytes(req.profile, req.cfg, req.gpu)
        memory = replace(memory, graph_bytes_predicted=predicted, graph_bytes_measured=measured)
    check_plan_safety(tokens, server.chunk, server.context_len, memory)
    scores = ScoreSet.build(req, server, choice, memory, fit, held)
    # vLLM's list holds token sizes too; other engines' decode flags take its decode part.
    flag_decode = decode_part(decode_bs, choice.cover) if req.engine == "vllm" else decode_bs
    values = FlagValues(
        tuple(flag_decode),
        tuple(tokens),
        memory.mem_fraction_static,
        memory.gpu_memory_utilization,
        memory.trtllm_free_gpu_memory_fraction,
        memory.kv_tokens,
        memory.kv_bytes,
        server.chunk,
        server.max_running,
        req.tp_size,
    )
    inputs = {
        "trace": req.trace_name,
        "trace_kind": trace_kind,
        "model": req.cfg.name,
        "gpu": req.gpu.name,
        "engine": req.engine,
        "engine_version": server.version,
        "profile": req.profile_name,
        "tp_size": req.tp_size,
        "chunked_prefill_size": server.chunk,
        "max_running_requests": server.max_running,
        "context_len": server.context_len,
        "loads": list(req.loads) if trace_kind == "requests" else [1.0],
        "replicas": replicas,
        "compare_plan": req.compare_name,
    }
    plan = Plan(
        inputs=inputs,
        decode=KindPlan(decode_bs, max(decode_bs, default=0), whole[0], list(default.decode_bs)),
        piecewise=KindPlan(
            tokens, max(tokens, default=0), whole[1], list(default.piecewise_tokens)
        ),
        memory=memory,
        comparison=scores.headline,
        comparison_fit=scores.headline_fit,
        scenarios=score_rows(scores),
        flags=all_flags(values, server.version if req.engine == "sglang" else None),
        simulation=summary | {"peak_kv_demand_tokens": memory.peak_kv_demand_tokens},
        basis=plan_basis(server, choice, fit, held, replicas, req),
    )
    plan.warnings.extend(server.cost.warnings)
    plan.warnings.extend(replication_warnings(req))
    plan.warnings.extend(ceiling_warnings(whole[0], default))
    plan.warnings.extend(plan_warnings(scores, req))
    return plan
