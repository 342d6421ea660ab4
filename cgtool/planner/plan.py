"""A plan end to end: simulate the trace at each load, choose sizes, size memory, score.

The trace is run through the scheduler once per load scenario as the server runs today: the
engine default's step times and its own KV pool. Sizes are fitted on the steps before the
held-out split (cgtool.planner.scenarios) under every eager-cost assumption
(cgtool.planner.robust); the plan, the default and an existing plan are then scored on the
same held-out steps. Then each of them is served again with its own step times and KV pool
(cgtool.planner.closed_loop): what clients see (TTFT, TPOT, throughput) is reported from those
runs, and the plan's decode graphs grow to cover the batches its own run reaches. Every
figure is a prediction of the cost model, and the plan says so.

The result is the plan.json document itself (cgtool.documents.plan_document.Plan): cgtool.planner.finish
copies the planner's working results (histograms, scores) into it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from cgtool.documents.plan_document import ClosedLoopRow, LoadSummary, Plan, PlanMemory, Simulation
from cgtool.errors import InputError
from cgtool.planner.closed_loop import SimulationCache, closed_loop, run_key
from cgtool.planner.finish import finish_plan
from cgtool.planner.plan_batches import BATCH_TRACE_CONTEXT_TOKENS, plan_batches
from cgtool.planner.plan_notes import few_requests_warning
from cgtool.planner.plan_runs import enough_replicas, first_counts, fit_traffic
from cgtool.planner.plan_scores import compared_schedules
from cgtool.planner.plan_sizing import choose_and_size, limits_for, size_memory
from cgtool.planner.request import PlanRequest
from cgtool.planner.robust import RobustChoice, Scenario, Schedule, cover_decode
from cgtool.planner.scenarios import LoadRun, Traffic, overload_warning
from cgtool.planner.server import Server, server_for
from cgtool.planner.sim_result import SimulationResult, StepTally
from cgtool.planner.tails import (
    TAIL_TOLERANCE,
    fewest_that_fix,
    offers,
    probe_size,
    shortfall,
    whole_trace_shortfall,
)
from cgtool.units import counted

__all__ = ["BATCH_TRACE_CONTEXT_TOKENS", "PlanRequest", "fit_parts", "plan_batches",
           "plan_requests", "plan_traffic"]

Progress = Callable[[str, float], None]


def plan_requests(
    arrival_s: np.ndarray,
    input_len: np.ndarray,
    output_len: np.ndarray,
    cached_len: np.ndarray | None,
    req: PlanRequest,
    progress: Progress | None = None,
    stop: Callable[[], bool] | None = None,
) -> Plan:
    """Plan from request-level arrays (seconds, tokens); `stop` ends the simulation early and
    the plan then covers the requests simulated so far, marked incomplete."""
    return plan_traffic(Traffic(arrival_s, input_len, output_len, cached_len), req, progress, stop)


def plan_traffic(
    traffic: Traffic,
    req: PlanRequest,
    progress: Progress | None = None,
    stop: Callable[[], bool] | None = None,
) -> Plan:
    """Plan from requests with arrival times, or from lengths served by a closed-loop client."""
    server = server_for(req)
    if len(traffic) == 0:
        raise InputError(f"{req.trace_name or 'the trace'} holds no request",
                         "Plan from a trace with requests.")
    # The server as it runs today: the default's step times and its own KV pool. These runs are
    # also the default's closed loop under the first eager assumption (its cost is the server's).
    kv = server.default_kv_tokens
    # The replica count is chosen on the fit requests alone, so no held-out request moves it.
    fit = fit_traffic(traffic)
    asked, replicas, runs, fit_runs = enough_replicas(traffic, fit, req, server, kv, progress,
                                                       stop)
    _check_some_fit(runs[0].result, req, server, kv)
    if progress is not None:
        progress("optimise", 0.0)
    pool = _fit(req, server, runs, kv)
    kv_ms = server.cost.kv_read_ms_per_token
    held = [Scenario(r.load, *fit_parts(r)[1].histograms(kv_ms)) for r in pool.runs]
    first = pool.runs[0].result
    whole = first.tally().histograms(kv_ms)
    schedules = compared_schedules(req, server, pool.choice, pool.memory)
    loads = req.loads[:len(pool.runs)]
    # The runs so far are the default's closed loop under the first eager assumption.
    served = _default_runs(server, pool.runs)
    fit_served = served if fit is traffic else _default_runs(server, fit_runs)
    # Each run of the whole trace also serves the fit requests by themselves (sim_alone).
    firsts = first_counts(traffic, fit, loads, replicas)
    alone = None if firsts is None else (firsts, fit_served)
    loop = _closed_loop(traffic, req, server, schedules, replicas, loads, progress, stop, served,
                        alone)
    # What the closed loop changes is decided on the fit requests alone, served by themselves, so
    # no held-out request moves a size; the whole trace's runs are what the plan reports.
    judged = loop if fit is traffic else _closed_loop(fit, req, server, schedules, replicas,
                                                       loads, progress, stop, fit_served)
    covered = _cover_own_batches(fit, req, server, pool, judged, replicas, progress, stop,
                                 fit_served)
    if covered is not None:
        pool.choice, pool.memory, judged, note = covered

    def confirm(schedule: list[tuple[Schedule, int]]) -> list[ClosedLoopRow]:
        # The whole trace served (as the plan reports it), its run forking the fit requests'.
        _closed_loop(traffic, req, server, schedule, replicas, loads, progress, stop, served, alone)
        return _closed_loop(fit, req, server, schedule, replicas, loads, progress, stop, fit_served)

    matched = _match_default_tails(fit, req, server, pool, judged, replicas, progress, stop,
                                   fit_served, confirm)
    if matched is not None:
        pool.choice, pool.memory, judged, tail_note = matched
    if covered is not None or matched is not None:
        loop = _served_as_chosen(traffic, req, server, pool, loop, replicas, progress, stop,
                                 served)
    whole_note = whole_trace_shortfall(loop) if matched is not None and fit is not traffic else None
    plan = finish_plan(req, server, pool.choice, pool.memory, pool.fit, held, whole,
                       _simulation(pool, replicas), "requests", replicas, loop)
    plan.warnings.extend(pool.notes)
    if covered is not None:
        plan.warnings.append(note)
    if matched is not None:
        plan.warnings.append(tail_note)
    if whole_note:
        plan.warnings.append(whole_note)
    if replicas != req.replicas:
        plan.warnings.insert(0, overload_warning(asked, req.replicas, replicas))
    _note_incomplete(plan, pool.runs, req)
    plan.warnings.extend(_traffic_notes(traffic, pool.runs, replicas))
    if first.dropped_requests:
        plan.warnings.append(
            f"{counted(first.dropped_requests, 'request')} longer than the context or the KV pool "
            "dropped; the typical length and peak KV demand count only the rest"
        )
    if progress is not None:
        progress("optimise", 1.0)
    return plan


def fit_parts(run: LoadRun) -> tuple[StepTally, StepTally]:
    """(steps to fit on, held-out steps): the steps before and after the held-out split, or
    every step and none when the split by time means nothing (an offline batch) or left no
    step to fit on."""
    fit, held = run.result.split_tallies()
    if run.offline or fit.steps == 0:
        whole = run.result.tally()
        return whole, whole.minus(whole)
    return fit, held


def _closed_loop(
    traffic: Traffic, req: PlanRequest, server: Server, schedules: list[tuple[Schedule, int]],
    replicas: int, loads: tuple[float, ...], progress: Progress | None,
    stop: Callable[[], bool] | None, cache: SimulationCache | None = None,
    alone: tuple[dict[float, int], SimulationCache] | None = None,
) -> list[ClosedLoopRow]:
    """Each schedule served with its own step times at each of these loads; `cache` holds
    runs of `traffic` at `replicas` (closed_loop.run_key); see closed_loop for `alone`."""
    if stop is not None and stop():
        return []
    limits = {"max_running_requests": server.max_running, "chunked_prefill_size": server.chunk,
              "context_len": server.context_len}
    report = None if progress is None else (lambda f: progress("closed loop", f))
    jobs = traffic.load_jobs(loads, replicas)
    return closed_loop(schedules, server.assumptions, jobs, limits, report, stop, cache, alone)


def _default_runs(server: Server, runs: list[LoadRun]) -> SimulationCache:
    """Runs of the server as it runs today, as the default's closed loop under the first eager
    assumption: the same step times (default_step_cost) and KV pool."""
    d = server.default
    default = Schedule("default", tuple(d.decode_bs), tuple(d.piecewise_tokens), d.pads)
    eager = server.assumptions[0].name
    return {run_key(default, eager, r.load, server.default_kv_tokens): r.result
            for r in runs if r.result.completed_fraction >= 1.0}


def _cover_own_batches(
    traffic: Traffic, req: PlanRequest, server: Server, pool: _PoolFit,
    loop: list[ClosedLoopRow], replicas: int, progress: Progress | None,
    stop: Callable[[], bool] | None, cache: SimulationCache,
) -> tuple[RobustChoice, PlanMemory, list[ClosedLoopRow], str] | None:
    """When the plan, served with its own step times, reaches batches past its decode graphs
    (sizes were fitted on the default's steps), its decode graphs are extended to cover them
    and its closed loop run again; None when it stays within them or a budget rules."""
    own = max((r.largest_decode_batch for r in loop if r.schedule == "plan"), default=0)
    top = max(pool.choice.decode_bs, default=0)
    budgeted = req.budget_graphs is not None or req.budget_memory_bytes is not None
    if own <= top or budgeted:
        return None
    limits = limits_for(req, server)
    decode_bs, tokens = cover_decode(pool.choice.decode_bs, pool.choice.tokens, own, limits,
                                     server.cost, shared=req.engine == "vllm")
    if max(decode_bs, default=0) <= top:
        return None
    choice = replace(pool.choice, decode_bs=decode_bs, tokens=tokens)
    first = pool.runs[0].result
    memory = size_memory(req, server, choice, first.peak_kv_demand_tokens,
                         first.typical_request_tokens)
    plan_schedule = compared_schedules(req, server, choice, memory)[:1]
    rows = _closed_loop(traffic, req, server, plan_schedule, replicas, req.loads[:len(pool.runs)],
                        progress, stop, cache)
    note = (f"closed loop: served with its own step times the plan reached decode batch {own}, "
            f"past its largest graph ({top}); its decode graphs now reach {max(decode_bs)}")
    return choice, memory, rows + [r for r in loop if r.schedule != "plan"], note


def _match_default_tails(
    fit: Traffic, req: PlanRequest, server: Server, pool: _PoolFit,
    loop: list[ClosedLoopRow], replicas: int, progress: Progress | None,
    stop: Callable[[], bool] | None, cache: SimulationCache,
    confirm: Callable[[list[tuple[Schedule, int]]], list[ClosedLoopRow]] | None = None,
) -> tuple[RobustChoice, PlanMemory, list[ClosedLoopRow], str] | None:
    """Where the plan's clients fare worse than the default's (cgtool.planner.tails), the
    fewest of the default's sizes the plan lacks, prefill first, that bring every figure
    within the tolerance, or the plan unchanged with a note when none do; None when it loses
    nowhere or a budget rules. `confirm` serves a plan schedule and returns its rows on `fit`
    (by default simulated on `fit` alone); see _TailSearch for the search."""
    before, where = shortfall(loop)
    if before <= TAIL_TOLERANCE or req.budget_graphs is not None or req.budget_memory_bytes is not None:
        return None
    steps = [fit_parts(r)[0].histograms(server.cost.kv_read_ms_per_token) for r in pool.runs]
    order = offers(pool.choice.decode_bs, pool.choice.tokens, server.default, steps, server.cost)
    loads = req.loads[:len(pool.runs)]
    # The search serves only the loads where the plan loses; the head it keeps, every load.
    losing = tuple(x for x in loads if shortfall([r for r in loop if r.load == x])[0] > TAIL_TOLERANCE)
    search = _TailSearch(fit, req, server, pool, replicas, loads, losing, progress, stop, cache,
                         confirm, [r for r in loop if r.schedule != "plan"])
    fix, choice, memory, rows = search.run(order)
    after = shortfall(rows)[0] if fix else before
    if not fix or after > TAIL_TOLERANCE:
        return pool.choice, pool.memory, loop, (
            f"closed loop: the plan's {where} trails the engine default's by {before:.0%}; adding "
            "the default's sizes the plan lacks does not close that, so none are added (predicted)")
    names = "; ".join(f"{kind} {' '.join(str(s) for k, s in fix if k == kind)}"
                      for kind in dict.fromkeys(k for k, _ in fix))
    now = f"now within {after:.1%} of it" if after > 0 else "now no worse than it"
    return choice, memory, rows, (
        f"closed loop: the plan's {where} trailed the engine default's by {before:.0%}; added the "
        f"default's {names} (sizes the plan lacked, those saving the most step time first), "
        f"{now} on every client figure of the fit requests (predicted)")


@dataclass(eq=False)
class _TailSearch:
    """The tail check's search for a head of `order` (the default's sizes the plan lacks).

    A long trace is searched on each replica's first fit requests (tails.probe_size) against the
    default's run of the same requests; the head found there is served on all the fit requests
    and kept only if it holds there, else the search runs again on all of them."""

    fit: Traffic
    req: PlanRequest
    server: Server
    pool: _PoolFit
    replicas: int
    loads: tuple[float, ...]
    losing: tuple[float, ...]
    progress: Progress | None
    stop: Callable[[], bool] | None
    cache: SimulationCache  # runs of `fit`
    confirm: Callable[[list[tuple[Schedule, int]]], list[ClosedLoopRow]] | None
    others: list[ClosedLoopRow]  # the other schedules' rows on `fit`

    def run(self, order: list[tuple[str, int]]) -> tuple[
            list[tuple[str, int]] | None, RobustChoice, PlanMemory, list[ClosedLoopRow]]:
        """(the head kept or None, and the sizes, memory and fit rows that go with it)."""
        probe = self.fit.first_requests(probe_size(len(self.fit), self.replicas))
        if probe is self.fit:
            fix = fewest_that_fix(order, self._shortfall_on(self.fit, self.cache, self.others))
        else:
            fix = fewest_that_fix(order, self._shortfall_on(probe, {}, self._default_rows(probe)))
        if not fix:
            return None, self.pool.choice, self.pool.memory, []
        choice, memory, rows = self._served_on_fit(fix)
        if probe is not self.fit and shortfall(rows)[0] > TAIL_TOLERANCE:
            # The first requests' head does not hold on all of them: search on all of them.
            fix = fewest_that_fix(order, self._shortfall_on(self.fit, self.cache, self.others))
            if not fix:
                return None, self.pool.choice, self.pool.memory, []
            choice, memory, rows = self._served_on_fit(fix)
        return fix, choice, memory, rows

    def _with_sizes(self, added: list[tuple[str, int]]) -> tuple[RobustChoice, PlanMemory]:
        ours, first = self.pool.choice, self.pool.runs[0].result
        choice = replace(ours, decode_bs=sorted({*ours.decode_bs, *(s for k, s in added if k == "decode")}),
                         tokens=sorted({*ours.tokens, *(s for k, s in added if k == "prefill")}))
        return choice, size_memory(self.req, self.server, choice, first.peak_kv_demand_tokens,
                                   first.typical_request_tokens)

    def _shortfall_on(self, traffic: Traffic, cache: SimulationCache,
                      rivals: list[ClosedLoopRow]) -> Callable[[list[tuple[str, int]]], float]:
        def worst_with(added: list[tuple[str, int]]) -> float:
            choice, memory = self._with_sizes(added)
            schedule = compared_schedules(self.req, self.server, choice, memory)[:1]
            rows = _closed_loop(traffic, self.req, self.server, schedule, self.replicas,
                                self.losing, self.progress, self.stop, cache)
            return shortfall(rows + rivals)[0]
        return worst_with

    def _default_rows(self, traffic: Traffic) -> list[ClosedLoopRow]:
        schedules = compared_schedules(self.req, self.server, self.pool.choice, self.pool.memory)
        default = [s for s in schedules if s[0].name == "default"]
        return _closed_loop(traffic, self.req, self.server, default, self.replicas, self.loads,
                            self.progress, self.stop, {})

    def _served_on_fit(self, added: list[tuple[str, int]]) -> tuple[
            RobustChoice, PlanMemory, list[ClosedLoopRow]]:
        choice, memory = self._with_sizes(added)
        schedule = compared_schedules(self.req, self.server, choice, memory)[:1]
        rows = self.confirm(schedule) if self.confirm is not None else _closed_loop(
            self.fit, self.req, self.server, schedule, self.replicas, self.loads, self.progress,
            self.stop, self.cache)
        return choice, memory, rows + self.others


def _served_as_chosen(
    traffic: Traffic, req: PlanRequest, server: Server, pool: _PoolFit,
    loop: list[ClosedLoopRow], replicas: int, progress: Progress | None,
    stop: Callable[[], bool] | None, cache: SimulationCache,
) -> list[ClosedLoopRow]:
    """The whole trace's closed loop with the plan's rows served again for its final sizes (the
    runs of sizes already served come from `cache`)."""
    plan_schedule = compared_schedules(req, server, pool.choice, pool.memory)[:1]
    rows = _closed_loop(traffic, req, server, plan_schedule, replicas,
                        req.loads[:len(pool.runs)], progress, stop, cache)
    return rows + [r for r in loop if r.schedule != "plan"]


def _traffic_notes(traffic: Traffic, runs: list[LoadRun], replicas: int) -> list[str]:
    notes = []
    few = few_requests_warning(len(traffic))
    if few:
        notes.append(few)
    if traffic.concurrency is not None:
        per = f", split evenly over {replicas} replicas" if replicas > 1 else ""
        notes.append(
            f"closed-loop client: {traffic.concurrency} requests in flight at 1x load{per} (each "
            "load multiplies it), a new one sent as one finishes; no arrival times"
        )
    offline = [run for run in runs if run.offline]
    if offline and len(traffic) > 1:  # one request is no batch job
        loads = ", ".join(f"{run.load:g}x" for run in offline)
        notes.append(
            f"offline batch at {loads}: most requests arrive at once, so the queue drains by "
            "design; TTFT counts the wait behind the batch, and no replicas are suggested"
        )
    if any(fit_parts(run)[0].steps == run.result.steps and run.result.before_split is not None
           for run in runs):
        notes.append(
            "in-sample: a held-out split by arrival time leaves nothing to fit on when the "
            "requests arrive together, so sizes are fitted and scored on the whole trace there"
        )
    return notes


def _check_some_fit(first: SimulationResult, req: PlanRequest, server: Server, kv: int) -> None:
    if first.dropped_requests == first.num_requests:
        raise InputError(
            f"{req.trace_name or 'the trace'}: all {first.num_requests} requests are longer "
            f"than {req.cfg.name}'s context ({server.context_len}) or its KV pool ({kv} tokens)",
            "Plan for a model with a longer context, or a larger GPU.",
        )


@dataclass(slots=True)
class _PoolFit:
    """The runs the sizes are fitted on (the default's server), and the sizes chosen."""

    runs: list[LoadRun]
    kv_tokens: int  # the pool the runs admitted against
    rounds: int
    choice: RobustChoice
    memory: PlanMemory
    fit: list[Scenario]
    notes: list[str]  # sizes the release's rules added to the choice


def _fit(req: PlanRequest, server: Server, runs: list[LoadRun], kv: int) -> _PoolFit:
    """Sizes and memory chosen on the steps before the held-out split of each load's run."""
    kv_ms = server.cost.kv_read_ms_per_token
    fit = [Scenario(r.load, *fit_parts(r)[0].histograms(kv_ms)) for r in runs]
    first = runs[0].result
    choice, memory, notes = choose_and_size(
        req, server, fit, first.peak_kv_demand_tokens, first.typical_request_tokens
    )
    return _PoolFit(runs, kv, 1, choice, memory, fit, notes)


def _simulation(pool: _PoolFit, replicas: int) -> Simulation:
    first = pool.runs[0].result
    return Simulation(
        num_requests=first.num_requests,
        dropped_requests=first.dropped_requests,
        duration_s=first.duration_s,
        steps=first.steps,
        mean_queue_s=first.mean_queue_s,
        p99_queue_s=first.p99_queue_s,
        simulated_kv_tokens=pool.kv_tokens,
        pool_rounds=pool.rounds,
        typical_request_tokens=first.typical_request_tokens,
        loads=[LoadSummary(**run.summary()) for run in pool.runs],
        replicas=replicas,
    )


def _note_incomplete(plan: Plan, runs: list[LoadRun], req: PlanRequest) -> None:
    first = runs[0].result
    if first.completed_fraction >= 1.0 and len(runs) == len(req.loads):
        return
    plan.status = "incomplete"
    done = ", ".join(f"{run.load:g}x" for run in runs)
    plan.warnings.insert(
        0,
        f"incomplete: simulation stopped after {first.completed_fraction:.0%} of the "
        "requests; sizes fit only the traffic simulated so far"
        if first.completed_fraction < 1.0
        else f"incomplete: stopped with only the {done} load simulated; sizes fit only it",
    )
