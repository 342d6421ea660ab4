"""Continuous batching as SGLang schedules it, to learn which batch sizes a trace produces and
when each request gets its first token and its last.

Arrivals queue first come, first served. Each step is either an extend batch (queued prompts
minus their cached prefix, at most `chunked_prefill_size` tokens, a long prompt split across
steps) or a decode batch of every running request; waiting prompts go first, as in SGLang.
A request is admitted while fewer than `max_running_requests` run and the KV pool can hold its
prompt and its whole output (reserving the output up front means no request is ever retracted).
The prefill yields the first output token, at the end of the extend step that computes the
prompt's last token; each decode step one more. A step's time is cgtool.planner.step_time's.

Between an arrival and a completion the decode batch does not change, so a whole run of
identical decode steps is taken at once: its time is an arithmetic series, because each step
reads `batch` more context tokens than the one before.

With a `concurrency` N (a closed-loop client), the first N requests arrive at once and each
later one arrives when a request finishes.
"""

from __future__ import annotations

import gc
import heapq
import math
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from cgtool.planner.sim_alone import AloneFork, DropWhole, alone_fork, go_alone
from cgtool.planner.sim_requests import NEVER_MS, Requests, prepare
from cgtool.planner.sim_result import RunTallies, SimulationResult, StepLog, build_result
from cgtool.planner.step_time import StepCost

__all__ = ["POLL_EVERY_REQUESTS", "StepCost", "simulate"]

# Polling `progress` and `stop` costs a call: it is done once per this many admitted requests.
POLL_EVERY_REQUESTS = 32768


