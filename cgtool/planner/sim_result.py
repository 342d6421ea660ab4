"""What a simulation yields: steps at each size, their time and attention, queueing, the same
tallies up to a held-out split, each request's first token and finish, and (when asked) every
step."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from cgtool.planner.scoring import Histogram
from cgtool.planner.step_time import StepCost, decode_step_ms, extend_step_ms

if TYPE_CHECKING:
    from cgtool.planner.sim_requests import Prepared


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
    last_arrival_s: float = 0.0  # of the requests kept, from the first: the trace's span
    requests: RequestTimes | None = None  # each kept request's times
    origin_s: float = 0.0  # the first arrival in the clock of the arrays given; times count from it
    steps_log: StepLog | None = None  # every step, when simulate(log_steps=True)
    alone: SimulationResult | None = None  # the first requests by themselves (alone_first)

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
    admitted_end_ms: array = field(default_factory=lambda: array("d"))  # the step's end
    finish_ms: list[float] = field(default_factory=list)  # [n] when each decoding request ends
    split_first: list[tuple[int, float]] = field(default_factory=list)  # split prompts' 1st token
    clock_ms: float = 0.0
    steps: int = 0
    peak_kv: int = 0
    head: int = 0  # requests admitted when the loop ended (all of them unless stopped)
    split: int = -1  # the prompt still split when the loop ended (only when stopped)
    before_split: tuple[list, ...] | None = None  # copies of the six tallies at the split


def build_result(
    tallies: RunTallies, kept: Prepared, split: bool, log: StepLog | None = None
) -> SimulationResult:
    """The result of a run over the requests `kept` (in arrival order)."""
    footprint = kept.footprint
    n = len(footprint)
    times = request_times(tallies, kept)
    admitted = times.admitted()
    queue_s = times.queue_s[admitted]
    return SimulationResult(
        decode_counts=np.array(tallies.decode_counts, dtype=np.int64),
        decode_time_s=np.array(tallies.decode_elapsed_ms) / 1e3,
        decode_context_tokens=np.array(tallies.decode_context, dtype=np.float64),
        extend_counts=np.array(tallies.extend_counts, dtype=np.int64),
        extend_time_s=np.array(tallies.extend_elapsed_ms) / 1e3,
        extend_attention_ms=np.array(tallies.extend_attention_ms),
        num_requests=n + kept.dropped,
        dropped_requests=kept.dropped,
        duration_s=tallies.clock_ms / 1e3,
        steps=tallies.steps,
        mean_queue_s=float(queue_s.mean()) if len(queue_s) else 0.0,
        p99_queue_s=float(np.percentile(queue_s, 99)) if len(queue_s) else 0.0,
        peak_kv_demand_tokens=tallies.peak_kv,
        completed_fraction=tallies.head / n if n and tallies.head < n else 1.0,
        typical_request_tokens=int(np.median(footprint)) if n else 0,
        before_split=_before_split(tallies, split),
        last_arrival_s=float(times.arrival_s.max(initial=0.0)),
        requests=times,
        origin_s=kept.origin_s,
        steps_log=log,
    )


@dataclass(frozen=True, eq=False)
class RequestTimes:
    """Each kept request's life in the simulation, in arrival order, seconds from the first
    arrival; NaN where a stopped run never got there."""

    index: np.ndarray  # [n] position in the arrays given to simulate()
    arrival_s: np.ndarray  # [n] (with a concurrency: when the client sent it)
    admitted_s: np.ndarray  # [n] start of the extend step that admitted it
    first_token_s: np.ndarray  # [n] end of the extend step that computed its last prompt token
    finish_s: np.ndarray  # [n] end of the step that produced its last token
    output_tokens: np.ndarray  # [n]

    @property
    def queue_s(self) -> np.ndarray:
        return self.admitted_s - self.arrival_s

    @property
    def ttft_s(self) -> np.ndarray:
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> np.ndarray:
        """Time per output token after the first; NaN for requests of one token."""
        steps = self.output_tokens - 1
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(steps > 0, (self.finish_s - self.first_token_s) / steps, np.nan)

    def admitted(self) -> np.ndarray:
        return ~np.isnan(self.admitted_s)

    def finished(self) -> np.ndarray:
        return ~np.isnan(self.finish_s)


def request_times(tallies: RunTallies, kept: Prepared) -> RequestTimes:
    n = len(kept.footprint)
    arrival_s = np.array(kept.requests.arrival_ms[:n]) / 1e3
    admitted_s, first_s = np.full(n, np.nan), np.full(n, np.nan)
    if tallies.admitted_upto:
        ends = np.frombuffer(tallies.admitted_upto, dtype=np.int64)
        counts = np.diff(ends, prepend=0)
        upto = min(int(ends[-1]), n)
        # Admission run i took requests [ends[i-1], ends[i]) at admitted_at_ms[i].
        admitted_s[:upto] = np.repeat(np.frombuffer(tallies.admitted_at_ms), counts)[:upto] / 1e3
        end = np.frombuffer(tallies.admitted_end_ms)
        first_s[:upto] = np.repeat(end, counts)[:upto] / 1e3
    # A split prompt's first token comes at the step that computes its last chunk, not at the
    # step that admitted it; one still split when a run was stopped has none yet.
    for index, ms in tallies.split_first:
        first_s[index] = ms / 1e3
    if tallies.split >= 0:
        first_s[tallies.split] = np.nan
    finish_ms = np.array(tallies.finish_ms, dtype=np.float64)
    output = kept.output_tokens
    finish_s = np.where(output > 1, finish_ms / 1e3, first_s)
    return RequestTimes(kept.index, arrival_s, admitted_s, first_s, finish_s, output)


def _before_split(tallies: RunTallies, split: bool) -> StepTally | None:
    if not split:
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


class StepLog:
    """Every step of a run, as the loop took them: an extend step is one entry, a run of
    decode steps of one batch is one entry of `count` steps (`expand` splits them)."""

    DECODE, EXTEND = 0, 1

    def __init__(self) -> None:
        self.kind = array("b")  # DECODE or EXTEND
        self.size = array("q")  # batch size, or new tokens
        self.count = array("q")  # steps in the entry
        self.start_ms = array("d")  # from the first arrival
        self.elapsed_ms = array("d")  # of all the entry's steps
        self.work = array("d")  # decode: context tokens read by the first step; extend: pairs

    def add(self, kind: int, size: int, count: int, start_ms: float, elapsed_ms: float,
            work: float) -> None:
        self.kind.append(kind)
        self.size.append(size)
        self.count.append(count)
        self.start_ms.append(start_ms)
        self.elapsed_ms.append(elapsed_ms)
        self.work.append(work)

    def __len__(self) -> int:
        return len(self.kind)

    def expand(self, cost: StepCost) -> dict[str, np.ndarray]:
        """One row per step: kind, size, start_ms, elapsed_ms and work (context tokens read, or
        query-key pairs), each decode step of a run timed by `cost` (the run's StepCost)."""
        count = np.frombuffer(self.count, dtype=np.int64)
        starts = np.cumsum(count) - count  # each entry's first row
        entry = np.repeat(np.arange(len(count)), count)
        within = np.arange(len(entry)) - starts[entry]
        kind = np.frombuffer(self.kind, dtype=np.int8)[entry]
        size = np.frombuffer(self.size, dtype=np.int64)[entry]
        decode = kind == self.DECODE
        # Step j of a decode run reads j * batch more context tokens than its first.
        work = np.frombuffer(self.work)[entry] + np.where(decode, within * size, 0)
        elapsed = np.where(
            decode,
            decode_step_ms(np.asarray(cost.decode_ms)[np.where(decode, size, 0)],
                           cost.kv_read_ms_per_token, work),
            extend_step_ms(np.asarray(cost.extend_ms)[np.where(decode, 0, size)],
                           cost.attention_ms_per_pair, work),
        )
        before = np.concatenate([[0.0], np.cumsum(elapsed)])  # time of all earlier rows
        start = np.frombuffer(self.start_ms)[entry] + before[:-1] - before[starts][entry]
        return {"kind": kind, "size": size, "start_ms": start, "elapsed_ms": elapsed, "work": work}
