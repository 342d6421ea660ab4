import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cgtool.planner.simulator import StepCost, simulate


def flat_cost(decode_ms=1.0, extend_ms=10.0, kv_ms=0.0, pair_ms=0.0, max_bs=8, chunk=1000):
    return StepCost(np.full(max_bs + 1, decode_ms), np.full(chunk + 1, extend_ms), kv_ms, pair_ms)


def run(
    arrival, inp, out, cached=None, *, cost=None, max_running=8, chunk=1000, kv=10_000, context=None
):
    cost = cost or flat_cost(max_bs=max_running, chunk=chunk)
    return simulate(
        np.array(arrival, float),
        np.array(inp),
        np.array(out),
        None if cached is None else np.array(cached),
        cost=cost,
        max_running_requests=max_running,
        chunked_prefill_size=chunk,
        kv_capacity_tokens=kv,
        context_len=context,
    )


def nonzero(counts):
    return {int(i): int(c) for i, c in enumerate(counts) if c}


def test_one_request_is_one_extend_then_output_minus_one_decode_steps():
    result = run([0.0], [100], [5])
    assert nonzero(result.extend_counts) == {100: 1}
    assert nonzero(result.decode_counts) == {1: 4}
    assert result.duration_s == pytest.approx((10 + 4 * 1) / 1e3)
    assert result.steps == 5 and result.mean_queue_s == 0


def test_requests_arriving_together_share_an_extend_and_decode_together():
    result = run([0.0, 0.0], [100, 60], [3, 5])
    assert nonzero(result.extend_counts) == {160: 1}
    assert nonzero(result.decode_counts) == {2: 2, 1: 2}


def test_a_long_prompt_is_chunked_at_the_prefill_budget():
    result = run([0.0], [250], [2], chunk=100)
    assert nonzero(result.extend_counts) == {100: 2, 50: 1}
    assert nonzero(result.decode_counts) == {1: 1}


def test_a_split_prompt_finishes_before_the_next_prompt_fills_the_rest_of_the_step():
    result = run([0.0, 0.0], [150, 30], [2, 2], chunk=100)
    assert nonzero(result.extend_counts) == {100: 1, 80: 1}
    assert nonzero(result.decode_counts) == {2: 1}


def test_cached_prefix_is_not_computed_again():
    result = run([0.0], [1000], [2], [900])
    assert nonzero(result.extend_counts) == {100: 1}


def test_max_running_requests_makes_the_second_request_wait():
    result = run([0.0, 0.0], [10, 10], [3, 3], max_running=1)
    assert nonzero(result.extend_counts) == {10: 2}
    assert nonzero(result.decode_counts) == {1: 4}
    # B waits for A's extend (10 ms) and two decode steps (2 ms)
    assert result.mean_queue_s == pytest.approx(12 / 1e3 / 2)


def test_kv_pool_admits_only_what_it_can_hold_to_the_end():
    # each request reserves its prompt and output, 105 tokens; a 150-token pool holds one
    result = run([0.0, 0.0], [100, 100], [5, 5], kv=150)
    assert nonzero(result.decode_counts) == {1: 8}
    assert result.peak_kv_demand_tokens == 105


def test_an_arrival_during_decode_is_prefilled_at_the_next_step_boundary():
    result = run([0.0, 0.0155], [10, 10], [100, 3])
    # A's extend ends at 10 ms; six 1 ms decode steps reach 16 ms > 15.5 ms
    assert result.decode_counts[1] >= 6
    assert nonzero(result.extend_counts) == {10: 2}
    assert result.decode_counts[2] == 2
    assert result.mean_queue_s == pytest.approx((16 - 15.5) / 1e3 / 2)


def test_decode_time_grows_with_the_context_read():
    cost = flat_cost(kv_ms=0.01)
    result = run([0.0], [100], [3], cost=cost)
    # two decode steps reading contexts of 101 and 102 tokens
    assert result.decode_context_tokens[1] == 203
    assert result.decode_time_s[1] == pytest.approx((2 * 1.0 + 0.01 * 203) / 1e3)


def test_requests_over_the_context_or_the_pool_are_dropped():
    result = run([0.0, 0.0, 0.0], [100, 5000, 100], [10, 10, 20_000], context=4096, kv=10_000)
    assert result.num_requests == 3 and result.dropped_requests == 2
    assert nonzero(result.extend_counts) == {100: 1}


def test_idle_time_between_requests_is_skipped():
    result = run([0.0, 100.0], [10, 10], [2, 2])
    assert result.duration_s == pytest.approx(100 + 11 / 1e3)
    assert result.steps == 4


