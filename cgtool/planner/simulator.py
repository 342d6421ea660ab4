"""Continuous batching as SGLang schedules it, to learn which batch sizes a trace produces.

Arrivals queue first come, first served. Each step is either an extend batch (queued prompts
minus their cached prefix, at most `chunked_prefill_size` tokens, a long prompt split across
steps) or a decode batch of every running request; waiting prompts go first, as in SGLang.
A request is admitted while fewer than `max_running_requests` run and the KV pool can hold its
prompt and its whole output (reserving the output up front means no request is ever retracted).
The prefill yields the first output token; each decode step one more.

Between an arrival and a completion the decode batch does not change, so a whole run of
identical decode steps is taken at once: its time is an arithmetic series, because each step
reads `batch` more context tokens than the one before.
"""

from __future__ import annotations

import gc
import heapq
import math
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cgtool.errors import InputError
from cgtool.planner.sim_result import RunTallies, SimulationResult, build_result


@dataclass(frozen=True, eq=False)
class StepCost:
    """What one step takes under a given capture schedule."""

    decode_ms: np.ndarray  # [max_running + 1] dense ms of a decode step of b requests
    extend_ms: np.ndarray  # [chunked_prefill_size + 1] dense ms of an extend step of n tokens
    kv_read_ms_per_token: float  # decode attention, per context token
    attention_ms_per_pair: float  # extend attention, per (query, key) token pair


@dataclass(slots=True)
class _Requests:
    arrival_ms: list[float]
    prompt: list[int]  # input_len
    new: list[int]  # prompt tokens to compute (input minus cached)
    cached: list[int]
    decode_steps: list[int]  # output tokens after the first
    footprint: list[int]  # KV tokens reserved from admission to finish
    cum_new: list[int]  # prefix sums, so a run of requests is admitted at once
    cum_footprint: list[int]
    cum_pairs: list[float]


def _prepare(
    arrival_s, input_len, output_len, cached_len, limit_tokens: int
) -> tuple[_Requests, int, np.ndarray]:
    arrival = np.asarray(arrival_s, dtype=np.float64)
    prompt = np.asarray(input_len, dtype=np.int64)
    output = np.asarray(output_len, dtype=np.int64)
    cached = np.zeros_like(prompt) if cached_len is None else np.asarray(cached_len, dtype=np.int64)
    if not (len(arrival) == len(prompt) == len(output) == len(cached)):
        raise InputError(
            "request arrays differ in length", "Pass one value per request in each array."
        )
    decode_steps = np.maximum(output - 1, 0)
    footprint = prompt + decode_steps + 1
    keep = (footprint <= limit_tokens) & (prompt >= 1)
    order = np.argsort(arrival[keep], kind="stable")
    arrival, prompt, cached, decode_steps, footprint = (
        a[keep][order] for a in (arrival, prompt, cached, decode_steps, footprint)
    )
    cached = np.clip(cached, 0, prompt - 1)  # the last prompt token is always computed
    new = prompt - cached
    pairs = new * cached + new * (new + 1) / 2.0  # causal attention over prefix and chunk
    requests = _Requests(
        (arrival * 1e3).tolist(),
        prompt.tolist(),
        new.tolist(),
        cached.tolist(),
        decode_steps.tolist(),
        footprint.tolist(),
        np.concatenate([[0], np.cumsum(new)]).tolist(),
        np.concatenate([[0], np.cumsum(footprint)]).tolist(),
        np.concatenate([[0.0], np.cumsum(pairs)]).tolist(),
    )
    return requests, int((~keep).sum()), arrival


