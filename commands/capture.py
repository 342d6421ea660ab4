"""`cgtool capture`."""

from __future__ import annotations

from cgtool.commands.common import not_available


def capture() -> None:
    """Capture and replay decode and piecewise CUDA graphs on a GPU and measure each size."""
    not_available("capture")
