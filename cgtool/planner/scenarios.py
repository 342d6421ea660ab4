"""The traffic a plan is fitted on and checked against: loads, replicas, the held-out split.

A load scenario replays the trace at a multiple of its arrival rate (arrival times divided by
the load), or, for a closed-loop client (`--concurrency N`), with N times the load requests in
flight. `replicas` data-parallel servers each take every N-th request in arrival order, so
each sees the trace's bursts at 1/N of its rate; one of them is simulated. The held-out check
fits on the first HELD_OUT_SPLIT of the requests by arrival time and scores on the rest:
the simulation runs once over the whole trace, and the steps taken before the first held-out
arrival are the fit part (no held-out request can be in them).

Only the gaps between arrivals matter (the simulator's clock starts at the first). A trace
whose requests mostly arrive at once is an offline batch: its queue drains by design, so it
is never called overloaded and never split across replicas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from cgtool.errors import InputError
from cgtool.planner.sim_result import SimulationResult

HELD_OUT_SPLIT = 0.7
# A server whose queue keeps growing: a p99 wait above a minute, or a simulated run that ends
# well after the last arrival (1.5x the trace's span, and over a minute late).
OVERLOAD_P99_QUEUE_S = 60.0
OVERLOAD_SPAN_RATIO = 1.5
DEFAULT_LOADS = (1.0, 2.0)
# Arrivals spread over less than this are one burst: shorter than any step a server takes.
OFFLINE_SPAN_S = 1e-3


def parse_loads(text: str) -> tuple[float, ...]:
    """'1,2' -> (1.0, 2.0): positive, finite, each once, in the order given."""
    loads: list[float] = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise InputError(
                f"--load '{text}': '{part.strip()}' is not a positive multiple of the arrival rate",
                "Write it like --load 1,2 (each above 0).",
            )
        if value not in loads:
            loads.append(value)
    return tuple(loads)


def replica_share(arrays: tuple[np.ndarray, ...], replicas: int) -> tuple[np.ndarray, ...]:
    """One replica's requests (every `replicas`-th by arrival time), arrays in arrival order."""
    arrival = np.asarray(arrays[0], dtype=np.float64)
    if replicas == 1 and np.all(arrival[1:] >= arrival[:-1]):
        return tuple(None if a is None else np.asarray(a) for a in arrays)  # all of it, in order
    order = np.argsort(arrival, kind="stable")
    pick = order[::replicas]
    return tuple(None if a is None else np.asarray(a)[pick] for a in arrays)


def split_index(n: int) -> int:
    """Position of the first held-out request among `n` in arrival order."""
    return min(math.ceil(HELD_OUT_SPLIT * n), n - 1)


def split_time(arrival_s: np.ndarray) -> float:
    """Arrival time of the first held-out request (arrays in arrival order)."""
    n = len(arrival_s)
    return float(arrival_s[split_index(n)]) if n > 1 else math.inf


