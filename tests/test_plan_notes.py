import numpy as np

from cgtool.planner.plan_notes import ceiling_warnings, share_text
from cgtool.planner.schedules import default_schedule
from cgtool.planner.scoring import Histogram
from cgtool.specs.gpus import gpu_spec

H100 = gpu_spec("H100-80GB")
DEFAULT = default_schedule("sglang", None, gpu_memory_bytes=H100.memory_bytes)  # max_bs 256


def _decode(counts_by_size: dict[int, int]) -> Histogram:
    sizes = np.array(sorted(counts_by_size))
    counts = np.array([counts_by_size[s] for s in sizes])
    return Histogram(sizes, counts, counts * 0.01, np.zeros(len(sizes)))


def test_a_few_steps_past_the_ceiling_never_read_as_zero_percent():
    # 3 of 100,003 steps past bs 256: the note said "0% of decode steps would run eagerly".
    notes = ceiling_warnings(_decode({8: 100_000, 300: 3}), DEFAULT)
    assert notes == [
        ("the default's largest decode graph (256) is below batches the trace reaches (up to 300): "
         "3 of 100,003 decode steps (under 0.1%) would run eagerly")
    ]


def test_sizes_past_the_ceiling_that_no_step_reached_give_no_note():
    assert ceiling_warnings(_decode({8: 10, 300: 0}), DEFAULT) == []


def test_share_text_by_hand():
    assert share_text(1, 2000) == "under 0.1%"
    assert share_text(0, 10) == "0.0%"
    assert share_text(1, 8) == "12.5%"
    assert share_text(9_999, 10_000) == "over 99.9%"
    assert share_text(10, 10) == "100.0%"


def test_a_plan_from_a_handful_of_requests_says_it_is_a_guess():
    from cgtool.planner.plan_notes import FEW_REQUESTS, few_requests_warning

    assert few_requests_warning(FEW_REQUESTS) is None
    assert few_requests_warning(1).startswith("only 1 request: ")
    assert "guess" in few_requests_warning(FEW_REQUESTS - 1)
