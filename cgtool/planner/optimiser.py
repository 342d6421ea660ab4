"""Exact choice of capture sizes: an optimal 1-D partition by dynamic programming.

A step of size s replays the smallest captured size >= s (paying that size's graph time) or,
above the largest captured size, runs eagerly. With candidates c_1 < ... < c_m and P[j] the
number of observed steps of size <= c_j, the best cost of covering every size <= c_j with k
graphs, the largest being c_j, is

    f_k[j] = min over i < j of  f_{k-1}[i] + (P[j] - P[i]) * graph_ms[c_j]

and the best schedule with k graphs is min over j of f_k[j] plus the eager cost of the steps
above c_j. Step times never fall with size (the cost model makes its tables so), hence the
captured sizes worth having are sizes that occur: any other can be lowered to the largest
occurring size below it at no cost. The candidates are the observed sizes plus the engine
default's, which keeps the default itself within the search.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cgtool.planner.cost import CostModel
from cgtool.planner.grid import token_grid_up
from cgtool.planner.schedules import EngineSchedule
from cgtool.planner.scoring import dense_ms

# Sizes stop being added once all further ones together would cut the expected step by less
# than this share: below run-to-run noise of a serving benchmark, while each graph costs
# capture time and memory.
MIN_GAIN_FRACTION = 1e-3
# Above this many distinct candidate sizes, candidates are rounded up to a grid (the DP is
# quadratic in them); the optimum is then exact over that grid.
MAX_CANDIDATES = 512
MIN_SEARCHED_GRAPHS = 32


@dataclass(frozen=True, eq=False)
class Partition:
    """Best schedules of one kind of step for every number of graphs up to `max_graphs`."""

    candidates: np.ndarray  # [m] sizes that may be captured, ascending
    totals_ms: np.ndarray  # [K + 1] best summed dense ms with at most k graphs (k = 0: all eager)
    uses: np.ndarray  # [K + 1] how many graphs that best schedule really has
    back: list[np.ndarray]  # back[k][j]: index of the previous graph when graph k sits at j
    ends: np.ndarray  # [K + 1] index of the largest graph of the best exact-k schedule

    @property
    def max_graphs(self) -> int:
        return len(self.totals_ms) - 1

    def sizes(self, k: int) -> list[int]:
        """The best schedule with at most k graphs."""
        k = int(self.uses[k])
        chosen, j = [], int(self.ends[k])
        for layer in range(k, 0, -1):
            chosen.append(int(self.candidates[j]))
            j = int(self.back[layer][j])
        return sorted(chosen)


def candidate_sizes(
    observed: np.ndarray, extra: list[int] | tuple[int, ...], limit: int
) -> np.ndarray:
    """Observed sizes and `extra` ones up to `limit` (and the largest observed), on a grid
    when there are too many."""
    observed = observed[observed <= limit]
    if not len(observed):
        return np.zeros(0, dtype=np.int64)
    top = int(observed.max())
    extra_sizes = np.array([s for s in extra if s <= min(limit, top)], dtype=np.int64)
    sizes = np.unique(np.concatenate([observed, extra_sizes]))
    step = 1
    while len(sizes) > MAX_CANDIDATES:
        step *= 2
        grid = np.minimum(-(-observed // step) * step, limit)
        sizes = np.unique(np.concatenate([grid, extra_sizes]))
    return sizes.astype(np.int64)


@dataclass(frozen=True, eq=False)
class CostedSteps:
    """Observed steps of one kind and their dense ms by size (index = size)."""

    sizes: np.ndarray
    counts: np.ndarray
    graph_ms: np.ndarray
    eager_ms: np.ndarray


def best_partitions(
    sizes: np.ndarray,
    counts: np.ndarray,
    graph_ms: np.ndarray,
    eager_ms: np.ndarray,
    candidates: np.ndarray,
    max_graphs: int,
) -> Partition:
    """Exact best schedules over `candidates` for 0..max_graphs graphs (see the module doc)."""
    return best_shared_partitions(
        [CostedSteps(sizes, counts, graph_ms, eager_ms)], candidates, max_graphs
    )


def best_shared_partitions(
    kinds: list[CostedSteps], candidates: np.ndarray, max_graphs: int
) -> Partition:
    """As best_partitions, for one list of sizes that several kinds of step pad into (vLLM
    captures one list for decode and mixed batches): a bucket's cost sums over the kinds."""
    m = len(candidates)
    steps_upto = np.zeros((len(kinds), m))  # P_kind[j]
    graph = np.zeros((len(kinds), m))  # graph_ms_kind[c_j]
    tail = np.zeros(m)  # eager cost of the steps above c_j, all kinds
    eager_total = 0.0
    for row, kind in enumerate(kinds):
        order = np.argsort(kind.sizes)
        sizes, counts = kind.sizes[order], kind.counts[order].astype(np.float64)
        eager = counts * kind.eager_ms[sizes]
        covered = np.searchsorted(sizes, candidates, side="right")  # steps of size <= c_j
        steps_upto[row] = np.concatenate([[0.0], np.cumsum(counts)])[covered]
        tail += eager.sum() - np.concatenate([[0.0], np.cumsum(eager)])[covered]
        graph[row] = kind.graph_ms[candidates]
        eager_total += float(eager.sum())
    if m == 0 or max_graphs == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Partition(
            candidates,
            np.array([eager_total]),
            np.zeros(1, dtype=np.int64),
            [empty],
            np.zeros(1, dtype=np.int64),
        )
    own = (steps_upto * graph).sum(axis=0)  # every step up to c_j padded to c_j
    f = own.copy()  # one graph, the largest at c_j
    exact, ends = [eager_total, float((f + tail).min())], [0, int((f + tail).argmin())]
    back = [np.zeros(m, dtype=np.int64), np.zeros(m, dtype=np.int64)]
    later = ~np.tri(m, m, 0, dtype=bool)  # later[i, j]: i < j
    already = (
        steps_upto.T @ graph
    )  # [i, j]: steps up to c_i priced at c_j, which c_i serves instead
    for _ in range(2, min(max_graphs, m) + 1):
        paths = np.where(later, f[:, None] - already, np.inf)
        previous = paths.argmin(axis=0)
        f = paths[previous, np.arange(m)] + own
        back.append(previous)
        exact.append(float((f + tail).min()))
        ends.append(int((f + tail).argmin()))
    exact_arr = np.array(exact)
    # More graphs than candidates cannot help: the best with k > m is the best with m.
    uses = np.array([int(exact_arr[: k + 1].argmin()) for k in range(max_graphs + 1)])
    return Partition(candidates, exact_arr[uses], uses, back, np.array(ends))