def is_offline(arrival_s: np.ndarray) -> bool:
    """Most requests arrive at the first instant, or all within OFFLINE_SPAN_S (in order)."""
    if len(arrival_s) == 0:
        return True
    first = float(arrival_s[0])
    return float(arrival_s[-1]) - first < OFFLINE_SPAN_S or float(
        arrival_s[(len(arrival_s) - 1) // 2]
    ) == first


@dataclass(frozen=True, eq=False)
class Traffic:
    """The requests a plan simulates: timed arrivals, or a closed-loop client that keeps
    `concurrency` requests in flight (arrival_s then None)."""

    arrival_s: np.ndarray | None
    input_len: np.ndarray
    output_len: np.ndarray
    cached_len: np.ndarray | None
    concurrency: int | None = None

    def __len__(self) -> int:
        return len(self.input_len)

    def kept(self, keep: np.ndarray) -> Traffic:
        """The requests where `keep` (a mask over them) is true, in the order given."""
        def pick(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else np.asarray(a)[keep]
        return replace(self, arrival_s=pick(self.arrival_s), input_len=pick(self.input_len),
                       output_len=pick(self.output_len), cached_len=pick(self.cached_len))

    def first_requests(self, count: int) -> Traffic:
        """The first `count` requests by arrival (a closed-loop client's in the order given):
        each of N replicas' shares then holds its first count / N."""
        if count >= len(self):
            return self
        keep = np.zeros(len(self), dtype=bool)
        if self.arrival_s is None:
            keep[:count] = True
        else:
            keep[np.argsort(np.asarray(self.arrival_s), kind="stable")[:count]] = True
        return self.kept(keep)

    def load_jobs(self, loads: tuple[float, ...], replicas: int) -> list[LoadJob]:
        """One simulation's arguments (requests, split) per load, for one replica's share."""
        if self.arrival_s is None:
            # A client per replica: every N-th request, and its share of those in flight.
            assert self.concurrency is not None
            share = slice(None, None, replicas)
            columns = {"arrival_s": np.zeros(len(self.input_len[share])),
                       "input_len": self.input_len[share], "output_len": self.output_len[share],
                       "cached_len": None if self.cached_len is None else self.cached_len[share]}
            n = len(columns["input_len"])
            return [
                LoadJob(load, columns | {
                    "concurrency": max(1, round(self.concurrency * load / replicas)),
                    "split_request": split_index(n)}, 0.0, False)
                for load in loads
            ]
        arrival, input_len, output_len, cached_len = replica_share(
            (self.arrival_s, self.input_len, self.output_len, self.cached_len), replicas
        )
        jobs = []
        for load in loads:
            at_load = np.asarray(arrival, dtype=np.float64) / load
            columns = {"arrival_s": at_load, "input_len": input_len, "output_len": output_len,
                       "cached_len": cached_len, "split_s": split_time(at_load)}
            jobs.append(LoadJob(load, columns, float(at_load[-1] - at_load[0]), is_offline(at_load)))
        return jobs


@dataclass(frozen=True, eq=False)
class LoadJob:
    load: float
    columns: dict  # simulate()'s request arguments and split
    span_s: float  # first to last arrival at this load (0 for a closed-loop client)
    offline: bool  # arrivals mostly at once: a batch job, never overloaded


@dataclass(frozen=True, slots=True)
class LoadRun:
    """One load scenario's simulation and what it says about the server."""

    load: float
    result: SimulationResult
    span_s: float  # first to last arrival, at this load
    # A batch job (arrivals mostly at once: the held-out split by time means nothing either)
    # or a closed-loop client: a queue that drains by design, never an overload.
    offline: bool = False
    closed_client: bool = False

    @property
    def overloaded(self) -> bool:
        # A short burst that drains within a minute of its end is not a growing queue.
        if self.offline or self.closed_client:
            return False
        r = self.result
        late = r.duration_s > OVERLOAD_SPAN_RATIO * self.span_s
        return r.p99_queue_s > OVERLOAD_P99_QUEUE_S or (
            late and r.duration_s - self.span_s > OVERLOAD_P99_QUEUE_S
        )

    @property
    def offered_rate(self) -> float:
        admitted = self.result.num_requests - self.result.dropped_requests
        return admitted / self.span_s if self.span_s > 0 else 0.0

    @property
    def sustained_rate(self) -> float:
        """Requests a second one server completes flat out (meaningful when overloaded)."""
        admitted = self.result.num_requests - self.result.dropped_requests
        return admitted / self.result.duration_s if self.result.duration_s > 0 else 0.0

    def summary(self) -> dict:
        r = self.result
        return {
            "load": self.load,
            "duration_s": r.duration_s,
            "steps": r.steps,
            "mean_queue_s": r.mean_queue_s,
            "p99_queue_s": r.p99_queue_s,
            "peak_kv_demand_tokens": r.peak_kv_demand_tokens,
            "largest_decode_batch": int(np.nonzero(r.decode_counts)[0].max(initial=0)),
            "overloaded": self.overloaded,
        }


def replicas_needed(runs: list[LoadRun], replicas: int) -> int | None:
    """Replicas for the busiest scenario not to overload, or None when none overloads."""
    over = [run for run in runs if run.overloaded]
    if not over:
        return None
    sustained = min(run.sustained_rate for run in over)
    busiest = max(run.offered_rate for run in runs)
    return max(replicas + 1, math.ceil(replicas * busiest / max(sustained, 1e-9)))


def overload_warning(runs: list[LoadRun], replicas: int, needed: int) -> str:
    worst = max(runs, key=lambda run: run.result.p99_queue_s)
    per = f" per replica of {replicas}" if replicas > 1 else ""
    rates = ", ".join(f"{run.offered_rate:.2f}/s at {run.load:g}x" for run in runs)
    return (
        f"overloaded: the simulated queue keeps growing (p99 wait {worst.result.p99_queue_s:,.0f} s "
        f"at {worst.load:g}x load); one server sustains about {worst.sustained_rate:.2f} requests/s, "
        f"the trace offers {rates}{per}; it needs about {needed} replicas, and this plan is for "
        f"one of {needed} (--replicas {needed})"
    )
