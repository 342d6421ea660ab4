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

# Sizes stop being added once all further ones together would cut the expected step by less
# than this share: below run-to-run noise of a serving benchmark, while each graph costs
# capture time and memory.
MIN_GAIN_FRACTION = 1e-3
# Above this many distinct candidate sizes, candidates are rounded up to a grid (the DP is
# quadratic in them); the optimum is then exact over that grid.
MAX_CANDIDATES = 512


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


def candidate_sizes(observed: np.ndarray, extra: list[int] | tuple[int, ...], limit: int) -> np.ndarray:
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
class KindSteps:
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
    return best_shared_partitions([KindSteps(sizes, counts, graph_ms, eager_ms)], candidates, max_graphs)


def best_shared_partitions(kinds: list[KindSteps], candidates: np.ndarray, max_graphs: int) -> Partition:
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
        return Partition(candidates, np.array([eager_total]), np.zeros(1, dtype=np.int64), [empty], np.zeros(1, dtype=np.int64))
    own = (steps_upto * graph).sum(axis=0)  # every step up to c_j padded to c_j
    f = own.copy()  # one graph, the largest at c_j
    exact, ends = [eager_total, float((f + tail).min())], [0, int((f + tail).argmin())]
    back = [np.zeros(m, dtype=np.int64), np.zeros(m, dtype=np.int64)]
    later = ~np.tri(m, m, 0, dtype=bool)  # later[i, j]: i < j
    already = steps_upto.T @ graph  # [i, j]: steps up to c_i priced at c_j, which c_i serves instead
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


def padded_sizes(sizes: np.ndarray, captured: list[int] | tuple[int, ...], pads: bool = True) -> np.ndarray:
    """The graph size each step replays, 0 where it runs eagerly."""
    if not len(captured):
        return np.zeros(len(sizes), dtype=np.int64)
    graphs = np.array(sorted(captured), dtype=np.int64)
    index = np.searchsorted(graphs, sizes, side="left")
    padded = np.where(index < len(graphs), graphs[np.minimum(index, len(graphs) - 1)], 0)
    if not pads:
        padded = np.where(padded == sizes, padded, 0)
    return padded


def dense_ms(
    sizes: np.ndarray, counts: np.ndarray, graph_ms: np.ndarray, eager_ms: np.ndarray,
    captured: list[int] | tuple[int, ...], pads: bool = True,
) -> float:
    """Summed dense ms of the observed steps under a capture list."""
    padded = padded_sizes(sizes, captured, pads)
    per_step = np.where(padded > 0, graph_ms[padded], eager_ms[sizes])
    return float((counts * per_step).sum())


@dataclass(frozen=True, eq=False)
class Histogram:
    """Steps of one kind: how often each size ran, for how long, and its attention time
    (context reads for decode, query-key work for extend), which no schedule changes."""

    sizes: np.ndarray  # [k] ascending
    counts: np.ndarray  # [k]
    time_s: np.ndarray  # [k] time spent at each size in the simulation
    attention_ms: np.ndarray  # [k] summed over those steps

    def to_dict(self) -> dict[str, list]:
        return {"sizes": self.sizes.tolist(), "counts": self.counts.tolist(), "time_s": self.time_s.tolist()}


@dataclass(frozen=True, slots=True)
class ScheduleScore:
    schedule: str  # "plan" or "default"
    expected_step_ms: float
    decode_coverage: float  # share of decode steps that replay a graph
    extend_coverage: float
    padding_waste: float  # share of rows (decode) and tokens (extend) computed only as padding
    num_graphs: int
    graph_bytes: int
    capture_s: float
    kv_tokens: int


def _kind_totals(hist: Histogram, graph_ms: np.ndarray, eager_ms: np.ndarray, captured, pads) -> tuple[float, float, float, float]:
    """(dense + attention ms, steps on a graph, padding units, computed units)."""
    padded = padded_sizes(hist.sizes, captured, pads)
    on_graph = padded > 0
    total_ms = dense_ms(hist.sizes, hist.counts, graph_ms, eager_ms, captured, pads) + float(hist.attention_ms.sum())
    computed = np.where(on_graph, padded, hist.sizes)
    padding = float((hist.counts * (computed - hist.sizes)).sum())
    return total_ms, float(hist.counts[on_graph].sum()), padding, float((hist.counts * computed).sum())


def score_schedule(
    name: str, decode: Histogram, extend: Histogram, cost, decode_bs, tokens, *, pads: bool = True, kv_tokens: int = 0
) -> ScheduleScore:
    """Expected step time, coverage and cost of a capture schedule on the given steps."""
    d_ms, d_graph, d_pad, d_rows = _kind_totals(decode, cost.decode_graph_ms, cost.decode_eager_ms, decode_bs, pads)
    e_ms, e_graph, e_pad, e_rows = _kind_totals(extend, cost.extend_graph_ms, cost.extend_eager_ms, tokens, pads)
    d_steps, e_steps = float(decode.counts.sum()), float(extend.counts.sum())
    return ScheduleScore(
        schedule=name,
        expected_step_ms=(d_ms + e_ms) / max(d_steps + e_steps, 1.0),
        decode_coverage=d_graph / d_steps if d_steps else 0.0,
        extend_coverage=e_graph / e_steps if e_steps else 0.0,
        padding_waste=(d_pad + e_pad) / max(d_rows + e_rows, 1.0),
        num_graphs=len(decode_bs) + len(tokens),
        graph_bytes=cost.graph_bytes(list(decode_bs), list(tokens)),
        capture_s=cost.capture_s(list(decode_bs), list(tokens)),
        kv_tokens=kv_tokens,
    )
