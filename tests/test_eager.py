
import numpy as np
import pytest
from planner_fixture import CFG, H100, REPORT

from cgtool.planner.eager import eager_range
from cgtool.planner.profile_fit import profile_cost


def test_roofline_plans_against_a_low_and_a_high_eager_cost(roofline):
    low, high = eager_range(roofline, CFG)
    assert (low.name, high.name) == ("low", "high")
    assert low.cost is roofline
    assert np.all(high.cost.decode_eager_ms >= low.cost.decode_eager_ms)
    assert np.all(high.cost.extend_eager_ms >= low.cost.extend_eager_ms)
    assert high.cost.decode_eager_ms[1] > low.cost.decode_eager_ms[1]


def test_the_range_changes_only_eager_cost(roofline):
    _, high = eager_range(roofline, CFG)
    assert np.array_equal(high.cost.decode_graph_ms, roofline.decode_graph_ms)
    assert np.array_equal(high.cost.extend_graph_ms, roofline.extend_graph_ms)
    assert high.cost.graph_bytes([1, 8], [256]) == roofline.graph_bytes([1, 8], [256])


def test_the_high_end_is_host_bound_so_large_steps_are_the_gpus_own(roofline):
    _, high = eager_range(roofline, CFG)
    # Small steps: the host's launches dominate, the same at every size.
    assert high.cost.decode_eager_ms[1] == pytest.approx(high.cost.decode_eager_ms[2])
    # The largest prefill chunk takes the GPU longer than the host takes to launch it.
    assert high.cost.extend_eager_ms[8192] == roofline.extend_eager_ms[8192]


def test_each_assumption_states_its_basis_with_its_ratio(roofline):
    for assumption in eager_range(roofline, CFG):
        ratio = assumption.cost.decode_eager_ms[1] / assumption.cost.decode_graph_ms[1]
        assert f"{ratio:.1f}x" in assumption.basis or f"{ratio:.2f}x" in assumption.basis


def test_a_profile_narrows_the_range_to_the_measured_host():
    measured = profile_cost(REPORT, CFG, H100, max_bs=512, max_tokens=8192, source="r.json")
    (only,) = eager_range(measured, CFG)
    assert only.name == "measured" and only.cost is measured and "r.json" in only.basis
