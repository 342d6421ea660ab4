import numpy as np
import pytest

from cgtool.documents.plan_document import ClosedLoopRow
from cgtool.planner.scoring import Histogram
from cgtool.planner.tails import (
    TAIL_TOLERANCE,
    by_saving,
    fewest_that_fix,
    offered_sizes,
    shortfall,
)


def row(schedule, load=1.0, ttft_p99_s=0.1, tpot_p99_ms=10.0, tokens_per_s=1000.0):
    return ClosedLoopRow(
        schedule=schedule, load=load, eager="low", ttft_p50_s=0.03, ttft_p99_s=ttft_p99_s,
        tpot_p50_ms=7.0, tpot_p99_ms=tpot_p99_ms, output_tokens_per_s=tokens_per_s,
        mean_queue_s=0.0, p99_queue_s=0.0, median_decode_batch=8, largest_decode_batch=16,
        decode_eager_share=0.0, finished_share=1.0, duration_s=10.0, max_bs=64, num_graphs=10,
        graph_bytes=1 << 30, capture_s=5.0, kv_tokens=100_000,
    )


def test_shortfall_names_the_plans_worst_loss_to_the_default_at_any_load():
    rows = [row("plan"), row("default"),
            row("plan", 2.0, ttft_p99_s=0.15, tpot_p99_ms=10.5), row("default", 2.0)]
    worst, where = shortfall(rows)
    assert worst == pytest.approx(0.5)
    assert where == "TTFT p99 at 2x (low eager cost)"


def test_shortfall_counts_lower_throughput_as_a_loss_and_a_better_plan_as_none():
    slower = shortfall([row("plan", tokens_per_s=900.0), row("default")])
    assert slower[0] == pytest.approx(1000 / 900 - 1) and slower[1].startswith("output tokens/s")
    assert shortfall([row("plan", ttft_p99_s=0.05), row("default")]) == (0.0, "")


def test_offered_sizes_are_the_defaults_the_plan_lacks_up_to_its_largest():
    assert offered_sizes((64, 4096, 8192), (32, 64, 4096, 4608, 8192, 16384), 8192) == [32, 4608]


def test_sizes_in_the_plans_widest_gap_with_steps_come_first():
    # Steps of 4,200-5,000 tokens pad to the 8,192 graph: a graph at 5,120 saves the most;
    # one at 4,608 then takes the steps up to it; 256 serves no step and comes last.
    sizes = np.array([100, 4200, 5000])
    steps = [Histogram(sizes, np.array([50, 3, 3]), np.zeros(3), np.zeros(3))]
    graph_ms = np.arange(8193, dtype=float)  # a step's time grows with its graph's tokens
    eager_ms = 2 * graph_ms
    order = by_saving([256, 4608, 5120], (128, 4096, 8192), steps, graph_ms, eager_ms)
    assert order == [5120, 4608, 256]


def test_the_shortest_fixing_head_is_kept_and_none_when_nothing_fixes():
    simulated = []

    def worst_with(added):  # only a head that holds "b" brings the plan within the tolerance
        simulated.append(len(added))
        return 0.0 if "b" in added else 0.3

    assert fewest_that_fix(["a", "b", "c", "d", "e"], worst_with) == ["a", "b"]
    assert len(simulated) <= 4  # all of them, then bisection: not one run per length
    assert fewest_that_fix(["a", "c"], lambda added: 0.3) is None
    assert fewest_that_fix([], lambda added: 0.0) is None
    assert fewest_that_fix(["a"], lambda added: TAIL_TOLERANCE) == ["a"]
