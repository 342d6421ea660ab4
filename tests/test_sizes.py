"""capture_sizes: the one rule every capture size list passes through."""

from __future__ import annotations

import pytest

from cgtool.runners.sizes import capture_sizes


def test_sizes_are_sorted_once_each():
    assert capture_sizes([256, 1, 8, 8, 2]) == [1, 2, 8, 256]


@pytest.mark.parametrize("values", [[], [0], [4, -1]])
def test_empty_or_non_positive_lists_are_refused(values):
    with pytest.raises(ValueError, match="positive"):
        capture_sizes(values)
