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

# Sizes stop being added once one more would cut the expected step by less than this share:
# below run-to-run noise of a serving benchmark, and each graph costs capture time and memory.
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


def best_partitions(
    sizes: np.ndarray,
    counts: np.ndarray,
    graph_ms: np.ndarray,
    eager_ms: np.ndarray,
    candidates: np.ndarray,
    max_graphs: int,
) -> Partition:
    """Exact best schedules over `candidates` for 0..max_graphs graphs.

    sizes/counts: observed step sizes and how often each occurred; graph_ms/eager_ms: dense
    ms by size (index = size).
    """
    order = np.argsort(sizes)
    sizes, counts = sizes[order], counts[order].astype(np.float64)
    m = len(candidates)
    eager_total = float((counts * eager_ms[sizes]).sum())
    if m == 0 or max_graphs == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Partition(candidates, np.array([eager_total]), np.zeros(1, dtype=np.int64), [empty], np.zeros(1, dtype=np.int64))
    covered = np.searchsorted(sizes, candidates, side="right")  # steps of size <= c_j
    steps_upto = np.concatenate([[0.0], np.cumsum(counts)])[covered]  # P[j]
    eager_upto = np.concatenate([[0.0], np.cumsum(counts * eager_ms[sizes])])[covered]
    tail = eager_total - eager_upto  # eager cost of the steps above c_j
    g = graph_ms[candidates].astype(np.float64)
    f = steps_upto * g  # one graph, the largest at c_j
    exact = [eager_total, float((f + tail).min())]
    ends, back = [0, int((f + tail).argmin())], [np.zeros(m, dtype=np.int64), np.zeros(m, dtype=np.int64)]
    earlier = np.tri(m, m, -1, dtype=bool).T  # earlier[i, j]: i < j
    for _ in range(2, min(max_graphs, m) + 1):
        paths = np.where(earlier, f[:, None] - steps_upto[:, None] * g[None, :], np.inf)
        previous = paths.argmin(axis=0)
        f = paths[previous, np.arange(m)] + steps_upto * g
        back.append(previous)
        exact.append(float((f + tail).min()))
        ends.append(int((f + tail).argmin()))
    exact_arr = np.array(exact)
    # More graphs than candidates cannot help: the best with k > m is the best with m.
    uses = np.array([int(exact_arr[: k + 1].argmin()) for k in range(max_graphs + 1)])
    return Partition(candidates, exact_arr[uses], uses, back, np.array(ends))


def choose_graph_count(
    partition: Partition, num_steps: float, *, not_worse_than_ms: float | None = None, max_graphs: int | None = None
) -> int:
    """Fewest graphs whose next addition gains under MIN_GAIN_FRACTION of the step, but never a
    schedule worse than `not_worse_than_ms` (summed) when one within reach is not."""
    limit = partition.max_graphs if max_graphs is None else min(max_graphs, partition.max_graphs)
    totals = partition.totals_ms
    k = 0
    while k < limit:
        gain_per_step = (totals[k] - totals[k + 1]) / max(num_steps, 1.0)
        behind = not_worse_than_ms is not None and totals[k] > not_worse_than_ms * (1 + 1e-12)
        if not behind and gain_per_step < MIN_GAIN_FRACTION * totals[k] / max(num_steps, 1.0):
            break
        k += 1
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
