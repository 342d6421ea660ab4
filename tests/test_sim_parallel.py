import numpy as np
import pytest

from cgtool.planner import sim_parallel
from cgtool.planner.simulator import StepCost


def _jobs(loads=(1.0, 2.0, 4.0), n=3000):
    rng = np.random.default_rng(3)
    arrival = np.cumsum(rng.exponential(0.2, n))
    prompt = rng.integers(20, 600, n)
    output = rng.integers(1, 200, n)
    cost = StepCost(np.linspace(5, 9, 65), np.linspace(5, 30, 1025), 1e-5, 1e-7)
    return [
        {
            "arrival_s": arrival / load,
            "input_len": prompt,
            "output_len": output,
            "cached_len": None,
            "cost": cost,
            "max_running_requests": 64,
            "chunked_prefill_size": 1024,
            "kv_capacity_tokens": 50_000,
            "split_s": float(arrival[int(0.7 * n)] / load),
        }
        for load in loads
    ]


def _same(a, b):
    assert a.steps == b.steps and a.duration_s == b.duration_s
    assert np.array_equal(a.decode_counts, b.decode_counts)
    assert np.array_equal(a.before_split.extend_counts, b.before_split.extend_counts)


def test_forked_scenarios_give_the_serial_results(monkeypatch):
    jobs = _jobs()
    serial = sim_parallel.simulate_all(jobs, None, None)
    monkeypatch.setattr(sim_parallel, "PARALLEL_MIN_REQUESTS", 1)
    if not sim_parallel._parallel(jobs):
        pytest.skip("this host cannot fork or has one core")
    parallel = sim_parallel.simulate_all(jobs, None, None)
    assert len(parallel) == len(serial) == 3
    for a, b in zip(serial, parallel):
        _same(a, b)


def test_a_stop_in_the_first_scenario_returns_only_it(monkeypatch):
    monkeypatch.setattr(sim_parallel, "PARALLEL_MIN_REQUESTS", 1)
    results = sim_parallel.simulate_all(_jobs(n=200_000 // 2), None, lambda: True)
    assert len(results) == 1 and results[0].completed_fraction < 1.0


def test_serial_progress_covers_every_scenario_once():
    seen = []
    sim_parallel.simulate_all(_jobs(loads=(1.0, 2.0), n=500), seen.append, None)
    assert seen[-1] == 1.0 and 0.5 in seen and seen == sorted(seen)


def test_a_stop_while_waiting_for_the_other_scenarios_ends_them(monkeypatch):
    monkeypatch.setattr(sim_parallel, "PARALLEL_MIN_REQUESTS", 1)
    small, large = _jobs(loads=(1.0,), n=500)[0], _jobs(loads=(1.0,), n=200_000)[0]
    if not sim_parallel._parallel([small, large]):
        pytest.skip("this host cannot fork or has one core")
    first_done = []  # the first scenario reports 1.0 when it ends; stop fires from then on
    results = sim_parallel.simulate_all(
        [small, large], lambda f: first_done.append(f == 1.0), lambda: any(first_done)
    )
    assert len(results) == 1 and results[0].completed_fraction == 1.0
