import numpy as np
import pytest

from cgtool.planner.simulator import StepCost, simulate
from cgtool.replay.policy import Scheduler, requests_from
from cgtool.replay.virtual import run_virtual, step_cost_ms


def _cost(max_bs, chunk, seed=0):
    rng = np.random.default_rng(seed)
    # Rising tables (a larger step is never faster) with irregular steps, as measured ones are.
    decode = np.cumsum(rng.uniform(0.01, 0.2, max_bs + 1)) + 5.0
    extend = np.cumsum(rng.uniform(0.001, 0.02, chunk + 1)) + 8.0
    return StepCost(decode, extend, 1e-4, 1e-7)


def _trace(n, seed):
    rng = np.random.default_rng(seed)
    arrival = np.sort(rng.uniform(0, n * 0.02, n))
    prompt = rng.integers(1, 700, n)
    output = rng.integers(0, 60, n)
    cached = np.where(rng.random(n) < 0.3, rng.integers(0, 500, n), 0)
    return arrival, prompt, output, np.minimum(cached, prompt - 1)


def _histograms(steps, max_bs, chunk):
    decode, extend = np.zeros(max_bs + 1, int), np.zeros(chunk + 1, int)
    for s in steps:
        (decode if s.kind == "decode" else extend)[s.size] += 1
    return decode, extend


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("max_running", "chunk", "kv"), [(8, 256, 3000), (32, 512, 20_000), (4, 1024, 1500)])
def test_virtual_replay_makes_the_simulators_batches(seed, max_running, chunk, kv):
    arrival, prompt, output, cached = _trace(120, seed)
    cost = _cost(max_running, chunk, seed)
    sim = simulate(arrival, prompt, output, cached, cost=cost, max_running_requests=max_running,
                   chunked_prefill_size=chunk, kv_capacity_tokens=kv)
    keep = prompt + np.maximum(output - 1, 0) + 1 <= kv
    reqs = requests_from(arrival[keep], prompt[keep], output[keep], cached[keep])
    run = run_virtual(reqs, Scheduler(reqs, max_running, chunk, kv), step_cost_ms(cost))
    decode, extend = _histograms(run.steps, max_running, chunk)
    np.testing.assert_array_equal(decode, sim.decode_counts)
    np.testing.assert_array_equal(extend, sim.extend_counts)
    # The simulator counts from the first arrival (origin_s); the virtual loop from 0.
    assert run.clock_ms / 1e3 == pytest.approx(sim.origin_s + sim.duration_s, rel=1e-9)


def test_every_request_gets_its_first_token_and_finishes_after_it():
    arrival, prompt, output, cached = _trace(60, 7)
    reqs = requests_from(arrival, prompt, output, cached)
    run = run_virtual(reqs, Scheduler(reqs, 8, 256, 10_000), step_cost_ms(_cost(8, 256)))
    assert sorted(run.first_token_ms) == list(range(60)) == sorted(run.finish_ms)
    for i in range(60):
        assert reqs.arrival_ms[i] < run.first_token_ms[i] <= run.finish_ms[i]
        assert (run.finish_ms[i] > run.first_token_ms[i]) == (output[i] >= 2)


def test_kv_pool_is_empty_and_nothing_decodes_once_every_request_finished():
    arrival, prompt, output, cached = _trace(40, 3)
    reqs = requests_from(arrival, prompt, output, cached)
    sched = Scheduler(reqs, 4, 128, 2000)
    run_virtual(reqs, sched, step_cost_ms(_cost(4, 128)))
    assert sched.done and sched.kv_used == 0 and sched.context == 0


@pytest.mark.parametrize("seed", range(4))
def test_step_policy_times_every_request_as_the_simulator_does(seed):
    arrival, prompt, output, cached = _trace(150, seed)
    cost = _cost(16, 512, seed)
    sim = simulate(arrival, prompt, output, cached, cost=cost, max_running_requests=16,
                   chunked_prefill_size=512, kv_capacity_tokens=20_000)
    reqs = requests_from(arrival - arrival[0], prompt, output, cached)
    run = run_virtual(reqs, Scheduler(reqs, 16, 512, 20_000), step_cost_ms(cost))
    times = sim.requests
    first = np.array([run.first_token_ms[i] for i in times.index]) / 1e3
    finish = np.array([run.finish_ms[i] for i in times.index]) / 1e3
    np.testing.assert_allclose(first, times.first_token_s, rtol=0, atol=1e-9)
    np.testing.assert_allclose(finish, times.finish_s, rtol=0, atol=1e-9)