def choose_graph_count(
    partition: Partition, *, not_worse_than_ms: float | None = None, max_graphs: int | None = None
) -> int:
    """Fewest graphs that come within MIN_GAIN_FRACTION of the best schedule searched (the
    graphs beyond would not pay for their capture time and memory), and that are not worse than
    `not_worse_than_ms` (summed) when that is reachable."""
    limit = partition.max_graphs if max_graphs is None else min(max_graphs, partition.max_graphs)
    totals = partition.totals_ms[: limit + 1]
    good_enough = totals[-1] * (1 + MIN_GAIN_FRACTION)
    if not_worse_than_ms is not None and not_worse_than_ms >= totals[-1]:
        good_enough = min(good_enough, not_worse_than_ms)
    k = int(np.argmax(totals <= good_enough * (1 + 1e-12)))
    return int(partition.uses[k])


@dataclass(frozen=True, slots=True)
class Limits:
    """What bounds a schedule: the sizes a server can run, and the user's budgets."""

    max_bs: int  # --max-running-requests
    max_tokens: int  # min(chunked prefill size, context length)
    budget_graphs: int | None = None
    budget_memory_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class Steps:
    """The steps sizes are chosen for: each kind's steps under every weighted assumption."""

    decode: list[CostedSteps]
    extend: list[CostedSteps]


def _observed(kinds: list[CostedSteps]) -> np.ndarray:
    return np.unique(np.concatenate([k.sizes[k.counts > 0] for k in kinds] + [np.zeros(0, int)]))


def token_candidates(kinds: list[CostedSteps], default: tuple[int, ...], limit: int) -> np.ndarray:
    """Token bins may sit only on the grid (cgtool.planner.grid), at the limit, or at the default's sizes."""
    observed = _observed(kinds)
    observed = np.unique(token_grid_up(observed[observed <= limit], limit))
    return candidate_sizes(observed, default, limit)


def _searched(budget: int | None, default: tuple[int, ...]) -> int:
    # Up to the default's number of graphs (at least MIN_SEARCHED_GRAPHS), or the budget.
    return max(budget or 0, len(default), MIN_SEARCHED_GRAPHS)


