"""A plan end to end: simulate the trace at each load, choose sizes, size memory, score.

The trace is run through the scheduler once per load scenario, with the engine default's step
times (the server as it runs today) and the KV pool the plan recommends (iterated to a fixed
point, since the pool depends on the graphs chosen). Sizes are fitted on the steps before the
held-out split (cgtool.planner.scenarios) under every eager-cost assumption
(cgtool.planner.robust); the plan, the default and an existing plan are then scored on the
same held-out steps. Every gain is a prediction of the cost model, and the plan says so.

The result is the plan.json document itself (cgtool.documents.plan_document.Plan): cgtool.planner.finish
copies the planner's working results (histograms, scores) into it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from cgtool.errors import InputError
from cgtool.documents.plan_document import LoadSummary, Plan, PlanMemory, Simulation
from cgtool.planner.engine_buffers import engine_graph_buffers
from cgtool.planner.finish import finish_plan
from cgtool.planner.memory import plan_memory
from cgtool.planner.optimiser import Limits
from cgtool.planner.request import PlanRequest
from cgtool.planner.robust import RobustChoice, Scenario, choose_robust
from cgtool.planner.scenarios import (
    LoadRun,
    overload_warning,
    replica_share,
    replicas_needed,
    split_time,
)
from cgtool.planner.scoring import Histogram
from cgtool.planner.server import Server, default_step_cost, server_for
from cgtool.planner.sim_parallel import simulate_all
from cgtool.planner.sim_result import SimulationResult

Progress = Callable[[str, float], None]
# A batch trace says nothing of context: each decode request is taken to hold this many tokens.
BATCH_TRACE_CONTEXT_TOKENS = 1024
# The KV pool is re-simulated until the recommended one moves by less than this share.
POOL_TOLERANCE = 0.02
POOL_ROUNDS = 3
# Replica estimates are re-simulated until one sustains every load scenario, at most this often.
REPLICA_ROUNDS = 4


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
    if len(arrival_s) == 0:
        raise InputError(f"{req.trace_name or 'the trace'} holds no request",
                         "Plan from a trace with requests.")
    arrays = (arrival_s, input_len, output_len, cached_len)
    kv = _provisional_kv(req, server)
    asked, replicas = _enough_replicas(_fit_requests(arrays), req, server, kv, progress, stop)
    runs = _simulate_loads(arrays, req, server, replicas, kv, progress, stop)
    _check_some_fit(runs[0].result, req, server, kv)
    pool = _fit_pool(arrays, req, server, runs, kv, replicas, progress, stop)
    kv_ms = server.cost.kv_read_ms_per_token
    held = [Scenario(r.load, *r.result.split_tallies()[1].histograms(kv_ms)) for r in pool.runs]
    first = pool.runs[0].result
    whole = first.tally().histograms(kv_ms)
    plan = finish_plan(req, server, pool.choice, pool.memory, pool.fit, held, whole,
                       _simulation(pool, replicas), "requests", replicas)
    if replicas != req.replicas:
        plan.warnings.insert(0, overload_warning(asked, req.replicas, replicas))
    _note_incomplete(plan, pool.runs, req)
    if first.dropped_requests:
        plan.warnings.append(
            f"{first.dropped_requests} requests were longer than the context or the KV pool "
            "and were dropped; the typical length and peak KV demand count only the rest"
        )
    if progress is not None:
        progress("optimise", 1.0)
    return plan


def _check_some_fit(first: SimulationResult, req: PlanRequest, server: Server, kv: int) -> None:
    if first.dropped_requests == first.num_requests:
        raise InputError(
            f"{req.trace_name or 'the trace'}: all {first.num_requests} requests are longer "
            f"than {req.cfg.name}'s context ({server.context_len}) or its KV pool ({kv} tokens)",
            "Plan for a model with a longer context, or a larger GPU.",
        )


def _fit_requests(arrays: tuple[Any, ...]) -> tuple[Any, ...]:
    """The requests that arrive before the whole trace's held-out split: all the replica
    count is chosen on, so that no held-out request moves it (issue 34). A trace whose
    requests all arrive at the split (one burst) has no fit part: then all of it."""
    arrival = np.asarray(arrays[0], dtype=np.float64)
    keep = arrival < split_time(np.sort(arrival))
    if not keep.any():
        return arrays
    return tuple(None if a is None else np.asarray(a)[keep] for a in arrays)


def _enough_replicas(
    fit_arrays: tuple[Any, ...], req: PlanRequest, server: Server, kv: int,
    progress: Progress | None, stop: Callable[[], bool] | None,
) -> tuple[list[LoadRun], int]:
    """(runs of the fit requests at the asked-for replicas, the fewest replicas from there up
    at which no load scenario of them overloads). Each estimate is checked by simulating it,
    so re-planning at the count the plan names (as `verify` does, or a user pasting
    --replicas) finds it again."""
    replicas = req.replicas
    asked = runs = _simulate_loads(fit_arrays, req, server, replicas, kv, progress, stop)
    for _ in range(REPLICA_ROUNDS):
        needed = replicas_needed(runs, replicas)
        if needed is None or runs[-1].result.completed_fraction < 1.0:
            break
        replicas = needed
        runs = _simulate_loads(fit_arrays, req, server, replicas, kv, progress, stop)
    return asked, replicas


def _provisional_kv(req: PlanRequest, server: Server) -> int:
    """The pool the plan would recommend with the default's graphs: the first guess."""
    d = server.default
    return _memory(req, server, d.decode_bs, d.piecewise_tokens, 0, 1).kv_tokens


