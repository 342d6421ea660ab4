"""Each schedule served with its own step times: what a user of the server would see.

The sizes are fitted on steps simulated with the engine default's step times. A schedule
changes those times, the times change the queue, and the queue changes the batch: a server
whose decode graphs stop below the batch it reaches runs those steps eagerly, more slowly, so
requests pile up, the batch grows further past the graphs and does not come back (SGLang
issue 33483: 46 such falls seen, none recovered). So every compared schedule (the plan, the
engine default, an existing plan) is simulated again under every eager-cost assumption at
every load with its own step times and its own KV pool, and the plan is reported by what a
client sees: time to first token, time per output token, throughput and queueing.

Two runs whose step times agree at every size the first one visited take the same steps (the
scheduler's every decision depends on the clock, and the clock only on those times), so the
second is not simulated again: under the low and high eager costs a schedule that never runs
eagerly is simulated once. A plan serves the same schedule more than once (the whole trace, the
fit requests, again after the tail check): a SimulationCache keeps each run for the next, and
a run of the whole trace also gives the fit requests' own run (simulate's `alone_first`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cgtool.documents.plan_document import ClosedLoopRow
from cgtool.planner.eager import EagerAssumption
from cgtool.planner.robust import Schedule
from cgtool.planner.scenarios import LoadJob
from cgtool.planner.scoring import padded_sizes, schedule_step_cost
from cgtool.planner.sim_parallel import simulate_all
from cgtool.planner.sim_result import SimulationResult
from cgtool.planner.step_time import StepCost

# A schedule is in its eager basin at a load when most of its decode steps run eagerly above
# its largest graph and its median batch or time per token is BASIN_PUSH times, or its p99
# time to first token BASIN_WAIT times, what the same traffic sees with graphs throughout.
BASIN_PUSH = 1.1
BASIN_WAIT = 1.25
# Closed-loop runs simulated side by side (cgtool.planner.sim_parallel): each holds its trace's
# lists, about 400 MB for a million requests.
SIMULATIONS_AT_ONCE = 4

# Runs of one request list at one replica count, by what decides their steps (run_key). A
# million requests take seconds to simulate; the same run is asked for again by the tail check
# and by the plan's final closed loop.
SimulationCache = dict[tuple, SimulationResult]


def run_key(schedule: Schedule, eager: str, load: float, kv_tokens: int) -> tuple:
    """What a closed-loop run's steps depend on, beside its requests and the server's limits."""
    return (load, eager, tuple(schedule.decode_bs), tuple(schedule.tokens), schedule.pads,
            kv_tokens)


def metrics(
    result: SimulationResult, schedule: Schedule, load: float, a: EagerAssumption, kv_tokens: int
) -> ClosedLoopRow:
    """What a client sees in one run, and how often the run fell off the schedule's graphs."""
    times = result.requests
    assert times is not None
    ttft = times.ttft_s[~np.isnan(times.first_token_s)]
    tpot = times.tpot_s
    tpot = tpot[~np.isnan(tpot)] * 1e3
    done = times.finished()
    end = float(np.nanmax(times.finish_s)) if done.any() else 0.0
    tokens = float(times.output_tokens[done].sum())
    counts = result.decode_counts
    sizes = np.arange(len(counts))
    eager = (padded_sizes(sizes, schedule.decode_bs, schedule.pads) == 0) & (sizes > 0)
    steps = int(counts.sum())
    ttft_p50, ttft_p99 = _percentiles(ttft)
    tpot_p50, tpot_p99 = _percentiles(tpot)
    return ClosedLoopRow(
        schedule=schedule.name,
        load=load,
        eager=a.name,
        ttft_p50_s=ttft_p50,
        ttft_p99_s=ttft_p99,
        tpot_p50_ms=tpot_p50,
        tpot_p99_ms=tpot_p99,
        output_tokens_per_s=tokens / end if end > 0 else 0.0,
        mean_queue_s=result.mean_queue_s,
        p99_queue_s=result.p99_queue_s,
        median_decode_batch=int(np.searchsorted(np.cumsum(counts), steps / 2)) if steps else 0,
        largest_decode_batch=int(np.nonzero(counts)[0].max(initial=0)),
        decode_eager_share=float(counts[eager].sum()) / steps if steps else 0.0,
        finished_share=float(done.mean()) if len(done) else 1.0,
        duration_s=result.duration_s,
        max_bs=max(schedule.decode_bs, default=0),
        num_graphs=len(schedule.decode_bs) + len(schedule.tokens),
        graph_bytes=a.cost.graph_bytes(list(schedule.decode_bs), list(schedule.tokens)),
        capture_s=a.cost.capture_s(list(schedule.decode_bs), list(schedule.tokens)),
        kv_tokens=kv_tokens,
    )


