"""`cgtool check`."""

from __future__ import annotations

from cgtool.commands.common import not_available


def check() -> None:
    """Compare two capture reports size by size; exit 1 on a regression (CI gate)."""
    not_available("check")