def _run(
    reqs: Requests,
    cost: StepCost,
    max_running: int,
    chunk: int,
    kv_capacity: int,
    progress: Callable[[float], None] | None,
    stop: Callable[[], bool] | None = None,
    split_ms: float = math.inf,
    concurrency: int | None = None,
    split_request: int = -1,
    log: StepLog | None = None,
    alone: AloneFork | None = None,
) -> RunTallies:
    # One flat loop over local variables, longer than a screen on purpose: it turns once per
    # arrival and once per completion (millions of times for a large trace), and a helper
    # function, an attribute lookup or a counter updated on every turn costs time on each
    # (benchmarks/bench_plan.py measures the whole). Invariants that save work:
    # the running requests are the heap plus the split prompt; a decode run stops at or
    # before the first completion, so the completions it reaches finish exactly at `step`.
    # Step times are cgtool.planner.step_time's formulas, written out here for that reason.
    n, arrival_ms, new, cached = len(reqs.decode_steps), reqs.arrival_ms, reqs.new, reqs.cached
    decode_steps, footprint = reqs.decode_steps, reqs.footprint
    cum_new, cum_footprint, cum_pairs = reqs.cum_new, reqs.cum_footprint, reqs.cum_pairs
    decode_ms, extend_ms = cost.decode_ms.tolist(), cost.extend_ms.tolist()
    kv_ms, pair_ms = cost.kv_read_ms_per_token, cost.attention_ms_per_pair
    t = RunTallies(
        [0] * (max_running + 1),
        [0.0] * (max_running + 1),
        [0] * (max_running + 1),
        [0] * (chunk + 1),
        [0.0] * (chunk + 1),
        [0.0] * (chunk + 1),
        finish_ms=[math.nan] * n,
    )
    decode_counts, decode_elapsed, decode_context = (
        t.decode_counts,
        t.decode_elapsed_ms,
        t.decode_context,
    )
    extend_counts, extend_elapsed, extend_attention = (
        t.extend_counts,
        t.extend_elapsed_ms,
        t.extend_attention_ms,
    )
    admitted_upto, admitted_at = t.admitted_upto.append, t.admitted_at_ms.append
    admitted_end, finish_ms = t.admitted_end_ms.append, t.finish_ms
    sqrt, ceil = math.sqrt, math.ceil
    heap: list[int] = []  # finish step * n + request, for decoding requests
    push, pop = heapq.heappush, heapq.heappop
    clock = 0.0
    head = arrived = 0  # the queue is requests [head, arrived)
    split, split_done = -1, 0  # a prompt spread over several extend steps
    kv_used = step = context = peak_kv = 0
    zero_done = 0  # requests of one output token, finished by this extend step
    # With a concurrency, the next request to arrive when one finishes; n (never) without.
    releasing = n if concurrency is None else min(concurrency, n)
    poll_at = POLL_EVERY_REQUESTS
    # Until a request after the first `alone.given` could change a step, the run forks
    # (cgtool.planner.sim_alone); each of the three places below is the first such step of
    # its kind, and the child goes on as the first requests' own run.
    # NaN once forked (or never to fork): it compares false with every time, even NEVER_MS.
    alone_ms = math.nan if alone is None else alone.at_ms
    # `context`: tokens the decoding requests hold at `step`. One admitted at `step` holds its
    # prompt and first output (footprint - decode steps); it holds its footprint at `finish`.
    while True:
        if clock >= alone_ms:  # a later request has arrived
            alone_ms = math.nan
            split_ms, progress, stop = go_alone(
                alone, arrival_ms, footprint, split_ms, progress, stop)
        if clock >= split_ms:
            split_ms = math.inf  # once: the tallies so far are the fit part
            t.before_split = (
                decode_counts[:], decode_elapsed[:], decode_context[:],
                extend_counts[:], extend_elapsed[:], extend_attention[:],
            )
        if arrival_ms[arrived] <= clock:
            arrived += 1  # one arrival since the last step is the usual case: no search
            if arrival_ms[arrived] <= clock:
                arrived = bisect_right(arrival_ms, clock, arrived)
        if split >= 0 or (
            head < arrived and len(heap) < max_running and kv_used + footprint[head] <= kv_capacity
        ):
            # ---- extend: the split prompt first, then whole queued prompts, then a new split
            if head >= poll_at:
                poll_at = head + POLL_EVERY_REQUESTS
                if progress is not None:
                    progress(head / n)
                if stop is not None and stop():
                    break
            first, finished_split = head, -1
            if split < 0 and arrived - head == 1 and new[head] <= chunk:
                # The usual case below saturation, taken without the searches below: one
                # queued prompt, admitted whole (the test above found room for it).
                tokens, pairs = new[head], cum_pairs[head + 1] - cum_pairs[head]
                kv_used += footprint[head]
                if kv_used > peak_kv:  # noqa: PLR1730 - a compare costs less than a call
                    peak_kv = kv_used
                if decode_steps[head]:
                    push(heap, (step + decode_steps[head]) * n + head)
                    context += footprint[head] - decode_steps[head]
                else:
                    kv_used -= footprint[head]
                    zero_done += 1
                head += 1
                admitted_upto(head)
                admitted_at(clock)
            else:
                running = len(heap) + (split >= 0)
                tokens, pairs = 0, 0.0
                if split >= 0:
                    tokens = min(new[split] - split_done, chunk)
                    pairs = tokens * (int(cached[split]) + split_done) + tokens * (tokens + 1) / 2.0
                    split_done += tokens
                    if split_done == new[split]:
                        finished_split, split = split, -1
                budget = chunk - tokens
                if split < 0 and budget > 0 and head < arrived:
                    if kv_used + footprint[head] > kv_capacity or running >= max_running:
                        last = head
                    elif arrived - head == 1:
                        last = head + 1 if new[head] <= budget else head
                    else:
                        # Searched among the queued (up to `arrived`) only.
                        last = min(
                            bisect_right(
                                cum_footprint,
                                cum_footprint[head] + kv_capacity - kv_used,
                                head,
                                arrived + 1,
                            )
                            - 1,
                            bisect_right(cum_new, cum_new[head] + budget, head, arrived + 1) - 1,
                            head + max_running - running,
                        )
                    if last > head:
                        kv_used += cum_footprint[last] - cum_footprint[head]
                        running += last - head
                        tokens += cum_new[last] - cum_new[head]
                        pairs += cum_pairs[last] - cum_pairs[head]
                        budget = chunk - tokens
                        head = last
                    if (
                        budget > 0
                        and head < arrived
                        and running < max_running
                        and kv_used + footprint[head] <= kv_capacity
                    ):
                        # The next prompt is longer than what is left of the budget: split it.
                        tokens += budget
                        pairs += budget * int(cached[head]) + budget * (budget + 1) / 2.0
                        split, split_done = head, budget
                        kv_used += footprint[head]
                        head += 1
                if head > first:
                    admitted_upto(head)
                    admitted_at(clock)
                peak_kv = max(peak_kv, kv_used)
                if finished_split >= 0:
                    if decode_steps[finished_split]:
                        push(heap, (step + decode_steps[finished_split]) * n + finished_split)
                        context += footprint[finished_split] - decode_steps[finished_split]
                    else:
                        kv_used -= footprint[finished_split]
                        zero_done += 1
                for index in range(first, head - (split >= first)):
                    if decode_steps[index]:
                        push(heap, (step + decode_steps[index]) * n + index)
                        context += footprint[index] - decode_steps[index]
                    else:
                        kv_used -= footprint[index]
                        zero_done += 1
            # Requests admitted in this step decode from the next one: the heap is not read
            # before then, so they were pushed above, before the step's time is tallied.
            attention = pairs * pair_ms
            elapsed = extend_ms[tokens] + attention
            extend_counts[tokens] += 1
            extend_elapsed[tokens] += elapsed
            extend_attention[tokens] += attention
            if log is not None:
                log.add(1, tokens, 1, clock, elapsed, pairs)
            clock += elapsed
            if head > first:
                admitted_end(clock)  # the first token of every whole prompt admitted here
            if finished_split >= 0:
                t.split_first.append((finished_split, clock))
            if zero_done:
                while zero_done and releasing < n:
                    arrival_ms[releasing] = clock
                    if releasing == split_request:
                        split_ms = clock
                    releasing += 1
                    zero_done -= 1
                zero_done = 0
            continue
        if not heap:
            if arrival_ms[arrived] >= alone_ms:  # idle until a later request
                alone_ms = math.nan
                split_ms, progress, stop = go_alone(
                    alone, arrival_ms, footprint, split_ms, progress, stop)
            if arrived >= n or arrival_ms[arrived] == NEVER_MS:
                break
            clock = max(clock, arrival_ms[arrived])
            continue
        # ---- decode: every running request, until the next completion or admissible arrival
        batch = len(heap)
        finish = heap[0] // n
        run = finish - step
        first_ms = decode_ms[batch] + kv_ms * context
        growth_ms = kv_ms * batch
        elapsed = run * first_ms + growth_ms * run * (run - 1) / 2
        if clock + elapsed >= alone_ms:  # the run would reach a later request's arrival
            alone_ms = math.nan
            split_ms, progress, stop = go_alone(
                alone, arrival_ms, footprint, split_ms, progress, stop)
        # The held-out split ends a run as an admissible arrival does, so the fit part never
        # holds steps after it, whether or not the request arriving then fits (issue 34).
        coming = split_ms
        if head == arrived and batch < max_running and kv_used + footprint[head] <= kv_capacity:
            if arrival_ms[head] < coming:  # noqa: PLR1730 - no call: hot
                coming = arrival_ms[head]
        if clock + elapsed >= coming:  # the arrival or the split comes first (or with the completion)
            # Steps until it: the smallest j with clock + j*first + growth*j*(j-1)/2 >= coming.
            wait = coming - clock
            b = first_ms - growth_ms / 2  # > 0: a request holds at least one token
            root = 2 * wait / (sqrt(b * b + 2 * growth_ms * wait) + b)  # no cancellation
            until = ceil(root)
            if not 1e-6 < until - root < 0.999999 or until < 1:
                # A step ends at (or a rounding error from) the arrival: settle the tie with
                # the same sums the clock will take, so that it goes as the clock says.
                until = until if until > 1 else 1  # noqa: FURB136 - no call: hot
                if until > 1 and clock + (until - 1) * first_ms + growth_ms * (until - 1) * (
                    until - 2
                ) / 2 >= coming:
                    until -= 1
                elif clock + until * first_ms + growth_ms * until * (until - 1) / 2 < coming:
                    until += 1
            if until < run:
                run = until
                elapsed = run * first_ms + growth_ms * run * (run - 1) / 2
        decode_counts[batch] += run
        decode_elapsed[batch] += elapsed
        decode_context[batch] += run * context + batch * run * (run - 1) // 2
        if log is not None:
            log.add(0, batch, run, clock, elapsed, context)
        context += batch * run
        clock += elapsed
        step += run
        if step == finish:
            below = (step + 1) * n  # keys of the requests finishing at this step
            while heap and heap[0] < below:
                index = pop(heap) % n
                held = footprint[index]
                kv_used -= held
                context -= held
                finish_ms[index] = clock
                if releasing < n:
                    arrival_ms[releasing] = clock
                    if releasing == split_request:
                        split_ms = clock
                    releasing += 1
    t.clock_ms, t.peak_kv, t.head, t.split = clock, peak_kv, head, split
    t.steps = sum(decode_counts) + sum(extend_counts)
    return t