def _percentiles(values: np.ndarray) -> tuple[float, float]:
    """(p50, p99), 0 for no values; one selection pass for both (a million requests each)."""
    if not len(values):
        return 0.0, 0.0
    p50, p99 = np.percentile(values, (50, 99))
    return float(p50), float(p99)


@dataclass(frozen=True, eq=False)
class _Job:
    schedule: Schedule
    assumption: EagerAssumption
    load: LoadJob
    cost: StepCost
    kv_tokens: int


def closed_loop(
    schedules: list[tuple[Schedule, int]],
    assumptions: tuple[EagerAssumption, ...],
    loads: list[LoadJob],
    limits: dict,
    progress: Callable[[float], None] | None = None,
    stop: Callable[[], bool] | None = None,
    cache: SimulationCache | None = None,
    alone: tuple[dict[float, int], SimulationCache] | None = None,
) -> list[ClosedLoopRow]:
    """Every schedule (with its KV pool) at every load under every eager assumption, each run
    with its own step times; `limits` are simulate()'s server arguments. Runs that would take
    the same steps as one already simulated are not simulated again (see the module doc).
    `cache` holds runs of these `loads`' requests by run_key, and gains the runs made here.
    `alone` (first requests per load, their cache): each run made here also serves the first
    requests by themselves, and their cache gains it. Fewer rows when `stop` fired."""
    jobs = [
        _Job(schedule, a, load, schedule_step_cost(a.cost, schedule.decode_bs, schedule.tokens,
                                                   schedule.pads), kv)
        for load in loads for schedule, kv in schedules for a in assumptions
    ]
    cache = {} if cache is None else cache
    keys = [run_key(job.schedule, job.assumption.name, job.load.load, job.kv_tokens) for job in jobs]
    done = {i: cache[key] for i, key in enumerate(keys) if key in cache}
    while True:
        _reuse(jobs, done)
        # Each (schedule, load) runs its assumptions in turn: a later one may then be found to
        # take the same steps as an earlier one. Every group's next run goes at once.
        batch = _next_of_each(jobs, done)
        if not batch:
            break
        firsts = None if alone is None else alone[0]
        results = _simulate_batch([jobs[i] for i in batch], limits, progress, stop, firsts)
        done.update(zip(batch, results))
        if alone is not None:
            alone[1].update((keys[i], r.alone) for i, r in zip(batch, results) if r.alone)
        if len(results) < len(batch) or any(r.completed_fraction < 1.0 for r in results):
            break
    cache.update((keys[i], r) for i, r in done.items() if r.completed_fraction >= 1.0)
    return [
        metrics(done[i], job.schedule, job.load.load, job.assumption, job.kv_tokens)
        for i, job in enumerate(jobs) if i in done
    ]


def _reuse(jobs: list[_Job], done: dict[int, SimulationResult]) -> None:
    for i in range(len(jobs)):
        if i in done:
            continue
        twin = next((j for j in list(done) if _same_steps(jobs[j], done[j], jobs[i])), None)
        if twin is not None:
            done[i] = done[twin]


def _same_steps(ran: _Job, result: SimulationResult, other: _Job) -> bool:
    """Whether `other` would take exactly the steps `ran` took: same requests and pool, and
    the same step times at every size `ran` visited."""
    if ran.load is not other.load or ran.kv_tokens != other.kv_tokens:
        return False
    a, b = ran.cost, other.cost
    if (a.kv_read_ms_per_token, a.attention_ms_per_pair) != (
        b.kv_read_ms_per_token, b.attention_ms_per_pair
    ):
        return False
    decode = np.nonzero(result.decode_counts)[0]
    extend = np.nonzero(result.extend_counts)[0]
    return bool(
        np.array_equal(a.decode_ms[decode], b.decode_ms[decode])
        and np.array_equal(a.extend_ms[extend], b.extend_ms[extend])
    )


def _next_of_each(jobs: list[_Job], done: dict[int, SimulationResult]) -> list[int]:
    """The next run of each (schedule, load) not yet simulated (jobs run assumption by
    assumption within a group)."""
    groups, batch = set(), []
    for i, job in enumerate(jobs):
        key = (job.schedule.name, job.load.load)
        if i not in done and key not in groups:
            groups.add(key)
            batch.append(i)
    return batch


