"""Trace summaries and the context-length filter."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cgtool.traces.stats import (
    PERCENTILES,
    batch_stats,
    distribution,
    drop_over_context,
    request_stats,
)
from cgtool.traces.trace import batch_trace, request_trace


@settings(max_examples=100, deadline=None, database=None)  # 100 generated samples
@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=300))
def test_unweighted_percentiles_match_numpy_inverted_cdf(values):
    array = np.array(values, dtype=np.int64)
    dist = distribution(array)
    for q in PERCENTILES:
        assert dist.p[q] == int(np.percentile(array, q, method="inverted_cdf"))
    assert dist.max == max(values) and dist.total == sum(values)
    assert dist.mean == pytest.approx(np.mean(values))


@settings(max_examples=100, deadline=None, database=None)  # 100 generated samples
@given(st.lists(st.tuples(st.integers(1, 4096), st.integers(1, 50)), min_size=1, max_size=60))
def test_weighted_percentiles_equal_percentiles_of_the_repeated_values(pairs):
    values = np.array([v for v, _ in pairs], dtype=np.int64)
    weights = np.array([w for _, w in pairs], dtype=np.int64)
    weighted = distribution(values, weights)
    repeated = distribution(np.repeat(values, weights))
    assert weighted.p == repeated.p
    assert weighted.total == repeated.total and weighted.max == repeated.max


def test_request_stats_hand_checked():
    trace = request_trace(
        "t", [0.0, 1.0, 4.0, 10.0], [100, 200, 300, 400], [10, 0, 5, 1], [0, 50, 0, 150]
    )
    stats = request_stats(trace)
    assert stats.num_requests == 4
    assert stats.duration_s == 10.0
    assert stats.rate_per_s == pytest.approx(0.3)  # 3 gaps in 10 s
    assert stats.input_len.p[50] == 200 and stats.input_len.max == 400
    assert stats.cached_share == pytest.approx(200 / 1000)
    assert stats.output_len.total == 16


def test_batch_stats_weight_sizes_by_steps():
    trace = batch_trace(
        "b", [("decode", 8, 40), ("decode", 64, 10), ("extend", 512, 3), ("extend", 4096, 1)]
    )
    stats = batch_stats(trace)
    assert (stats.num_steps, stats.decode_steps, stats.extend_steps) == (54, 50, 4)
    assert stats.decode_batch_size.p[50] == 8 and stats.decode_batch_size.p[90] == 64
    assert stats.decode_batch_size.mean == pytest.approx((8 * 40 + 64 * 10) / 50)
    assert stats.extend_num_tokens.p[50] == 512 and stats.extend_num_tokens.p[99] == 4096


def test_context_filter_follows_sglang_rules_at_the_boundaries():
    # context 100: prompt must be < 100, and prompt + output <= 100
    inputs = [99, 100, 60, 60, 1]
    outputs = [0, 0, 40, 41, 99]
    trace = request_trace("t", [0, 1, 2, 3, 4], inputs, outputs, [0] * 5)
    result = drop_over_context(trace, 100)
    assert result.dropped == 2
    assert result.kept.input_len.tolist() == [99, 60, 1]
    assert result.kept.output_len.tolist() == [0, 40, 99]
    assert result.kept.arrival_s.tolist() == [0.0, 2.0, 4.0]


def test_stats_of_an_empty_trace_are_zero():
    trace = request_trace("t", [], [], [], [])
    stats = request_stats(trace)
    assert stats.num_requests == 0 and stats.duration_s == 0 and stats.input_len.max == 0
