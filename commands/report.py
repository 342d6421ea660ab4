"""`cgtool report`."""

from __future__ import annotations

from cgtool.commands.common import not_available


def report() -> None:
    """Re-render tables, figures and an HTML page from a saved report or plan."""
    not_available("report")