def _memory(
    req: PlanRequest,
    server: Server,
    decode_bs: list[int] | tuple[int, ...],
    tokens: list[int] | tuple[int, ...],
    peak_kv: int,
    typical: int,
) -> PlanMemory:
    """plan_memory for these graphs on this server (peak KV demand and typical request size
    in tokens)."""
    memory = plan_memory(
        req.cfg,
        req.gpu.memory_bytes,
        graph_bytes=server.cost.graph_bytes(decode_bs, tokens),
        chunked_prefill_size=server.chunk,
        max_running_requests=server.max_running,
        peak_kv_demand_tokens=peak_kv,
        typical_request_tokens=typical,
        default_mem_fraction_static=server.default_fraction,
        tp_size=req.tp_size,
    )
    # The engine's pool as the comparison scores it: vLLM's from its own bytes, not from the
    # fraction rounded to 3 decimals (453,342 tokens, against 453,600 beside it).
    memory.default_kv_tokens = server.default_kv_tokens
    return memory


@dataclass(slots=True)
class _PoolFit:
    """The runs at the KV pool the plan settles on, and the sizes chosen from them."""

    runs: list[LoadRun]
    kv_tokens: int  # the pool the runs admitted against
    rounds: int
    choice: RobustChoice
    memory: PlanMemory
    fit: list[Scenario]


def _fit_pool(
    arrays: tuple[Any, ...], req: PlanRequest, server: Server, runs: list[LoadRun], kv: int,
    replicas: int, progress: Progress | None, stop: Callable[[], bool] | None,
) -> _PoolFit:
    """Choose sizes and memory, re-simulating at the recommended KV pool until it settles."""
    kv_ms = server.cost.kv_read_ms_per_token
    rounds = 1
    while True:
        if progress is not None:
            progress("optimise", 0.0)
        fit = [Scenario(r.load, *r.result.split_tallies()[0].histograms(kv_ms)) for r in runs]
        first = runs[0].result
        choice, memory = _choose_and_size(
            req, server, fit, first.peak_kv_demand_tokens, first.typical_request_tokens
        )
        moved = abs(memory.kv_tokens - kv) > POOL_TOLERANCE * kv
        if not moved or rounds == POOL_ROUNDS or runs[-1].result.completed_fraction < 1.0:
            return _PoolFit(runs, kv, rounds, choice, memory, fit)
        kv, rounds = memory.kv_tokens, rounds + 1
        runs = _simulate_loads(arrays, req, server, replicas, kv, progress, stop)


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


def _simulation(pool: _PoolFit, replicas: int) -> Simulation:
    first = pool.runs[0].result
    return Simulation(
        num_requests=first.num_requests,
        dropped_requests=first.dropped_requests,
        duration_s=first.duration_s,
        steps=first.steps,
        mean_queue_s=first.mean_queue_s,
        p99_queue_s=first.p99_queue_s,
        simulated_kv_tokens=pool.kv_tokens,
        pool_rounds=pool.rounds,
        typical_request_tokens=first.typical_request_tokens,
        loads=[LoadSummary(**run.summary()) for run in pool.runs],
        replicas=replicas,
    )


def _note_incomplete(plan: Plan, runs: list[LoadRun], req: PlanRequest) -> None:
    first = runs[0].result
    if first.completed_fraction >= 1.0 and len(runs) == len(req.loads):
        return
    plan.status = "incomplete"
    done = ", ".join(f"{run.load:g}x" for run in runs)
    plan.warnings.insert(
        0,
        f"incomplete: simulation stopped after {first.completed_fraction:.0%} of the "
        "requests; sizes fit only the traffic simulated so far"
        if first.completed_fraction < 1.0
        else f"incomplete: stopped with only the {done} load simulated; sizes fit only it",
    )


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
    summary = Simulation(
        num_requests=0, dropped_requests=0, mean_queue_s=0.0, p99_queue_s=0.0,
        steps=int(decode_counts.sum() + extend_counts.sum()),
        duration_s=float(decode_s.sum() + extend_s.sum()),
    )
    plan = finish_plan(req, server, choice, memory, fit, [], (decode, extend), summary, "batches", 1)
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


def _limits(req: PlanRequest, server: Server) -> Limits:
    return Limits(
        server.max_running,
        min(server.chunk, server.context_len),
        req.budget_graphs,
        req.budget_memory_bytes,
    )


def _choose_and_size(
    req: PlanRequest, server: Server, fit: list[Scenario], peak_kv: int, typical: int
) -> tuple[RobustChoice, PlanMemory]:
    choice = choose_robust(
        fit, list(server.assumptions), server.default, _limits(req, server), req.engine
    )
    memory = _memory(req, server, choice.decode_bs, choice.tokens, peak_kv, typical)
    if server.attention_backend is not None:
        ours, default = (
            engine_graph_buffers(
                req.cfg, server.attention_backend, max(sizes, default=0), server.context_len,
                req.gpu, server.version, req.tp_size,
            )
            for sizes in (choice.decode_bs, server.default.decode_bs)
        )
        memory.attention_backend = server.attention_backend
        memory.attention_buffer_bytes, memory.static_input_bytes = ours.attention_bytes, ours.static_input_bytes
        memory.default_attention_buffer_bytes = default.attention_bytes
        memory.default_static_input_bytes = default.static_input_bytes
    return choice, memory
