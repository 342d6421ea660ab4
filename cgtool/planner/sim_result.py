"""What a simulation yields: steps at each size, their time and attention, queueing, and the
same tallies up to a held-out split."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from cgtool.planner.scoring import Histogram


@dataclass(frozen=True, eq=False)
class SimulationResult:
    decode_counts: np.ndarray  # [max_running + 1] steps at each batch size
    decode_time_s: np.ndarray  # [max_running + 1] time spent at each batch size
    decode_context_tokens: np.ndarray  # [max_running + 1] context tokens read, summed over steps
    extend_counts: np.ndarray  # [chunked_prefill_size + 1] steps at each token count
    extend_time_s: np.ndarray
    extend_attention_ms: np.ndarray  # attention time summed over steps, any schedule
    num_requests: int
    dropped_requests: int  # longer than the context or than the whole KV pool
    duration_s: float
    steps: int
    mean_queue_s: float
    p99_queue_s: float
    peak_kv_demand_tokens: int  # most KV reserved at once by admitted requests
    completed_fraction: float = 1.0  # below 1 when `stop` ended the run: share of requests admitted
    typical_request_tokens: int = 0  # median prompt + output of the requests kept (not dropped)
    # Steps taken before the simulated clock reached `split_s` (the fit part of a held-out
    # check); the rest are the totals above minus these. None without a split.
    before_split: StepTally | None = None
    last_arrival_s: float = 0.0  # of the requests kept: the trace's span, for overload checks

    def tally(self) -> StepTally:
        return StepTally(
            self.decode_counts,
            self.decode_time_s,
            self.decode_context_tokens,
            self.extend_counts,
            self.extend_time_s,
            self.extend_attention_ms,
        )

    def split_tallies(self) -> tuple[StepTally, StepTally]:
        """(steps before the split, steps after); all steps before when there was no split."""
        whole = self.tally()
        if self.before_split is None:
            return whole, whole.minus(whole)
        return self.before_split, whole.minus(self.before_split)


@dataclass(frozen=True, eq=False)
class StepTally:
    """Steps at each size (index = size) and the time and attention spent there."""

    decode_counts: np.ndarray
    decode_time_s: np.ndarray
    decode_context_tokens: np.ndarray
    extend_counts: np.ndarray
    extend_time_s: np.ndarray
    extend_attention_ms: np.ndarray

    def minus(self, other: StepTally) -> StepTally:
        return StepTally(
            *(np.asarray(a) - np.asarray(b) for a, b in zip(_fields(self), _fields(other)))
        )

    @property
    def steps(self) -> int:
        return int(self.decode_counts.sum() + self.extend_counts.sum())

    def histograms(self, kv_ms_per_token: float) -> tuple[Histogram, Histogram]:
        """(decode, extend) steps at the sizes that ran, decode attention priced per context
        token read."""
        d = np.nonzero(self.decode_counts)[0]
        e = np.nonzero(self.extend_counts)[0]
        return (
            Histogram(
                d,
                self.decode_counts[d],
                self.decode_time_s[d],
                self.decode_context_tokens[d] * kv_ms_per_token,
            ),
            Histogram(e, self.extend_counts[e], self.extend_time_s[e], self.extend_attention_ms[e]),
        )


def _fields(t: StepTally) -> tuple[np.ndarray, ...]:
    return (
        t.decode_counts,
        t.decode_time_s,
        t.decode_context_tokens,
        t.extend_counts,
        t.extend_time_s,
        t.extend_attention_ms,
    )


@dataclass(slots=True)
class RunTallies:
    """The simulator's running totals per size, kept as lists for the loop's speed."""

    decode_counts: list[int]
    decode_elapsed_ms: list[float]
    decode_context: list[int]
    extend_counts: list[int]
    extend_elapsed_ms: list[float]
    extend_attention_ms: list[float]
    # Admission runs: requests before admitted_upto[i] were admitted at admitted_at_ms[i] (the
    # earlier runs' requests excepted). One entry per extend step: typed arrays, which take
    # no Python object per entry and turn into numpy arrays without a copy.
    admitted_upto: array = field(default_factory=lambda: array("q"))
    admitted_at_ms: array = field(default_factory=lambda: array("d"))
    clock_ms: float = 0.0
    steps: int = 0
    peak_kv: int = 0
    head: int = 0  # requests admitted when the loop ended (all of them unless stopped)
    before_split: tuple[list, ...] | None = None  # copies of the six tallies at the split


def build_result(
    tallies: RunTallies,
    arrival: np.ndarray,
    footprint: Sequence[int],
    dropped: int,
    split_s: float | None,
) -> SimulationResult:
    """The result of a run over the requests kept (`arrival` and `footprint` of each, in
    arrival order), `dropped` of them left out before it."""
    n = len(footprint)
    queue_s = _queue_delays_s(tallies, arrival)
    return SimulationResult(
        decode_counts=np.array(tallies.decode_counts, dtype=np.int64),
        decode_time_s=np.array(tallies.decode_elapsed_ms) / 1e3,
        decode_context_tokens=np.array(tallies.decode_context, dtype=np.float64),
        extend_counts=np.array(tallies.extend_counts, dtype=np.int64),
        extend_time_s=np.array(tallies.extend_elapsed_ms) / 1e3,
        extend_attention_ms=np.array(tallies.extend_attention_ms),
        num_requests=n + dropped,
        dropped_requests=dropped,
        duration_s=tallies.clock_ms / 1e3,
        steps=tallies.steps,
        mean_queue_s=float(queue_s.mean()) if n else 0.0,
        p99_queue_s=float(np.percentile(queue_s, 99)) if n else 0.0,
        peak_kv_demand_tokens=tallies.peak_kv,
        completed_fraction=tallies.head / n if n and tallies.head < n else 1.0,
        typical_request_tokens=int(np.median(footprint)) if n else 0,
        before_split=_before_split(tallies, split_s),
        last_arrival_s=float(arrival[-1]) if n else 0.0,
    )


def _queue_delays_s(tallies: RunTallies, arrival_s: np.ndarray) -> np.ndarray:
    if not tallies.admitted_upto:
        return np.zeros(len(arrival_s))
    ends = np.frombuffer(tallies.admitted_upto, dtype=np.int64)
    clocks_ms = np.frombuffer(tallies.admitted_at_ms, dtype=np.float64)
    admitted = min(int(ends[-1]), len(arrival_s))  # fewer than all when the run was stopped
    # Admission run i took requests [ends[i-1], ends[i]) at clocks_ms[i].
    at_ms = np.repeat(clocks_ms, np.diff(ends, prepend=0))[:admitted]
    return at_ms / 1e3 - arrival_s[:admitted]


def _before_split(tallies: RunTallies, split_s: float | None) -> StepTally | None:
    if split_s is None:
        return None
    if tallies.before_split is None:  # the run ended before the clock reached the split
        lists = (
            tallies.decode_counts, tallies.decode_elapsed_ms, tallies.decode_context,
            tallies.extend_counts, tallies.extend_elapsed_ms, tallies.extend_attention_ms,
        )
    else:
        lists = tallies.before_split
    counts_d, elapsed_d, context_d, counts_e, elapsed_e, attention_e = lists
    return StepTally(
        np.array(counts_d, dtype=np.int64),
        np.array(elapsed_d) / 1e3,
        np.array(context_d, dtype=np.float64),
        np.array(counts_e, dtype=np.int64),
        np.array(elapsed_e) / 1e3,
        np.array(attention_e),
    )
