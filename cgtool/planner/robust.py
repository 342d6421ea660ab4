"""Capture sizes that hold up across load scenarios and the range of eager cost.

Each scenario is the fit part of the trace replayed at one load; each eager assumption prices
its steps differently (cgtool.planner.eager). Candidate schedules are the exact optimum
(cgtool.planner.optimiser) under each assumption alone and under their even mixture, every
scenario weighing the same, plus the engine default. Each candidate is then made robust:

- decode: bs 1 (an idle server runs it; a graph budget keeps a graph for it), and SGLang's
  batch list from the optimum's largest size up to the largest batch any (fit) scenario
  reached plus COVER_HEADROOM, a fitted size just below a list size merged into it. Decode
  graphs share one pool and cost a few MB and ~0.1 s each: coverage is not traded away
  unless a budget says so;
- token bins: on the grid (or at the limit, or a default size), and each serving at least
  MIN_BIN_SHARE of the extend steps; in vLLM's one list, each size above the decode cover.

The plan is the candidate whose worst regret over every (scenario, assumption) pair is least:
regret is how much longer its expected step is than the best candidate's in that pair.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from cgtool.planner.eager import EagerAssumption
from cgtool.planner.grid import MIN_BIN_SHARE, decode_grid, decode_grid_up
from cgtool.planner.optimiser import (
    CostedSteps,
    Limits,
    Steps,
    choose_separate,
    choose_shared,
)
from cgtool.planner.schedules import EngineSchedule
from cgtool.planner.scoring import Histogram, ScheduleScore, padded_sizes, score_schedule

# Tomorrow's busiest minute is busier than today's: decode graphs reach this far past the
# largest batch seen.
COVER_HEADROOM = 1.25


@dataclass(frozen=True, eq=False)
class Scenario:
    """Steps of one part of the trace replayed at one load."""

    load: float
    decode: Histogram
    extend: Histogram

    @property
    def largest_batch(self) -> int:
        return int(self.decode.sizes[self.decode.counts > 0].max(initial=0))


@dataclass(frozen=True, slots=True)
class Schedule:
    name: str
    decode_bs: tuple[int, ...]
    tokens: tuple[int, ...]
    pads: bool = True


@dataclass(slots=True)
class RobustChoice:
    decode_bs: list[int]
    tokens: list[int]
    worst_regret: float  # of the plan over the fit scenarios and assumptions
    max_bs_reason: str
    reached: int  # largest decode batch any fit scenario reached
    cover: int  # decode graphs are meant to reach this batch (reached plus headroom)


def _steps(scenarios: list[Scenario], weights: dict[str, float], assumptions, kind: str):
    steps = []
    for sc in scenarios:
        hist = sc.decode if kind == "decode" else sc.extend
        total = float(hist.counts.sum())
        if not total:
            continue
        for a in assumptions:
            if weights.get(a.name, 0.0) <= 0:
                continue
            graph = a.cost.decode_graph_ms if kind == "decode" else a.cost.extend_graph_ms
            eager = a.cost.decode_eager_ms if kind == "decode" else a.cost.extend_eager_ms
            share = hist.counts / total * weights[a.name]
            steps.append(CostedSteps(hist.sizes, share, graph, eager))
    return steps


def _weightings(assumptions: list[EagerAssumption]) -> list[dict[str, float]]:
    names = [a.name for a in assumptions]
    single = [{n: 1.0} for n in names]
    return single + ([dict.fromkeys(names, 1.0 / len(names))] if len(names) > 1 else [])


def scenario_score(
    name: str, sc: Scenario, a: EagerAssumption, s: Schedule, kv_tokens: int = 0
) -> ScheduleScore:
    return score_schedule(
        name,
        sc.decode,
        sc.extend,
        a.cost,
        list(s.decode_bs),
        list(s.tokens),
        pads=s.pads,
        kv_tokens=kv_tokens,
    )


def choose_robust(
    scenarios: list[Scenario],
    assumptions: list[EagerAssumption],
    default: EngineSchedule,
    limits: Limits,
    engine: str,
) -> RobustChoice:
    """The least-worst-regret schedule (see the module doc)."""
    cost = assumptions[0].cost  # graph memory and capture time do not depend on eager cost
    choose = choose_shared if engine == "vllm" else choose_separate
    reached = max((sc.largest_batch for sc in scenarios), default=0)
    # The default's token sizes past the limit (a model's context below the engine's chunk)
    # serve no step the plan allows: as a candidate it keeps those within.
    within = tuple(t for t in default.piecewise_tokens if t <= limits.max_tokens)
    candidates = [Schedule("default", default.decode_bs, within, default.pads)]
    shared = engine == "vllm"
    optimum_limits = _room_for_bs_1(limits, shared)
    cover = cover_size(reached, limits)
    tops: dict[str, int] = {}
    for weights in _weightings(assumptions):
        steps = Steps(
            _steps(scenarios, weights, assumptions, "decode"),
            _steps(scenarios, weights, assumptions, "extend"),
        )
        d, t = choose(steps, cost, default, optimum_limits)
        if len(weights) == 1:
            tops[next(iter(weights))] = max(d, default=0)
        if shared:
            # vLLM's one list: sizes up to the decode cover are decode graphs (or their
            # headroom), judged by decode; those above serve extend steps alone.
            t = prune_rare_bins(t, scenarios, fixed=frozenset(s for s in t if s <= cover))
            d = [s for s in d if s in t]
        else:
            t = prune_rare_bins(t, scenarios)
        d, t = cover_decode(d, t, reached, limits, cost, shared=shared)
        candidates.append(Schedule("+".join(weights), tuple(d), tuple(t)))
    allowed = [c for c in candidates if _within_budgets(c, limits, cost)]
    best, regret = _least_worst_regret(allowed or candidates[1:], scenarios, assumptions)
    if engine == "vllm":
        reason = (
            f"decode graphs reach {cover}: the largest batch the fitted requests reached at any "
            f"load ({reached}) "
            f"with {COVER_HEADROOM - 1:.0%} headroom; vLLM also captures a full graph for every "
            f"larger size of its one list up to --max-num-seqs {limits.max_bs}"
        )
    else:
        reason = _max_bs_reason(best, reached, tops, limits)
    return RobustChoice(list(best.decode_bs), list(best.tokens), regret, reason, reached, cover)


def _within_budgets(s: Schedule, limits: Limits, cost) -> bool:
    graphs = len(s.decode_bs) + len(s.tokens)
    if limits.budget_graphs is not None and graphs > limits.budget_graphs:
        return False
    budget = limits.budget_memory_bytes
    return budget is None or cost.graph_bytes(list(s.decode_bs), list(s.tokens)) <= budget


def _least_worst_regret(
    candidates: list[Schedule], scenarios: list[Scenario], assumptions: list[EagerAssumption]
) -> tuple[Schedule, float]:
    pairs = [(sc, a) for sc in scenarios for a in assumptions]
    ms = np.array(
        [[scenario_score(c.name, sc, a, c).expected_step_ms for sc, a in pairs] for c in candidates]
    )
    regret = (ms / np.maximum(ms.min(axis=0), 1e-12) - 1.0).max(axis=1)
    # Among candidates within a hair of the least worst regret, the fewest graphs.
    near = np.nonzero(regret <= regret.min() + 1e-4)[0]
    pick = min(near, key=lambda i: len(candidates[i].decode_bs) + len(candidates[i].tokens))
    return candidates[pick], float(regret[pick])


def _room_for_bs_1(limits: Limits, shared: bool) -> Limits:
    """The limits the optimum is sought under: a graph budget less the graphs bs 1 takes
    (two in vLLM's shared list, full and piecewise), which cover_decode adds first."""
    taken = 2 if shared else 1
    if limits.budget_graphs is None or limits.budget_graphs < taken:
        return limits
    return replace(limits, budget_graphs=limits.budget_graphs - taken)


def prune_rare_bins(
    tokens: list[int], scenarios: list[Scenario], fixed: frozenset[int] = frozenset()
) -> list[int]:
    """Drop token bins that serve under MIN_BIN_SHARE of the extend steps (each scenario
    weighing the same); their steps pad to the next bin up, or run eagerly above the last.
    Sizes in `fixed` stay, and take the steps that pad into them."""
    kept = sorted(tokens)
    while len(kept) > len(fixed & set(kept)):
        shares = np.zeros(len(kept))
        for sc in scenarios:
            total = float(sc.extend.counts.sum())
            if not total:
                continue
            padded = padded_sizes(sc.extend.sizes, kept)
            for i, size in enumerate(kept):
                shares[i] += sc.extend.counts[padded == size].sum() / total / len(scenarios)
        shares[[size in fixed for size in kept]] = np.inf
        rarest = int(shares.argmin())
        if shares[rarest] >= MIN_BIN_SHARE:
            break
        kept.pop(rarest)
    return kept


def cover_size(reached: int, limits: Limits) -> int:
    """The batch decode graphs should reach: the largest seen plus headroom, on SGLang's list."""
    return decode_grid_up(math.ceil(reached * COVER_HEADROOM), limits.max_bs) if reached else 1


def cover_decode(
    decode: list[int], tokens: list[int], reached: int, limits: Limits, cost, *, shared: bool
) -> tuple[list[int], list[int]]:
    """Add bs 1 and SGLang's batch list up to the covered batch, within the budgets; vLLM's
    shared list gains the same sizes."""
    cover = cover_size(reached, limits)
    # vLLM's list runs on into token sizes: the gap to fill is above the batches seen.
    top = max((size for size in decode if size <= reached), default=0)
    grid = decode_grid(cover)
    below = dict(zip(grid, [0, *grid]))  # each grid size's predecessor on the list
    extra = [1] + [s for s in grid if s > top]
    d, t = sorted(set(decode)), sorted(set(tokens))
    for size in extra:
        if size in d:
            continue
        # A fitted size just below a grid size (271 under 272) would stand beside it: the
        # grid size takes its batches, one or a few rows of padding each.
        merged = {s for s in d if below.get(size, size) < s < size and s != 1}
        nd = sorted(set(d) - merged | {size})
        nt = sorted(set(t) - merged | {size}) if shared else t
        if limits.budget_graphs is not None and len(nd) + len(nt) > limits.budget_graphs:
            break
        if (
            limits.budget_memory_bytes is not None
            and cost.graph_bytes(nd, nt) > limits.budget_memory_bytes
        ):
            break
        d, t = nd, nt
    return d, t


def _max_bs_reason(best: Schedule, reached: int, tops: dict[str, int], limits: Limits) -> str:
    top = max(best.decode_bs, default=0)
    alone = ", ".join(f"{top_a} under the {name} eager cost" for name, top_a in tops.items())
    if best.name == "default":
        return f"max-bs {top}: the engine default's, which regrets least here"
    if top >= reached:
        return (
            f"max-bs {top}: covers the largest decode batch the fitted requests reached at any "
            f"load ({reached}) "
            f"with {COVER_HEADROOM - 1:.0%} headroom, capped at {limits.max_bs}; "
            f"step time alone would stop at {alone}"
        )
    return (f"max-bs {top}: a budget stops decode graphs below the largest batch the fitted "
            f"requests reached ({reached})")
