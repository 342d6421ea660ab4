"""What a trace holds (counts, rate, length percentiles) and what a server would reject."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cgtool.traces.trace import BatchTrace, RequestTrace

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Distribution:
    """Percentiles of a token count; `p` maps 50/90/99 to the observed value at that rank."""

    mean: float
    p: dict[int, int]
    max: int
    total: int


@dataclass(frozen=True)
class RequestStats:
    source: str
    num_requests: int
    duration_s: float
    rate_per_s: float
    input_len: Distribution
    output_len: Distribution
    cached_len: Distribution
    cached_share: float  # cached prompt tokens over all prompt tokens


@dataclass(frozen=True)
class BatchStats:
    source: str
    num_steps: int
    decode_steps: int
    extend_steps: int
    decode_batch_size: Distribution  # weighted by steps
    extend_num_tokens: Distribution  # weighted by steps


@dataclass(frozen=True)
class ContextFilter:
    """The requests a server with this context length accepts, and how many it rejects."""

    kept: RequestTrace
    dropped: int
    context_len: int


def distribution(values: np.ndarray, weights: np.ndarray | None = None) -> Distribution:
    """Weighted percentiles by the inverted CDF: each one is a value that really occurred."""
    if weights is None:
        weights = np.ones(len(values), dtype=np.int64)
    if len(values) == 0 or weights.sum() == 0:
        return Distribution(0.0, {q: 0 for q in PERCENTILES}, 0, 0)
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    cumulative = np.cumsum(weights[order])
    total_weight = int(cumulative[-1])
    p = {}
    for q in PERCENTILES:
        rank = np.searchsorted(cumulative, q / 100 * total_weight, side="left")
        p[q] = int(sorted_values[min(rank, len(sorted_values) - 1)])
    total = int(np.dot(values.astype(np.float64), weights))
    return Distribution(total / total_weight, p, int(sorted_values[-1]), total)


def request_stats(trace: RequestTrace) -> RequestStats:
    duration_s = float(trace.arrival_s[-1] - trace.arrival_s[0]) if len(trace) else 0.0
    # n arrivals span n-1 gaps; a zero-length trace has no rate to speak of.
    rate = (len(trace) - 1) / duration_s if duration_s > 0 else 0.0
    prompt_tokens = int(trace.input_len.sum())
    cached_tokens = int(trace.cached_len.sum())
    return RequestStats(
        source=trace.source,
        num_requests=len(trace),
        duration_s=duration_s,
        rate_per_s=rate,
        input_len=distribution(trace.input_len),
        output_len=distribution(trace.output_len),
        cached_len=distribution(trace.cached_len),
        cached_share=cached_tokens / prompt_tokens if prompt_tokens else 0.0,
    )


def batch_stats(trace: BatchTrace) -> BatchStats:
    decode_steps = int(trace.decode_count.sum())
    extend_steps = int(trace.extend_count.sum())
    return BatchStats(
        source=trace.source,
        num_steps=decode_steps + extend_steps,
        decode_steps=decode_steps,
        extend_steps=extend_steps,
        decode_batch_size=distribution(trace.decode_batch_size, trace.decode_count),
        extend_num_tokens=distribution(trace.extend_num_tokens, trace.extend_count),
    )


def drop_over_context(trace: RequestTrace, context_len: int) -> ContextFilter:
    """Remove the requests SGLang refuses: a prompt of context_len tokens or more, or
    prompt plus output above context_len (tokenizer_manager's _validate_one_request)."""
    rejected = (trace.input_len >= context_len) | (trace.input_len + trace.output_len > context_len)
    return ContextFilter(trace.take(~rejected), int(rejected.sum()), context_len)
