import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cgtool.planner import sim_alone, simulator
from cgtool.planner.simulator import StepCost, simulate


@pytest.fixture(autouse=True)
def fork_small_traces(monkeypatch):
    monkeypatch.setattr(sim_alone, "FORK_MIN_REQUESTS", 1)


def assert_same(a, b):
    """Every field equal to the bit (NaN where NaN), the nested request times included."""
    for name in a.__dataclass_fields__:
        if name == "alone":
            continue
        x, y = getattr(a, name), getattr(b, name)
        if hasattr(x, "__dataclass_fields__"):
            assert_same(x, y)
        elif isinstance(x, np.ndarray):
            assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), name
        else:
            assert x == y or (np.isnan(x) and np.isnan(y)), name


def trace(n, seed, rate):
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1 / rate, n))
    inp = rng.integers(1, 3000, n)
    inp[::97] = 50_000  # longer than the pool: dropped
    return arrival, inp, rng.integers(1, 300, n), (inp * rng.uniform(0, 0.5, n)).astype(int)


def cost(max_bs=32, chunk=2048):
    # No step time is a short binary fraction: a decode run cut in two at an arrival ends a
    # rounding error away from the same run taken whole, which the comparisons below see.
    return StepCost(2.0 + 0.0731 * np.arange(max_bs + 1), 5.0 + 0.0113 * np.arange(chunk + 1),
                    3.3e-5, 1.7e-7)


def server(kv):
    return {"cost": cost(), "max_running_requests": 32, "chunked_prefill_size": 2048,
            "kv_capacity_tokens": kv}


@pytest.mark.parametrize("rate", [5.0, 40.0])  # an idle server, and a queue that keeps growing
@pytest.mark.parametrize("kv", [200_000, 20_000])  # room for every batch, and a full pool
@pytest.mark.parametrize("split", [False, True])
def test_the_first_requests_alone_are_their_run_apart_and_the_whole_run_is_unchanged(
    rate, kv, split
):
    arrival, inp, out, cached = trace(3000, 1, rate)
    k = 2100
    split_s = float(arrival[k]) if split else None
    both = simulate(arrival, inp, out, cached, **server(kv), split_s=split_s, alone_first=k)
    apart = simulate(arrival[:k], inp[:k], out[:k], cached[:k], **server(kv))
    assert_same(both.alone, apart)
    assert_same(both, simulate(arrival, inp, out, cached, **server(kv), split_s=split_s))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 600), st.integers(1, 30)),
                min_size=2, max_size=40), st.integers(1, 39), st.integers(700, 4000))
def test_arrivals_that_tie_with_a_step_end_part_the_runs_at_the_same_step(reqs, k, kv):
    # Arrivals on a 1 ms grid and step times in whole ms: steps end exactly on arrivals.
    reqs = sorted(reqs)
    k = min(k, len(reqs) - 1)
    arrival, inp, out = (np.array(column) for column in zip(*reqs))
    arrival = arrival / 1e3
    limits = {"cost": StepCost(np.arange(5.0) + 1, np.full(257, 3.0), 0.0, 0.0),
              "max_running_requests": 4, "chunked_prefill_size": 256, "kv_capacity_tokens": kv}
    both = simulate(arrival, inp, out, None, **limits, alone_first=k)
    assert_same(both.alone, simulate(arrival[:k], inp[:k], out[:k], None, **limits))


@pytest.mark.parametrize("kv", [200_000, 20_000])
def test_the_runs_part_at_the_same_step_wherever_the_first_requests_end(kv):
    arrival, inp, out, cached = trace(1200, 4, 8.0)
    for k in range(800, 1100, 10):
        both = simulate(arrival, inp, out, cached, **server(kv), alone_first=k)
        assert_same(both.alone, simulate(arrival[:k], inp[:k], out[:k], cached[:k], **server(kv)))


def test_the_run_forks_once_where_arrivals_come_in_order(monkeypatch):
    forks = []
    real = simulator.go_alone
    monkeypatch.setattr(simulator, "go_alone", lambda *a: forks.append(1) or real(*a))
    arrival, inp, out, cached = trace(2000, 2, 20.0)
    simulate(arrival, inp, out, cached, **server(50_000), alone_first=1500)
    assert forks == [1]


def test_arrivals_out_of_order_are_simulated_apart():
    arrival, inp, out, cached = trace(2000, 3, 20.0)
    order = np.random.default_rng(0).permutation(2000)
    arrival, inp, out, cached = arrival[order], inp[order], out[order], cached[order]
    both = simulate(arrival, inp, out, cached, **server(50_000), alone_first=1500)
    assert_same(both.alone, simulate(arrival[:1500], inp[:1500], out[:1500], cached[:1500],
                                     **server(50_000)))


@pytest.mark.parametrize("polls", [1, 3])  # stopped before the fork, and after it
def test_a_stopped_run_gives_no_run_alone_and_leaves_no_child(monkeypatch, polls):
    import os

    monkeypatch.setattr(simulator, "POLL_EVERY_REQUESTS", 200)
    asked = []
    arrival, inp, out, cached = trace(2000, 5, 20.0)
    result = simulate(arrival, inp, out, cached, **server(50_000), alone_first=500,
                      stop=lambda: asked.append(1) or len(asked) >= polls)
    assert result.completed_fraction < 1.0 and result.alone is None
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)


@pytest.mark.parametrize("redo", [False, True])
def test_a_whole_run_of_a_round_redone_stops_and_keeps_the_first_requests_run(monkeypatch, redo):
    monkeypatch.setattr(simulator, "POLL_EVERY_REQUESTS", 100)
    arrival, inp, out, cached = trace(3000, 6, 20.0)
    alone = simulate(arrival[:1500], inp[:1500], out[:1500], cached[:1500], **server(50_000))
    drop = sim_alone.DropWhole(lambda result: redo, sim_alone.DropWhole.shared_flag())
    both = simulate(arrival, inp, out, cached, **server(50_000), alone_first=1500, drop_whole=drop)
    assert_same(both.alone, alone)
    # The child raises the flag before it sends its run, which the parent has read by now.
    assert drop.raised() == redo
    if not redo:
        assert both.completed_fraction == 1.0
        assert_same(both, simulate(arrival, inp, out, cached, **server(50_000)))
    # Whether the whole run sees the flag before it ends races the child (a fresh clone's test
    # run once lost it): raised from the start, it stops at its first poll after the fork, and
    # the first requests' run is still whole.
    up = sim_alone.DropWhole(lambda result: True, sim_alone.DropWhole.shared_flag())
    up.flag[0] = 1
    stopped = simulate(arrival, inp, out, cached, **server(50_000), alone_first=1500, drop_whole=up)
    assert stopped.completed_fraction < 1.0
    assert_same(stopped.alone, alone)