def test_mismatched_array_lengths_are_refused():
    with pytest.raises(Exception, match="differ in length"):
        run([0.0, 1.0], [10], [2])


# ---- the event-driven simulator against a plain one-step-at-a-time reference


def reference(arrival, inp, out, max_running, chunk, kv_capacity, cost, concurrency=None,
              times=None):
    """The same policy, one step per loop turn, no prefix sums and no skipped runs; the clock
    starts at the first arrival, as the simulator's does. With a concurrency, the first N
    requests arrive at 0 and each later one (in the order given) when a request finishes.
    `times`, a dict, receives each request's (first token ms, finish ms)."""
    n = len(arrival)
    if concurrency is None:
        arrival_ms = [(a - min(arrival)) * 1e3 for a in arrival]
    else:
        arrival_ms = [0.0 if i < concurrency else math.inf for i in range(n)]
    released = min(concurrency or n, n)
    order = sorted(range(n), key=lambda i: arrival_ms[i])
    queue, running, clock_ms, split = list(order), {}, 0.0, None  # running: index -> [context, left]
    decode, extend, kv_used = {}, {}, 0
    times = {} if times is None else times

    def finished(index):
        nonlocal released
        times[index] = (times[index][0], clock_ms)
        if released < n:
            arrival_ms[released] = clock_ms
            released += 1

    while queue or running or split:
        ready = [i for i in queue if arrival_ms[i] <= clock_ms]
        done: list[int] = []

        def fits(i, split, kv_used, done=done):
            active = len(running) + len(done) + (split is not None)
            return active < max_running and kv_used + inp[i] + max(out[i] - 1, 0) + 1 <= kv_capacity

        if split is not None or (ready and fits(ready[0], split, kv_used)):
            budget, tokens = chunk, 0
            if split is not None:
                index, left = split
                take = min(left, budget)
                tokens, budget = take, budget - take
                split = (index, left - take) if left > take else None
                if split is None:
                    done.append(index)
            while split is None and budget > 0 and ready and fits(ready[0], split, kv_used):
                index = ready.pop(0)
                queue.remove(index)
                kv_used += inp[index] + max(out[index] - 1, 0) + 1
                take = min(inp[index], budget)
                tokens, budget = tokens + take, budget - take
                if take < inp[index]:
                    split = (index, inp[index] - take)
                else:
                    done.append(index)
            extend[tokens] = extend.get(tokens, 0) + 1
            clock_ms += cost.extend_ms[tokens]
            for index in done:
                running[index] = [inp[index] + 1, max(out[index] - 1, 0)]
                times[index] = (clock_ms, None)
            for index in [i for i, (_, left) in running.items() if left == 0]:
                kv_used -= inp[index] + 1
                del running[index]
                finished(index)
            continue
        if not running:
            clock_ms = max(clock_ms, arrival_ms[queue[0]])
            continue
        batch = len(running)
        decode[batch] = decode.get(batch, 0) + 1
        clock_ms += cost.decode_ms[batch] + cost.kv_read_ms_per_token * sum(
            c for c, _ in running.values()
        )
        for index in list(running):
            running[index][0] += 1
            running[index][1] -= 1
            if running[index][1] == 0:
                kv_used -= inp[index] + max(out[index] - 1, 0) + 1
                del running[index]
                finished(index)
    return decode, extend, clock_ms


requests = st.lists(
    st.tuples(st.floats(0, 0.2), st.integers(1, 300), st.integers(1, 40)), min_size=1, max_size=25
)


def binary_cost(max_running, chunk):
    """Step times that are whole multiples of 2**-10 ms: every sum either side takes is exact,
    so the skipping simulator and the one-step reference read the same clock, ties included."""
    return StepCost(
        1.0 + 0.125 * np.arange(max_running + 1), 5.0 + 2.0**-6 * np.arange(chunk + 1), 2.0**-10, 0.0
    )


@settings(max_examples=150, deadline=None)
@given(requests, st.integers(1, 6), st.sampled_from([64, 128, 512]), st.integers(350, 3000))
# Found by chance once (issue 34): with step times of 1.0 + 0.1 b the reference's clock read
# 19.999999999999996 ms against an arrival at 20.0 ms.
@example(reqs=[(0.0, 128, 6), (0.02, 1, 2), (0.00390625, 242, 5)], max_running=2, chunk=512,
         kv_capacity=381)
