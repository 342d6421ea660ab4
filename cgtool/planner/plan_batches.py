"""A plan from step histograms a server logged: no clock, no simulation, no held-out check."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cgtool.documents.plan_document import Plan, Simulation
from cgtool.planner.finish import finish_plan
from cgtool.planner.plan_sizing import choose_and_size, limits_for
from cgtool.planner.request import PlanRequest
from cgtool.planner.robust import Scenario
from cgtool.planner.scoring import Histogram
from cgtool.planner.server import default_step_cost, server_for
from cgtool.planner.step_time import attention_pairs, decode_step_ms, extend_step_ms

Progress = Callable[[str, float], None]
# A batch trace says nothing of context: each decode request is taken to hold this many tokens.
BATCH_TRACE_CONTEXT_TOKENS = 1024


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
    limits = limits_for(req, server)
    decode_sizes, decode_counts, d_over = _clip(decode_sizes, decode_counts, limits.max_bs)
    extend_sizes, extend_counts, e_over = _clip(extend_sizes, extend_counts, limits.max_tokens)
    cost, step_cost = server.cost, default_step_cost(server)
    # No clock ran: time at each size is estimated as the default schedule would take it.
    context_tokens = decode_sizes * float(BATCH_TRACE_CONTEXT_TOKENS)
    context_ms = decode_counts * context_tokens * cost.kv_read_ms_per_token
    pairs = attention_pairs(extend_sizes, 0)
    attention = extend_counts * pairs * cost.attention_ms_per_pair
    decode_ms = decode_step_ms(step_cost.decode_ms[decode_sizes], cost.kv_read_ms_per_token,
                               context_tokens)
    extend_ms = extend_step_ms(step_cost.extend_ms[extend_sizes], cost.attention_ms_per_pair, pairs)
    decode_s, extend_s = decode_counts * decode_ms / 1e3, extend_counts * extend_ms / 1e3
    decode = Histogram(decode_sizes, decode_counts, decode_s, context_ms)
    extend = Histogram(extend_sizes, extend_counts, extend_s, attention)
    if progress is not None:
        progress("optimise", 0.0)
    fit = [Scenario(1.0, decode, extend)]
    choice, memory, notes = choose_and_size(req, server, fit, 0, BATCH_TRACE_CONTEXT_TOKENS)
    summary = Simulation(
        num_requests=0, dropped_requests=0, mean_queue_s=0.0, p99_queue_s=0.0,
        steps=int(decode_counts.sum() + extend_counts.sum()),
        duration_s=float(decode_s.sum() + extend_s.sum()),
    )
    plan = finish_plan(req, server, choice, memory, fit, [], (decode, extend), summary, "batches", 1)
    plan.warnings.extend(notes)
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
