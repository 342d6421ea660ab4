"""The one rule for a list of capture sizes: positive, each once, ascending."""

from __future__ import annotations

from collections.abc import Iterable


def capture_sizes(values: Iterable[int]) -> list[int]:
    """Sorted and deduplicated; ValueError on an empty list or a size below 1.

    Runners, capture options and the command line all pass their lists through here, so
    no other code sorts or checks them again (capture order, largest first, is the
    runners' reversal of this list)."""
    sizes = sorted(set(values))
    if not sizes or sizes[0] < 1:
        raise ValueError(f"capture sizes must be positive integers, not {sizes}")
    return sizes