def test_event_skipping_matches_stepping_one_at_a_time(reqs, max_running, chunk, kv_capacity):
    arrival, inp, out = (list(column) for column in zip(*reqs))
    cost = binary_cost(max_running, chunk)
    times: dict = {}
    decode, extend, clock_ms = reference(
        arrival, inp, out, max_running, chunk, kv_capacity, cost, times=times
    )
    result = simulate(
        np.array(arrival),
        np.array(inp),
        np.array(out),
        None,
        cost=cost,
        max_running_requests=max_running,
        chunked_prefill_size=chunk,
        kv_capacity_tokens=kv_capacity,
    )
    assert nonzero(result.decode_counts) == decode
    assert nonzero(result.extend_counts) == extend
    assert result.duration_s * 1e3 == pytest.approx(clock_ms, rel=1e-12)
    assert_times_match(result, times)


def assert_times_match(result, times):
    """Every request's first token and finish, as the reference's clock read them."""
    r = result.requests
    for i, first_s, finish_s in zip(r.index.tolist(), r.first_token_s, r.finish_s):
        assert (first_s * 1e3, finish_s * 1e3) == pytest.approx(times[i], rel=1e-12, abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(requests, st.integers(1, 6), st.sampled_from([64, 512]), st.integers(350, 3000),
       st.integers(1, 8))
def test_a_closed_loop_client_matches_stepping_one_at_a_time(
    reqs, max_running, chunk, kv_capacity, concurrency
):
    """With N in flight, a request arrives exactly when one finishes: the same steps, the same
    first tokens and finishes as the reference's."""
    _, inp, out = (list(column) for column in zip(*reqs))
    cost = binary_cost(max_running, chunk)
    times: dict = {}
    decode, extend, clock_ms = reference(
        [0.0] * len(inp), inp, out, max_running, chunk, kv_capacity, cost, concurrency, times
    )
    result = simulate(
        np.zeros(len(inp)), np.array(inp), np.array(out), None, cost=cost,
        max_running_requests=max_running, chunked_prefill_size=chunk,
        kv_capacity_tokens=kv_capacity, concurrency=concurrency,
    )
    assert nonzero(result.decode_counts) == decode
    assert nonzero(result.extend_counts) == extend
    assert result.duration_s * 1e3 == pytest.approx(clock_ms, rel=1e-12)
    assert_times_match(result, times)
    # Never more requests sent than finished plus N.
    sent = np.sort(result.requests.arrival_s)
    finished = np.sort(result.requests.finish_s)
    later = max(len(sent) - concurrency, 0)
    assert np.array_equal(sent[len(sent) - later :], finished[:later])


def _many_requests(n: int = 200_000):
    rng = np.random.default_rng(3)
    return np.cumsum(rng.exponential(0.01, n)), rng.integers(10, 200, n), rng.integers(1, 50, n)


def test_stop_ends_the_run_early_and_says_how_far_it_got():
    arrival, inp, out = _many_requests()
    kwargs = {"cost": flat_cost(max_bs=64, chunk=4096), "max_running_requests": 64,
                  "chunked_prefill_size": 4096, "kv_capacity_tokens": 1_000_000}
    full = simulate(arrival, inp, out, None, **kwargs)
    polls = []
    stopped = simulate(arrival, inp, out, None, stop=lambda: polls.append(1) or len(polls) >= 2, **kwargs)
    assert full.completed_fraction == 1.0
    assert 0.0 < stopped.completed_fraction < 1.0
    assert 0 < stopped.steps < full.steps
    assert stopped.decode_counts.sum() < full.decode_counts.sum()
    assert np.isfinite(stopped.mean_queue_s)


def test_a_stop_that_never_fires_changes_nothing():
    arrival, inp, out = _many_requests(50_000)
    kwargs = {"cost": flat_cost(max_bs=64, chunk=4096), "max_running_requests": 64,
                  "chunked_prefill_size": 4096, "kv_capacity_tokens": 1_000_000}
    plain = simulate(arrival, inp, out, None, **kwargs)
    polled = simulate(arrival, inp, out, None, stop=lambda: False, **kwargs)
    assert polled.steps == plain.steps and polled.duration_s == plain.duration_s
    assert np.array_equal(polled.decode_counts, plain.decode_counts)


def split_run(arrival, inp, out, split_s):
    return simulate(
        np.array(arrival, float),
        np.array(inp),
        np.array(out),
        None,
        cost=flat_cost(),
        max_running_requests=8,
        chunked_prefill_size=1000,
        kv_capacity_tokens=10_000,
        split_s=split_s,
    )


def test_steps_before_the_split_are_those_of_the_earlier_requests_alone():
    # Two requests long done before a third arrives at t=100 s.
    both = split_run([0, 0, 100], [50, 60, 70], [5, 5, 9], split_s=100.0)
    early = run([0, 0], [50, 60], [5, 5])
    fit, held = both.split_tallies()
    assert nonzero(fit.decode_counts) == nonzero(early.decode_counts)
    assert nonzero(fit.extend_counts) == nonzero(early.extend_counts)
    assert nonzero(held.decode_counts) == {1: 8} and nonzero(held.extend_counts) == {70: 1}


def test_the_two_parts_add_up_to_the_whole_run():
    rng = np.random.default_rng(0)
    n = 400
    arrival = np.sort(rng.uniform(0, 20, n))
    result = split_run(arrival, rng.integers(5, 300, n), rng.integers(1, 50, n), float(arrival[280]))
    fit, held = result.split_tallies()
    assert fit.steps + held.steps == result.steps
    assert fit.steps > 0 and held.steps > 0
    assert np.all(held.decode_counts >= 0) and np.all(held.extend_counts >= 0)


def test_without_a_split_every_step_is_in_the_fit_part():
    result = run([0, 1], [50, 60], [5, 5])
    fit, held = result.split_tallies()
    assert fit.steps == result.steps and held.steps == 0


def test_the_typical_request_length_counts_only_requests_kept():
    result = run([0, 1, 2], [100, 100, 10**6], [10, 10, 10], kv=5000)
    assert result.dropped_requests == 1
    assert result.typical_request_tokens == 110


def _fields(result):
    return {
        name: value.tolist() if isinstance(value, np.ndarray) else value
        for name, value in vars(result).items()
        if name not in ("before_split", "requests")
    }


def test_the_order_requests_are_given_in_does_not_change_the_result():
    rng = np.random.default_rng(7)
    n = 3000
    arrival = np.cumsum(rng.exponential(0.05, n))
    inp, out = rng.integers(1, 1500, n), rng.integers(0, 200, n)
    inp[::50] = 9000  # longer than the pool: dropped
    shuffle = rng.permutation(n)
    kwargs = {"cost": flat_cost(max_bs=16, chunk=512, kv_ms=1e-4), "max_running": 16,
              "chunk": 512, "kv": 8000}
    in_order = run(arrival, inp, out, **kwargs)
    shuffled = run(arrival[shuffle], inp[shuffle], out[shuffle], **kwargs)
    assert in_order.dropped_requests == n // 50
    assert _fields(shuffled) == _fields(in_order)
    a, b = in_order.requests, shuffled.requests
    assert np.array_equal(shuffle[b.index], a.index)  # each names its place in the arrays given
    assert np.array_equal(b.first_token_s, a.first_token_s, equal_nan=True)
    assert np.array_equal(b.finish_s, a.finish_s)


def test_queue_delay_is_the_wait_from_arrival_to_admission():
    # One request at a time: the second waits for the first (10 ms prefill, 4 decode steps).
    result = run([0.0, 0.001], [100, 100], [5, 5], max_running=1)
    assert result.mean_queue_s == pytest.approx((0.0 + (0.014 - 0.001)) / 2)


def test_the_step_log_expands_to_every_step_timed_as_the_run_took_it():
    rng = np.random.default_rng(5)
    n = 200
    arrival = np.cumsum(rng.exponential(0.02, n))
    cost = flat_cost(max_bs=16, chunk=512, kv_ms=1e-4)
    result = simulate(arrival, rng.integers(5, 900, n), rng.integers(1, 60, n), None, cost=cost,
                      max_running_requests=16, chunked_prefill_size=512,
                      kv_capacity_tokens=20_000, log_steps=True)
    steps = result.steps_log.expand(cost)
    assert len(steps["kind"]) == result.steps
    busy_ms = (result.decode_time_s.sum() + result.extend_time_s.sum()) * 1e3
    assert steps["elapsed_ms"].sum() == pytest.approx(busy_ms)
    ends = steps["start_ms"] + steps["elapsed_ms"]
    assert np.all(steps["start_ms"][1:] >= ends[:-1] - 1e-9)  # one step at a time, idle between
    assert ends[-1] == pytest.approx(result.duration_s * 1e3)
    decode = steps["kind"] == 0
    assert np.bincount(steps["size"][decode], minlength=17).tolist() == result.decode_counts.tolist()
    # Every request's first token comes at the end of some extend step.
    extend_ends = set(np.round(ends[~decode], 9))
    assert all(round(t * 1e3, 9) in extend_ends for t in result.requests.first_token_s)