def simulate(
    arrival_s: np.ndarray,
    input_len: np.ndarray,
    output_len: np.ndarray,
    cached_len: np.ndarray | None,
    *,
    cost: StepCost,
    max_running_requests: int,
    chunked_prefill_size: int,
    kv_capacity_tokens: int,
    context_len: int | None = None,
    progress: Callable[[float], None] | None = None,
    stop: Callable[[], bool] | None = None,
    split_s: float | None = None,
    concurrency: int | None = None,
    split_request: int | None = None,
    log_steps: bool = False,
    alone_first: int | None = None,
    drop_whole: DropWhole | None = None,
) -> SimulationResult:
    """Replay requests (seconds, tokens) through the scheduler; see the module docstring.

    Times in the result count from the first arrival (`origin_s`, in the clock of
    `arrival_s`), so only differences between arrivals matter. `stop` is polled every
    POLL_EVERY_REQUESTS admitted requests; when it returns True the run ends there and the
    result covers the steps simulated so far (`completed_fraction` < 1). With `split_s` (in the
    clock of `arrival_s`), the steps taken before the clock reaches it are also tallied apart
    (`before_split`): no request arriving at or after `split_s` can be in them. With a
    `concurrency`, `arrival_s` is not read, and `split_request` (the position of the first
    held-out request among those kept) places the split where that request arrives.
    `log_steps` keeps every step in `steps_log`. With `alone_first` k, `alone` also holds the
    run of the first k requests given, served by themselves (no split, no log): the same as
    simulating them apart, the steps before the (k+1)-th arrival simulated once
    (cgtool.planner.sim_alone) when arrivals come in order. With `drop_whole`, a run forked
    for them stops early once the flag is raised (completed_fraction < 1, `alone` whole)."""
    limit = min(kv_capacity_tokens, context_len or kv_capacity_tokens)
    kept = prepare(arrival_s, input_len, output_len, cached_len, limit, concurrency)
    if len(cost.decode_ms) <= max_running_requests or len(cost.extend_ms) <= chunked_prefill_size:
        raise ValueError("cost tables are shorter than the limits they must cover")
    split_ms, release_split = math.inf, -1
    if split_s is not None:
        split_ms = (split_s - kept.origin_s) * 1e3
    elif concurrency is not None and split_request is not None:
        release_split = split_request
        if split_request < concurrency:  # it arrives with the first requests: nothing before
            split_ms = 0.0
    log = StepLog() if log_steps else None
    alone = None if alone_first is None else alone_fork(
        kept, alone_first, arrival_s, split_ms, concurrency is None and log is None, drop_whole)
    collecting = gc.isenabled()
    gc.disable()  # the loop allocates no cycles; collections would only rescan its big lists
    try:
        tallies = _run(
            kept.requests, cost, max_running_requests, chunked_prefill_size, kv_capacity_tokens,
            progress, stop, split_ms, concurrency, release_split, log, alone,
        )
    except BaseException as exc:
        if alone is not None and alone.in_child:
            alone.send_and_exit(exc)
        if alone is not None:
            alone.discard()
        raise
    finally:
        if collecting:
            gc.enable()
    if alone is not None and alone.in_child:
        alone.finish_child(tallies, kept)  # exits
    if progress is not None:
        progress(1.0)
    split = split_s is not None or split_request is not None
    result = build_result(tallies, kept, split, log)
    if alone_first is None:
        return result
    if result.completed_fraction < 1.0:
        if alone is not None and alone.dropped():  # only the first requests' run is read
            return replace(result, alone=alone.receive())
        if alone is not None:  # stopped: the plan ends here
            alone.discard()
        return result
    first = None if alone is None else alone.receive()
    if first is None:  # no fork: simulated apart
        server = {"cost": cost, "max_running_requests": max_running_requests,
                  "chunked_prefill_size": chunked_prefill_size,
                  "kv_capacity_tokens": kv_capacity_tokens, "context_len": context_len,
                  "concurrency": concurrency}
        arrays = (arrival_s, input_len, output_len, cached_len)
        first = simulate(*(None if a is None else np.asarray(a)[:alone_first] for a in arrays),
                         **server)
    return replace(result, alone=first)
