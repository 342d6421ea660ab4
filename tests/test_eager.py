import json
from pathlib import Path

import numpy as np
import pytest
from planner_fixture import CFG, H100, REPORT

from cgtool.planner.eager import eager_range
from cgtool.planner.profile_fit import profile_cost

MEASURED = (Path(__file__).parent.parent / "benchmarks" / "results" / "h100-2026-11-23-eager-host-bound"
            / "both-llama-3.1-8b.report.json")


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


def test_the_low_end_gives_graphs_the_gain_seed_001_states(roofline):
    # Seed 001: decode graphs give "10-30% speedup for small batch sizes (1-32)".
    low, _ = eager_range(roofline, CFG)
    speedup = low.cost.decode_eager_ms[1:33] / low.cost.decode_graph_ms[1:33]
    assert np.all((1.10 <= speedup) & (speedup <= 1.30)), speedup
    assert "fast host" in low.basis


def test_the_high_end_is_the_eager_step_measured_on_the_h100_host(roofline):
    # The capture the figure was read from (benchmarks/results/h100-2026-11-23-eager-host-bound): eager decode at
    # bs 1 took 34.49 ms there, at 93 us of host time a kernel.
    report = json.loads(MEASURED.read_text())
    eager_bs1 = next(s["eager_ms"] for s in report["sizes"] if s["kind"] == "decode" and s["size"] == 1)
    _, high = eager_range(roofline, CFG)
    assert high.cost.decode_eager_ms[1] == pytest.approx(eager_bs1, rel=0.1)
    assert "93 us a kernel" in high.basis
    assert report["totals"]["eager_host_us_per_kernel"] == pytest.approx(93, abs=0.5)


def test_a_profile_narrows_the_range_to_the_measured_host():
    measured = profile_cost(REPORT, CFG, H100, max_bs=512, max_tokens=8192, source="r.json")
    (only,) = eager_range(measured, CFG)
    assert only.name == "measured" and only.cost is measured and "r.json" in only.basis