def _simulate_batch(
    jobs: list[_Job], limits: dict, progress, stop, firsts: dict[float, int] | None = None
) -> list[SimulationResult]:
    """simulate() for each job, up to SIMULATIONS_AT_ONCE at a time (forked processes share
    the cores; more at once only costs memory)."""
    width = SIMULATIONS_AT_ONCE
    results: list[SimulationResult] = []
    for start in range(0, len(jobs), width):
        part = jobs[start : start + width]
        kwargs = [
            {key: value for key, value in job.load.columns.items() if key not in ("split_s", "split_request")}
            | limits | {"cost": job.cost, "kv_capacity_tokens": job.kv_tokens}
            | ({} if firsts is None else {"alone_first": firsts[job.load.load]})
            for job in part
        ]
        got = simulate_all(kwargs, progress, stop)
        results.extend(got)
        if len(got) < len(part):
            break
    return results


def basin_lines(rows: list[ClosedLoopRow], reference: str = "plan") -> list[str]:
    """One line per schedule whose decode graphs stop below the batch its own eager steps push
    the server to: at the lowest load where it happens, against the reference schedule."""
    index = {(r.schedule, r.load, r.eager): r for r in rows}
    lines = []
    for name in dict.fromkeys(r.schedule for r in rows if r.schedule != reference):
        for row in sorted((r for r in rows if r.schedule == name), key=lambda r: r.load):
            ref = index.get((reference, row.load, row.eager))
            if ref is None or not in_basin(row, ref):
                continue
            lines.append(
                f"eager basin: the {_label(name)}'s decode graphs stop at batch {row.max_bs}, "
                f"below the batch its own eager steps hold the server at from {row.load:g}x "
                f"load ({row.eager} eager cost): median decode batch {row.median_decode_batch} "
                f"against {ref.median_decode_batch} with the {_label(reference)}'s graphs, "
                f"{row.decode_eager_share:.0%} of its decode steps eager; TPOT p50 "
                f"{row.tpot_p50_ms:,.1f} ms against {ref.tpot_p50_ms:,.1f} ms, TTFT p99 "
                f"{row.ttft_p99_s:,.2f} s against {ref.ttft_p99_s:,.2f} s (predicted)"
            )
            break
    return lines


def worse_lines(rows: list[ClosedLoopRow], margin: float = 0.02) -> list[str]:
    """Where the plan's clients fare worse than the default's on both TTFT p99 and TPOT p50 (by
    more than `margin`): the step-time choice did not carry over to the closed loop there."""
    index = {(r.schedule, r.load, r.eager): r for r in rows}
    worse = []
    for (name, load, eager), plan in index.items():
        default = index.get(("default", load, eager))
        if name != "plan" or default is None:
            continue
        if (plan.ttft_p99_s > (1 + margin) * default.ttft_p99_s
                and plan.tpot_p50_ms > (1 + margin) * default.tpot_p50_ms):
            worse.append(f"{load:g}x ({eager} eager cost): TTFT p99 {plan.ttft_p99_s:,.2f} s "
                         f"against {default.ttft_p99_s:,.2f} s, TPOT p50 {plan.tpot_p50_ms:,.1f} "
                         f"ms against {default.tpot_p50_ms:,.1f} ms")
    if not worse:
        return []
    return ["closed loop: served with their own step times, the engine default's clients would "
            "fare better than the plan's at " + "; ".join(worse) + " (predicted)"]


def in_basin(row: ClosedLoopRow, reference: ClosedLoopRow) -> bool:
    """Most of `row`'s decode steps run eagerly above its graphs, and that costs it: its batch,
    its time per token or its wait for a first token sits well above what the same traffic
    sees on `reference`'s graphs (a batch held down by the KV pool shows as a longer wait)."""
    off_ceiling = row.median_decode_batch > row.max_bs and row.decode_eager_share > 0.5
    return off_ceiling and (
        row.median_decode_batch >= BASIN_PUSH * max(reference.median_decode_batch, 1)
        or row.tpot_p50_ms >= BASIN_PUSH * reference.tpot_p50_ms
        or row.ttft_p99_s >= BASIN_WAIT * reference.ttft_p99_s
    )


def _label(name: str) -> str:
    return {"plan": "plan", "default": "engine default", "current": "current plan"}.get(name, name)
