"""`cgtool plan`."""

from __future__ import annotations

from cgtool.commands.common import not_available


def plan() -> None:
    """Simulate a workload trace and recommend capture sizes and --mem-fraction-static."""
    not_available("plan")
