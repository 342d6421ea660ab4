"""Where the plan's clients fare worse than the default's: sizes from the default's grid added.

The optimiser weighs sizes by the mean step time, so a rare step pads to whatever graph lies
above it at little cost to the mean. Its clients still feel it: SGLang 0.5.23 captures prefill
graphs through the chunk, so an extend step above the plan's fitted ceiling (4,161-8,191 tokens
on the bundled example) pads to the chunk's graph, nearly twice its work, and the requests
behind it wait for that step. Such steps are few, and they set the p99s. So the plan is held
to the closed loop (cgtool.planner.closed_loop): where it loses to the engine default on a
client's figure by more than TAIL_TOLERANCE at any load and eager assumption, the default's
sizes that the plan lacks are offered in the order of the step time they save (those in the
plan's widest gaps, where it pads far more than the default, come first), and the shortest
run of them that brings every figure back within the tolerance is kept. On a long trace the
run is searched for on the first fit requests and kept only if all of them confirm it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from cgtool.documents.plan_document import ClosedLoopRow
from cgtool.planner.cost import CostModel
from cgtool.planner.schedules import EngineSchedule
from cgtool.planner.scoring import Histogram, dense_ms

T = TypeVar("T")

# The search serves each candidate head in a closed loop; on a long trace it serves only each
# replica's first this many fit requests, and the head it finds is then served on all of them
# and kept only if it holds there (else the search is run again on all of them). A p99 over
# 50,000 requests rests on 500 of them, and the plan and the default see the same arrivals,
# so the two runs differ by their step times, not by chance; the million-request benchmark's
# seven searched loops of 350,000 requests were half its time (issue 36).
PROBE_REQUESTS_PER_REPLICA = 50_000

# A plan may trail the default by this share on a client's figure. It is the margin at which
# the plan already says the default's clients fare better (closed_loop.worse_lines): below
# the spread of repeated runs of one serving benchmark, so a user cannot tell the two apart,
# while a step padded to the chunk moves a p99 by tens of percent.
TAIL_TOLERANCE = 0.02
# Client figures compared, and whether a larger value is worse.
FIGURES = (("ttft_p50_s", "TTFT p50", True), ("ttft_p99_s", "TTFT p99", True),
           ("tpot_p50_ms", "TPOT p50", True), ("tpot_p99_ms", "TPOT p99", True),
           ("output_tokens_per_s", "output tokens/s", False))


def shortfall(rows: list[ClosedLoopRow]) -> tuple[float, str]:
    """The plan's worst loss to the default over every load, eager assumption and client
    figure, as a share (0 when it loses nowhere), and where it is."""
    index = {(r.schedule, r.load, r.eager): r for r in rows}
    worst, where = 0.0, ""
    for (name, load, eager), plan in index.items():
        default = index.get(("default", load, eager))
        if name != "plan" or default is None:
            continue
        for field, label, larger_worse in FIGURES:
            ours, theirs = getattr(plan, field), getattr(default, field)
            if theirs <= 0 or ours <= 0:
                continue
            loss = ours / theirs - 1 if larger_worse else theirs / ours - 1
            if loss > worst:
                worst, where = loss, f"{label} at {load:g}x ({eager} eager cost)"
    return worst, where


def offered_sizes(plan: Sequence[int], default: Sequence[int], top: int) -> list[int]:
    """The default's sizes up to `top` (the plan's largest) that the plan lacks: at each the
    plan pads a step the default replays exactly, the more so the wider the plan's gap."""
    return sorted({s for s in default if s <= top} - set(plan))


def by_saving(
    offered: list[int], plan: Sequence[int], steps: list[Histogram], graph_ms: np.ndarray,
    eager_ms: np.ndarray,
) -> list[int]:
    """`offered` in the order a greedy choice adds them: each next the size that saves the
    most step time over `steps` (every load's run) given those before it."""
    chosen, left = list(plan), list(offered)
    order = []

    def total(sizes: list[int]) -> float:
        return sum(dense_ms(h.sizes, h.counts, graph_ms, eager_ms, sizes) for h in steps)

    while left:
        best = min(left, key=lambda s: total(chosen + [s]))
        chosen.append(best)
        left.remove(best)
        order.append(best)
    return order


def offers(
    decode_bs: Sequence[int], tokens: Sequence[int], default: EngineSchedule,
    steps: list[tuple[Histogram, Histogram]], cost: CostModel,
) -> list[tuple[str, int]]:
    """The default's sizes the plan lacks, ("prefill" or "decode", size): prefill first, as the
    rare long prefill steps set the tails, each kind by step time saved over `steps` (every
    load's (decode, extend) histograms)."""
    prefill = by_saving(offered_sizes(tokens, default.piecewise_tokens, max(tokens, default=0)),
                        tokens, [e for _, e in steps], cost.extend_graph_ms, cost.extend_eager_ms)
    decode = by_saving(offered_sizes(decode_bs, default.decode_bs, max(decode_bs, default=0)),
                       decode_bs, [d for d, _ in steps], cost.decode_graph_ms, cost.decode_eager_ms)
    return [("prefill", s) for s in prefill] + [("decode", s) for s in decode]


def probe_size(fit_requests: int, replicas: int) -> int:
    """How many of the fit requests the search serves (all of them up to the probe's size)."""
    return min(fit_requests, PROBE_REQUESTS_PER_REPLICA * replicas)


def fewest_that_fix(
    order: list[T], worst_with: Callable[[list[T]], float], tolerance: float = TAIL_TOLERANCE,
) -> list[T] | None:
    """A short head of `order` whose closed loop (`worst_with(added)`: its shortfall) comes
    within `tolerance`, found by bisection on the head's length; None when not even all of
    them do. The head returned was simulated and fixes it. A shorter one may fix it too: a
    graph shortens steps but also shrinks the KV pool and moves the queue, so the shortfall
    falls with the head's length only roughly, and bisection keeps the simulations to a few."""
    if not order or worst_with(order) > tolerance:
        return None
    low, high = 0, len(order)  # a head of `high` fixes it; one of `low` is not known to
    while high - low > 1:
        mid = (low + high) // 2
        if worst_with(order[:mid]) <= tolerance:
            high = mid
        else:
            low = mid
    return order[:high]


def whole_trace_shortfall(rows: list[ClosedLoopRow]) -> str | None:
    """The sizes were matched on the fit requests alone (no held-out request moves a size); where
    the whole trace's runs still leave the plan behind the default, a line that says so."""
    worst, where = shortfall(rows)
    if worst <= TAIL_TOLERANCE:
        return None
    return (f"closed loop: over the whole trace, held-out requests included, the plan's {where} "
            f"still trails the engine default's by {worst:.0%} (predicted)")
