"""The replay-equals-eager assertion of the GPU runner tests."""

from __future__ import annotations


def assert_replay_equals_eager(replayed, eager) -> None:
    """The rule `cgtool capture` marks sizes unsafe by: every row within 4 ulps of the dtype
    at the output's scale (cgtool.capture.measure.replay_tolerance)."""
    from cgtool.capture.measure import compare_outputs

    diff, tolerance, _, row = compare_outputs([eager], [replayed], eager.dtype)
    assert diff <= tolerance, f"replay differs from eager by {diff:.3g} at row {row} (tolerance {tolerance:.3g})"
