"""Load scenarios simulated side by side, one process each, when the trace is large.

The simulator is one Python loop per request; two loads on two cores take the time of one.
The first scenario runs in this process (it reports progress and polls `stop`); the others
run in forked children that inherit the arrays without copying them. Children ignore Ctrl-C
and die on SIGTERM: the parent alone watches `stop`, and when it fires, during its own
simulation or while waiting for theirs, it ends the children and keeps what it has.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable
from typing import Any

from cgtool.planner.sim_result import SimulationResult
from cgtool.planner.simulator import simulate

# Below this many requests a simulation takes well under 0.1 s, and a fork of a process that
# holds a million requests' lists costs 30 ms. From 20,000 (the tail check's 50,000-request
# searches run in parallel) the million-request benchmark took 13.5-14.8 s against 15.1-15.5 s
# from 100,000 (2-core CPU, quiet, 2026-11-26, benchmarks/results/cpu-2026-11-26-speed3).
PARALLEL_MIN_REQUESTS = 20_000

_JOBS: list[dict[str, Any]] = []  # read by forked children; set just before they start


def _child(index: int, conn: Any) -> None:
    # The parent's handlers would only set its flag here; the parent decides for children.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        conn.send(simulate(**_JOBS[index]))
    except Exception as exc:  # noqa: BLE001 - any error goes to the parent, which raises it
        conn.send(exc)
    finally:
        conn.close()


def _parallel(jobs: list[dict[str, Any]]) -> bool:
    n = len(jobs[0]["arrival_s"])
    return (
        len(jobs) > 1
        and n >= PARALLEL_MIN_REQUESTS
        and (os.cpu_count() or 1) > 1
        and "fork" in multiprocessing.get_all_start_methods()
    )


def simulate_all(
    jobs: list[dict[str, Any]],
    progress: Callable[[float], None] | None,
    stop: Callable[[], bool] | None,
) -> list[SimulationResult]:
    """simulate(**job) for each job, in order; fewer results when `stop` ended the first."""
    if not _parallel(jobs):
        return _serial(jobs, progress, stop)
    global _JOBS
    _JOBS = [job | {"stop": None, "progress": None} for job in jobs]
    ctx = multiprocessing.get_context("fork")
    children = []
    try:
        for index in range(1, len(jobs)):
            receive, send = ctx.Pipe(duplex=False)
            process = ctx.Process(target=_child, args=(index, send), daemon=True)
            process.start()
            send.close()
            children.append((process, receive))
        first = simulate(**(jobs[0] | {"progress": progress, "stop": stop}))
        if stopped(first):
            return [first]
        results = [first]
        for process, receive in children:
            while not receive.poll(0.1):
                if stop is not None and stop():
                    return results  # the caller marks the plan incomplete
            result = receive.recv()
            process.join()
            if isinstance(result, Exception):
                raise result
            results.append(result)
        return results
    finally:
        _JOBS = []
        for process, _ in children:
            if process.is_alive():
                process.kill()  # a child blocked writing its result would not see SIGTERM
            process.join()


def _serial(jobs, progress, stop) -> list[SimulationResult]:
    results = []
    for i, job in enumerate(jobs):
        report = None if progress is None else (lambda f, i=i: progress((i + f) / len(jobs)))
        results.append(simulate(**(job | {"progress": report, "stop": stop})))
        if stopped(results[-1]):
            break  # plan on what was simulated
    return results


def stopped(result: SimulationResult) -> bool:
    """Whether `stop` ended the run. A whole run ended because its round is simulated again
    (sim_alone.DropWhole) still carries its first requests' run, and the other jobs go on."""
    return result.completed_fraction < 1.0 and result.alone is None