def _run(
    reqs: _Requests,
    cost: StepCost,
    max_running: int,
    chunk: int,
    kv_capacity: int,
    progress: Callable[[float], None] | None,
    stop: Callable[[], bool] | None = None,
    split_ms: float = math.inf,
) -> RunTallies:
    # One flat loop over local variables: it runs once per arrival and once per completion
    # (millions of times for a large trace), and attribute lookups or method calls would
    # double its time.
    n, arrival_ms, prompt, new, cached = (
        len(reqs.arrival_ms),
        reqs.arrival_ms,
        reqs.prompt,
        reqs.new,
        reqs.cached,
    )
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
        [],
        [],
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
    admitted_upto, admitted_at, sqrt, ceil = t.admitted_upto, t.admitted_at_ms, math.sqrt, math.ceil
    heap: list[int] = []  # finish step * n + request, for decoding requests
    push, pop = heapq.heappush, heapq.heappop
    clock = 0.0
    head = arrived = 0  # the queue is requests [head, arrived)
    split, split_done = -1, 0  # a prompt spread over several extend steps
    running = kv_used = step = context_base = loops = steps = peak_kv = 0
    # decode context = context_base + len(heap) * step
    while head < n or split >= 0 or heap:
        loops += 1
        if clock >= split_ms:
            split_ms = math.inf  # once: the tallies so far are the fit part
            t.before_split = (
                decode_counts[:], decode_elapsed[:], decode_context[:],
                extend_counts[:], extend_elapsed[:], extend_attention[:],
            )
        if not loops % 65536:
            if progress is not None:
                progress(head / n)
            if stop is not None and stop():
                break
        if arrived < n and arrival_ms[arrived] <= clock:
            arrived = bisect_right(arrival_ms, clock, arrived)
        if split >= 0 or (
            head < arrived and running < max_running and kv_used + footprint[head] <= kv_capacity
        ):
            # ---- extend: the split prompt first, then whole queued prompts, then a new split
            tokens, pairs, finished_split, first = 0, 0.0, -1, head
            if split >= 0:
                tokens = min(new[split] - split_done, chunk)
                pairs = tokens * (cached[split] + split_done) + tokens * (tokens + 1) / 2.0
                split_done += tokens
                if split_done == new[split]:
                    finished_split, split = split, -1
            budget = chunk - tokens
            if split < 0 and budget > 0 and head < arrived:
                if arrived - head == 1:  # the usual case at moderate load: no search needed
                    whole_fits = (
                        new[head] <= budget
                        and running < max_running
                        and kv_used + footprint[head] <= kv_capacity
                    )
                    last = head + 1 if whole_fits else head
                else:
                    last = min(
                        bisect_right(
                            cum_footprint, cum_footprint[head] + kv_capacity - kv_used, head
                        )
                        - 1,
                        bisect_right(cum_new, cum_new[head] + budget, head) - 1,
                        head + max_running - running,
                        arrived,
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
                    pairs += budget * cached[head] + budget * (budget + 1) / 2.0
                    split, split_done = head, budget
                    kv_used += footprint[head]
                    running += 1
                    head += 1
            if head > first:
                admitted_upto.append(head)
                admitted_at.append(clock)
            attention = pairs * pair_ms
            elapsed = extend_ms[tokens] + attention
            extend_counts[tokens] += 1
            extend_elapsed[tokens] += elapsed
            extend_attention[tokens] += attention
            clock += elapsed
            steps += 1
            peak_kv = max(peak_kv, kv_used)
            if finished_split >= 0:
                if decode_steps[finished_split]:
                    push(heap, (step + decode_steps[finished_split]) * n + finished_split)
                    context_base += prompt[finished_split] + 1 - step
                else:
                    running -= 1
                    kv_used -= footprint[finished_split]
            for index in range(first, head - (split >= first)):
                if decode_steps[index]:
                    push(heap, (step + decode_steps[index]) * n + index)
                    context_base += prompt[index] + 1 - step
                else:
                    running -= 1
                    kv_used -= footprint[index]
            continue
        if not heap:
            if arrived >= n:
                break
            clock = max(clock, arrival_ms[arrived])
            continue
        # ---- decode: every running request, until the next completion or admissible arrival
        batch = len(heap)
        run = heap[0] // n - step
        context0 = context_base + batch * step
        first_ms = decode_ms[batch] + kv_ms * context0
        growth_ms = kv_ms * batch
        if (
            head == arrived < n
            and running < max_running
            and kv_used + footprint[head] <= kv_capacity
        ):
            # Steps until the arrival: the smallest j with j*first + growth*j*(j-1)/2 >= wait.
            wait = arrival_ms[head] - clock
            b = first_ms - growth_ms / 2
            until = (
                ceil((sqrt(b * b + 2 * growth_ms * wait) - b) / growth_ms - 1e-9)
                if growth_ms > 0
                else ceil(wait / first_ms)
            )
            if until < run:
                run = max(until, 1)
        elapsed = run * first_ms + growth_ms * run * (run - 1) / 2
        decode_counts[batch] += run
        decode_elapsed[batch] += elapsed
        decode_context[batch] += run * context0 + batch * run * (run - 1) // 2
        clock += elapsed
        step += run
        steps += run
        while heap and heap[0] // n <= step:
            key = pop(heap)
            index = key % n
            context_base -= prompt[index] + 1 - (key // n - decode_steps[index])
            running -= 1
            kv_used -= footprint[index]
    t.clock_ms, t.steps, t.peak_kv, t.head = clock, steps, peak_kv, head
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
) -> SimulationResult:
    """Replay requests (seconds, tokens) through the scheduler; see the module docstring.

    `stop` is polled every 65,536 loop turns; when it returns True the run ends there and the
    result covers the steps simulated so far (`completed_fraction` < 1). With `split_s`, the
    steps taken before the clock reaches it are also tallied apart (`before_split`): no request
    arriving at or after `split_s` can be in them."""
    limit = min(kv_capacity_tokens, context_len or kv_capacity_tokens)
    reqs, dropped, arrival = _prepare(arrival_s, input_len, output_len, cached_len, limit)
    if len(cost.decode_ms) <= max_running_requests or len(cost.extend_ms) <= chunked_prefill_size:
        raise ValueError("cost tables are shorter than the limits they must cover")
    collecting = gc.isenabled()
    gc.disable()  # the loop allocates no cycles; collections would only rescan its big lists
    try:
        tallies = _run(
            reqs, cost, max_running_requests, chunked_prefill_size, kv_capacity_tokens, progress,
            stop, math.inf if split_s is None else split_s * 1e3,
        )
    finally:
        if collecting:
            gc.enable()
    if progress is not None:
        progress(1.0)
    return build_result(tallies, arrival, reqs.footprint, dropped, split_s)
