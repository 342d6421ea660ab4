import numpy as np
import pytest

from cgtool.errors import InputError
from cgtool.planner.scenarios import (
    LoadRun,
    parse_loads,
    replica_share,
    replicas_needed,
    split_time,
)
from cgtool.planner.sim_result import SimulationResult


def test_loads_parse_in_order_without_repeats():
    assert parse_loads("1,2") == (1.0, 2.0)
    assert parse_loads("0.5, 4,4") == (0.5, 4.0)


@pytest.mark.parametrize("text", ["0", "-1", "1,x", "", "inf", "nan"])
def test_a_load_that_is_not_a_positive_multiple_is_refused(text):
    with pytest.raises(InputError, match="--load"):
        parse_loads(text)


def test_each_replica_takes_every_nth_request_by_arrival():
    arrival = np.array([3.0, 0.0, 2.0, 1.0, 4.0])
    lengths = np.array([30, 0, 20, 10, 40])
    share_arrival, share_len, cached = replica_share((arrival, lengths, None), 2)
    assert share_arrival.tolist() == [0.0, 2.0, 4.0] and share_len.tolist() == [0, 20, 40]
    assert cached is None


@pytest.mark.parametrize("arrival", [[0.0, 1.0, 1.0, 2.0], [2.0, 1.0, 0.0, 1.0]])
def test_one_replica_takes_every_request_in_arrival_order(arrival):
    lengths = np.array(arrival) * 10
    share_arrival, share_len, cached = replica_share((np.array(arrival), lengths, None), 1)
    assert share_arrival.tolist() == sorted(arrival)
    assert share_len.tolist() == [a * 10 for a in sorted(arrival)] and cached is None


def test_the_split_is_the_arrival_of_the_first_held_out_request():
    assert split_time(np.arange(10.0)) == 7.0
    assert split_time(np.array([5.0])) == np.inf  # one request: nothing to hold out


def _run(p99_queue_s, duration_s, span_s, n=1000):
    zeros = np.zeros(2)
    result = SimulationResult(
        zeros, zeros, zeros, zeros, zeros, zeros, n, 0, duration_s, 10, 0.0, p99_queue_s, 0
    )
    return LoadRun(1.0, result, span_s)


def test_a_growing_queue_is_overload_and_a_drained_burst_is_not():
    assert _run(p99_queue_s=300, duration_s=3600, span_s=3500).overloaded
    assert _run(p99_queue_s=1, duration_s=7000, span_s=3500).overloaded  # ends an hour late
    assert not _run(p99_queue_s=1, duration_s=3510, span_s=3500).overloaded
    assert not _run(p99_queue_s=20, duration_s=30, span_s=5).overloaded  # a short burst


def test_replicas_needed_follow_the_rate_one_server_sustains():
    # 1,000 requests offered over 1,000 s; one server completes them in 4,000 s.
    over = _run(p99_queue_s=2000, duration_s=4000, span_s=1000)
    assert over.sustained_rate == pytest.approx(0.25)
    assert replicas_needed([over], 1) == 4
    assert replicas_needed([_run(1, 1000, 1000)], 1) is None