def choose_separate(
    steps: Steps, cost: CostModel, default: EngineSchedule, limits: Limits
) -> tuple[list[int], list[int]]:
    """SGLang and TensorRT-LLM: a decode list and a token list, each optimised on its steps
    (summed over the scenarios given, each already weighted), neither worse than the default's
    on the same steps (the default is among those searched)."""
    decode, extend = steps.decode, steps.extend
    d_cand = candidate_sizes(_observed(decode), default.decode_bs, limits.max_bs)
    e_cand = token_candidates(extend, default.piecewise_tokens, limits.max_tokens)
    d_part = best_shared_partitions(
        decode, d_cand, _searched(limits.budget_graphs, default.decode_bs)
    )
    e_part = best_shared_partitions(
        extend, e_cand, _searched(limits.budget_graphs, default.piecewise_tokens)
    )
    if limits.budget_graphs is not None:
        n = limits.budget_graphs  # the best split of n graphs between the two kinds
        kd = min(range(n + 1), key=lambda k: d_part.totals_ms[k] + e_part.totals_ms[n - k])
        kd, ke = int(d_part.uses[kd]), int(e_part.uses[n - kd])
    else:
        kd = choose_graph_count(
            d_part, not_worse_than_ms=_total(decode, default.decode_bs, default.pads)
        )
        ke = choose_graph_count(
            e_part, not_worse_than_ms=_total(extend, default.piecewise_tokens, default.pads)
        )
    if limits.budget_memory_bytes is not None:
        kd, ke = _fit_memory_budget(limits.budget_memory_bytes, cost, d_part, e_part, kd, ke)
    return d_part.sizes(kd), e_part.sizes(ke)


def _total(kinds: list[CostedSteps], captured: tuple[int, ...], pads: bool) -> float:
    return sum(
        dense_ms(k.sizes, k.counts, k.graph_ms, k.eager_ms, captured, pads) for k in kinds
    )


def _fit_memory_budget(
    budget: int, cost: CostModel, d_part: Partition, e_part: Partition, kd: int, ke: int
) -> tuple[int, int]:
    """Give up graphs, cheapest in step time per byte saved first, until they fit `budget`."""
    while cost.graph_bytes(d_part.sizes(kd), e_part.sizes(ke)) > budget and (kd or ke):
        now = cost.graph_bytes(d_part.sizes(kd), e_part.sizes(ke))
        options = []
        for nkd, nke in ((kd - 1, ke), (kd, ke - 1)):
            if nkd < 0 or nke < 0:
                continue
            saved = now - cost.graph_bytes(d_part.sizes(nkd), e_part.sizes(nke))
            slower = (
                d_part.totals_ms[nkd]
                + e_part.totals_ms[nke]
                - d_part.totals_ms[kd]
                - e_part.totals_ms[ke]
            )
            options.append((slower / saved if saved > 0 else np.inf, nkd, nke))
        _, kd, ke = min(options)
    return kd, ke


def choose_shared(
    steps: Steps, cost: CostModel, default: EngineSchedule, limits: Limits
) -> tuple[list[int], list[int]]:
    """vLLM: one list of token counts that decode and mixed batches both pad into; each size up
    to the running limit is captured twice, as a full graph (decode) and a piecewise one.
    Sizes above the largest decode batch seen sit on the token grid."""
    decode, extend = steps.decode, steps.extend
    kinds = decode + extend
    top_decode = int(_observed(decode).max(initial=0))
    tokens = token_candidates(extend, default.decode_bs, limits.max_tokens)
    observed = np.unique(np.concatenate([_observed(decode), tokens[tokens > top_decode]]))
    candidates = candidate_sizes(observed, default.decode_bs, limits.max_tokens)
    budget = None if limits.budget_graphs is None else limits.budget_graphs // 2
    part = best_shared_partitions(kinds, candidates, _searched(budget, default.decode_bs))
    target = _total(kinds, default.decode_bs, default.pads)
    k = choose_graph_count(part, not_worse_than_ms=target, max_graphs=budget)
    while (
        limits.budget_memory_bytes is not None
        and k
        and cost.graph_bytes(*split_shared(part.sizes(k), limits.max_bs))
        > limits.budget_memory_bytes
    ):
        k -= 1
    return split_shared(part.sizes(k), limits.max_bs)


def split_shared(sizes: list[int], max_bs: int) -> tuple[list[int], list[int]]:
    """vLLM's one list as (full decode graphs, piecewise sizes): full graphs only up to the
    running limit (vLLM 0.33 cudagraph_utils), piecewise graphs for every size."""
    return [s for s in sizes if s <= max_bs], list(sizes)
