"""The plan's simulations of the trace as the server runs today, at each load scenario.

The replica count is chosen on the fit requests (those before the held-out split) alone, so no
held-out request moves it; the fit requests' runs come with the whole trace's where they are its
first requests (cgtool.planner.sim_alone), so the steps the two share are simulated once.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cgtool.planner.request import PlanRequest
from cgtool.planner.scenarios import LoadRun, Traffic, replicas_needed, split_index, split_time
from cgtool.planner.server import Server, default_step_cost
from cgtool.planner.sim_alone import DropWhole
from cgtool.planner.sim_parallel import simulate_all

Progress = Callable[[str, float], None]
# Replica estimates are re-simulated until one sustains every load scenario, at most this often.
REPLICA_ROUNDS = 4


def fit_traffic(traffic: Traffic) -> Traffic:
    """The requests before the whole trace's held-out split: those that arrive before the
    first held-out one, or a closed-loop client's first requests. A trace whose requests all
    arrive at the split (one burst) has no fit part: then all of it (issue 34)."""
    n = len(traffic)
    if traffic.arrival_s is None:
        keep = np.arange(n) < split_index(n)
    else:
        arrival = np.asarray(traffic.arrival_s, dtype=np.float64)
        keep = arrival < split_time(np.sort(arrival))
    return traffic.kept(keep) if keep.any() else traffic


def enough_replicas(
    traffic: Traffic, fit: Traffic, req: PlanRequest, server: Server, kv: int,
    progress: Progress | None, stop: Callable[[], bool] | None,
) -> tuple[list[LoadRun], int, list[LoadRun], list[LoadRun]]:
    """(runs of `fit` at the asked-for replicas, the fewest replicas from there up at which no
    load scenario of `fit` overloads, the runs of `traffic` and of `fit` at those). Each
    estimate is checked by simulating it, so re-planning at the count the plan names (as
    `verify` does, or a user pasting --replicas) finds it again."""
    replicas = req.replicas
    runs, fit_runs = _simulate_both(traffic, fit, req, server, replicas, kv, progress, stop,
                                    REPLICA_ROUNDS > 0)
    asked = fit_runs
    for round_ in range(REPLICA_ROUNDS):
        needed = replicas_needed(fit_runs, replicas)
        if needed is None or fit_runs[-1].result.completed_fraction < 1.0:
            break
        replicas = needed
        # The last round's runs are kept whatever its fit runs show: they must be whole.
        runs, fit_runs = _simulate_both(traffic, fit, req, server, replicas, kv, progress, stop,
                                        round_ + 1 < REPLICA_ROUNDS)
    return asked, replicas, runs, fit_runs


def _simulate_both(
    traffic: Traffic, fit: Traffic, req: PlanRequest, server: Server, replicas: int, kv: int,
    progress: Progress | None, stop: Callable[[], bool] | None, may_redo: bool,
) -> tuple[list[LoadRun], list[LoadRun]]:
    """The runs of `traffic` (with the held-out split) and of `fit` by itself, the second
    taken from the first where `fit` is its first requests (sim_alone). Overload reads no
    split, so the fit runs have none: they are then exactly the default's closed loop on
    `fit` (no split ends a step). Where `may_redo` and a fit run overloads, the round is
    simulated again at more replicas: the runs of `traffic` then stop early (DropWhole)."""
    firsts = first_counts(traffic, fit, req.loads, replicas)
    closed = fit.concurrency is not None
    fit_jobs = fit.load_jobs(req.loads, replicas)
    drop = None
    if may_redo and firsts is not None:
        flag = DropWhole.shared_flag()
        drop = {job.load: DropWhole(lambda r, job=job: LoadRun(
            job.load, r, job.span_s, job.offline, closed).overloaded, flag) for job in fit_jobs}
    runs = simulate_loads(traffic, req, server, replicas, kv, progress, stop, firsts=firsts,
                          drop=drop)
    if firsts is None or len(runs) < len(req.loads) or any(r.result.alone is None for r in runs):
        return runs, simulate_loads(fit, req, server, replicas, kv, progress, stop, split=False)
    return runs, [LoadRun(job.load, run.result.alone, job.span_s, job.offline, closed)
                  for job, run in zip(fit_jobs, runs)]


def simulate_loads(
    traffic: Traffic,
    req: PlanRequest,
    server: Server,
    replicas: int,
    kv_tokens: int,
    progress: Progress | None,
    stop: Callable[[], bool] | None,
    split: bool = True,
    firsts: dict[float, int] | None = None,
    drop: dict[float, DropWhole] | None = None,
) -> list[LoadRun]:
    loads = traffic.load_jobs(req.loads, replicas)
    limits = {
        "cost": default_step_cost(server),
        "max_running_requests": server.max_running,
        "chunked_prefill_size": server.chunk,
        "kv_capacity_tokens": kv_tokens,
        "context_len": server.context_len,
    }
    report = None if progress is None else (lambda f: progress("simulate", f))
    columns = [job.columns if split else
               {k: v for k, v in job.columns.items() if k not in ("split_s", "split_request")}
               for job in loads]
    alone = [({} if firsts is None else {"alone_first": firsts[job.load]})
             | ({} if drop is None else {"drop_whole": drop[job.load]}) for job in loads]
    results = simulate_all([c | limits | a for c, a in zip(columns, alone)], report, stop)
    return [
        LoadRun(job.load, result, job.span_s, job.offline, traffic.concurrency is not None)
        for job, result in zip(loads, results)
    ]


def first_counts(
    traffic: Traffic, fit: Traffic, loads: tuple[float, ...], replicas: int
) -> dict[float, int] | None:
    """Per load, how many of the first requests of one replica's share of `traffic` are its
    share of `fit`, or None when they are not its first requests (arrivals out of order)."""
    if fit is traffic or traffic.arrival_s is None:
        return None
    arrival = np.asarray(traffic.arrival_s)
    if not np.all(arrival[1:] >= arrival[:-1]):
        return None
    return {job.load: len(job.columns["input_len"]) for job in fit.load_jobs(loads, replicas)}
