import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cgtool.planner.optimiser import (
    MAX_CANDIDATES,
    MIN_GAIN_FRACTION,
    CostedSteps,
    best_partitions,
    best_shared_partitions,
    candidate_sizes,
    choose_graph_count,
)
from cgtool.planner.scoring import dense_ms, padded_sizes


def tables(max_size, seed=0, monotone=True):
    rng = np.random.default_rng(seed)
    graph = (
        5.0 + np.cumsum(rng.uniform(0.0, 0.2, max_size + 1))
        if monotone
        else rng.uniform(5, 9, max_size + 1)
    )
    eager = graph + rng.uniform(0.5, 2.0, max_size + 1)
    return graph, eager


def brute_force(sizes, counts, graph, eager, candidates, k):
    best = dense_ms(sizes, counts, graph, eager, [])
    for r in range(1, k + 1):
        for chosen in itertools.combinations(candidates.tolist(), r):
            best = min(best, dense_ms(sizes, counts, graph, eager, chosen))
    return best


def test_padding_goes_to_the_next_captured_size_and_above_the_largest_runs_eagerly():
    assert padded_sizes(np.array([1, 3, 8, 9]), [4, 8]).tolist() == [4, 4, 8, 0]
    assert padded_sizes(np.array([3, 4]), [4, 8], pads=False).tolist() == [0, 4]


def test_one_graph_sits_at_the_largest_size_when_padding_is_cheap():
    graph = np.full(11, 5.0)
    eager = np.full(11, 7.0)
    part = best_partitions(
        np.array([1, 4, 10]), np.array([5, 5, 5]), graph, eager, np.array([1, 4, 10]), 3
    )
    assert part.sizes(1) == [10]
    assert part.totals_ms[1] == pytest.approx(15 * 5.0)


def test_rare_large_sizes_are_left_eager_when_padding_to_them_costs_more():
    graph = np.arange(101, dtype=float)  # 1 ms a row: padding 1 -> 100 costs 99 ms
    eager = graph + 1.0
    sizes, counts = np.array([1, 100]), np.array([1000, 1])
    part = best_partitions(sizes, counts, graph, eager, sizes, 1)
    assert part.sizes(1) == [1]


@pytest.mark.parametrize("seed", range(12))
def test_dp_equals_brute_force_on_small_inputs(seed):
    rng = np.random.default_rng(seed)
    graph, eager = tables(40, seed, monotone=seed % 2 == 0)
    sizes = np.unique(rng.integers(1, 41, 7))
    counts = rng.integers(1, 50, len(sizes))
    candidates = candidate_sizes(sizes, [8, 16, 32], 40)
    part = best_partitions(sizes, counts, graph, eager, candidates, 4)
    for k in range(5):
        assert part.totals_ms[k] == pytest.approx(
            brute_force(sizes, counts, graph, eager, candidates, k)
        )
        assert dense_ms(sizes, counts, graph, eager, part.sizes(k)) == pytest.approx(
            part.totals_ms[k]
        )
        assert len(part.sizes(k)) <= k


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 64), st.integers(1, 100)), min_size=1, max_size=12),
    st.lists(st.integers(1, 64), min_size=1, max_size=6),
    st.integers(0, 3),
)
def test_never_worse_than_any_schedule_with_as_many_sizes(steps, other, seed):
    # Holds for step times that do not fall with size, which the cost model guarantees.
    graph, eager = tables(64, seed)
    sizes, counts = (np.array(c) for c in zip(*steps))
    candidates = candidate_sizes(np.unique(sizes), [], 64)
    part = best_partitions(sizes, counts, graph, eager, candidates, len(set(other)))
    assert (
        part.totals_ms[len(set(other))]
        <= dense_ms(sizes, counts, graph, eager, sorted(set(other))) + 1e-9
    )


def test_candidates_include_defaults_within_the_observed_range_only():
    assert candidate_sizes(np.array([3, 7, 20]), [4, 8, 64], 100).tolist() == [3, 4, 7, 8, 20]
    assert candidate_sizes(np.array([3, 7, 200]), [], 100).tolist() == [3, 7]


def test_many_distinct_sizes_are_rounded_up_to_a_grid():
    observed = np.arange(1, 5000)
    sizes = candidate_sizes(observed, [], 8192)
    assert len(sizes) <= MAX_CANDIDATES and sizes.max() >= 4999 and np.all(sizes % 16 == 0)


def test_graph_count_stops_within_a_small_share_of_the_best_searched():
    rng = np.random.default_rng(3)
    graph, eager = tables(256, 3)
    sizes = np.arange(1, 257)
    counts = rng.integers(1, 100, 256)
    part = best_partitions(sizes, counts, graph, eager, candidate_sizes(sizes, [], 256), 64)
    k = choose_graph_count(part)
    assert 1 <= k < 64
    assert part.totals_ms[k] <= part.totals_ms[64] * (1 + MIN_GAIN_FRACTION)
    assert part.totals_ms[k - 1] > part.totals_ms[64] * (1 + MIN_GAIN_FRACTION)


def test_graph_count_keeps_going_until_it_matches_a_reference_schedule():
    graph, eager = tables(256, 4)
    sizes = np.arange(1, 257)
    counts = np.full(256, 10)
    default = list(range(8, 257, 8))
    target = dense_ms(sizes, counts, graph, eager, default)
    part = best_partitions(
        sizes, counts, graph, eager, candidate_sizes(sizes, default, 256), len(default)
    )
    k = choose_graph_count(part, not_worse_than_ms=target)
    assert part.totals_ms[k] <= target and k <= len(default)


def test_budget_caps_the_graph_count():
    graph, eager = tables(64, 5)
    sizes = np.arange(1, 65)
    part = best_partitions(sizes, np.full(64, 5), graph, eager, sizes, 10)
    assert choose_graph_count(part, max_graphs=3) <= 3


@pytest.mark.parametrize("seed", range(6))
def test_one_list_for_two_kinds_equals_brute_force(seed):
    rng = np.random.default_rng(100 + seed)
    kinds = []
    for shift in (0.0, 3.0):
        graph, eager = tables(48, seed)
        sizes = np.unique(rng.integers(1, 49, 5))
        kinds.append(
            CostedSteps(sizes, rng.integers(1, 30, len(sizes)), graph + shift, eager + shift)
        )
    candidates = candidate_sizes(np.unique(np.concatenate([k.sizes for k in kinds])), [], 48)
    part = best_shared_partitions(kinds, candidates, 3)

    def total(chosen):
        return sum(dense_ms(k.sizes, k.counts, k.graph_ms, k.eager_ms, chosen) for k in kinds)

    for k in range(4):
        brute = min(
            total(c) for r in range(k + 1) for c in itertools.combinations(candidates.tolist(), r)
        )
        assert part.totals_ms[k] == pytest.approx(brute)
        assert total(part.sizes(k)) == pytest.approx(part.totals_ms[k])
