"""The traffic a plan is fitted on and checked against: loads, replicas, the held-out split.

A load scenario replays the trace at a multiple of its arrival rate (arrival times divided by
the load). `replicas` data-parallel servers each take every N-th request in arrival order, so
each sees the trace's bursts at 1/N of its rate; one of them is simulated. The held-out check
fits on the first HELD_OUT_SPLIT of the requests by arrival time and scores on the rest:
the simulation runs once over the whole trace, and the steps taken before the first held-out
arrival are the fit part (no held-out request can be in them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cgtool.errors import InputError
from cgtool.planner.sim_result import SimulationResult

HELD_OUT_SPLIT = 0.7
# A server whose queue keeps growing: a p99 wait above a minute, or a simulated run that ends
# well after the last arrival (1.5x the trace's span, and over a minute late).
OVERLOAD_P99_QUEUE_S = 60.0
OVERLOAD_SPAN_RATIO = 1.5
DEFAULT_LOADS = (1.0, 2.0)


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


def split_time(arrival_s: np.ndarray) -> float:
    """Arrival time of the first held-out request (arrays in arrival order)."""
    n = len(arrival_s)
    index = min(math.ceil(HELD_OUT_SPLIT * n), n - 1)
    return float(arrival_s[index]) if n > 1 else math.inf


@dataclass(frozen=True, slots=True)
class LoadRun:
    """One load scenario's simulation and what it says about the server."""

    load: float
    result: SimulationResult
    span_s: float  # first to last arrival, at this load

    @property
    def overloaded(self) -> bool:
        # A short burst that drains within a minute of its end is not a growing queue.
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
