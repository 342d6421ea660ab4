"""A replay that differs from eager beyond the dtype's tolerance: marked unsafe, named, exit 1."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from rich.console import Console

from cgtool.capture.measure import CaptureCost, ReplayCheck, compare_outputs, replay_tolerance
from cgtool.capture.options import SessionState
from cgtool.capture.per_size import record_size
from cgtool.capture.sampling import PathTiming, SpreadPool
from cgtool.commands.capture import capture_exit_code
from cgtool.documents.results import load_report
from cgtool.reports.capture_view import print_capture_summary

REPORT = Path(__file__).parent / "data" / "reports" / "h100-llama-3.1-8b" / "report.json"
COST = CaptureCost(capture_s=0.1, retained_bytes=1 << 20, peak_bytes=2 << 20, non_torch_bytes=0)


POOL = SpreadPool(sum_sq=0.01**2 * 10, dof=10)  # 1% spread


def _check(diff: float, logits_scale: float = 20.0) -> ReplayCheck:
    tolerance = replay_tolerance(torch.full((4,), logits_scale), torch.bfloat16)
    return ReplayCheck(
        eager=PathTiming((19.0, 21.0), "short", POOL), replay=PathTiming((6.0, 6.0, 6.0), "short", POOL),
        max_abs_diff=diff, tolerance=tolerance, worst_output=0, worst_token=2,
    )


def test_tolerance_is_a_few_ulps_of_the_dtype_at_the_logits_scale():
    assert replay_tolerance(torch.tensor([20.0, -3.0]), torch.bfloat16) == 4 * 2**-7 * 20.0
    assert _check(0.0).safe and _check(0.6).safe  # 4 bf16 ulps of 20 = 0.625
    assert not _check(0.7).safe


def test_every_row_is_compared_and_the_worst_row_named():
    eager = [torch.zeros(5, 3), torch.full((1, 8), 20.0)]  # hidden states of 5 tokens, logits
    replay = [eager[0].clone(), eager[1].clone()]
    replay[0][3, 1] = 0.5  # token 3, far beyond 4 ulps at scale 1
    replay[1][0, 2] = 20.5  # within 4 ulps at scale 20
    diff, tolerance, output, row = compare_outputs(eager, replay, torch.bfloat16)
    assert (diff, output, row) == (0.5, 0, 3) and tolerance == 4 * 2**-7


def test_a_size_beyond_tolerance_is_recorded_unsafe_with_its_difference():
    state = SessionState()
    record_size(state, "decode", 8, COST, _check(0.0), 5.0)
    record_size(state, "decode", 16, COST, _check(1.25), 5.0)
    assert [(r.size, r.status, r.max_abs_diff) for r in state.sizes] == [(8, "ok", 0.0), (16, "unsafe", 1.25)]
    row = state.sizes[1]
    assert row.max_diff_at == 2 and row.eager_ms == 20.0 and row.eager_ci95_ms == POOL.ci95_ms(20.0, 2)
    assert (row.eager_samples, row.replay_samples) == (2, 3)


def test_the_summary_names_unsafe_sizes_and_the_command_exits_1():
    report = load_report(REPORT)
    assert capture_exit_code(report) == 0
    first = report.sizes[0]
    unsafe = dataclasses.replace(first, status="unsafe", max_abs_diff=0.75)
    report = dataclasses.replace(report, sizes=[unsafe, *report.sizes[1:]])
    console = Console(record=True, width=200)
    print_capture_summary(console, report, None, [])
    text = console.export_text()
    assert f"unsafe: {first.kind} size {first.size}: replay differs from eager by 0.75" in text
    assert capture_exit_code(report) == 1
