"""The shared counters that kernels finishing in their last program draw tickets from."""

from __future__ import annotations

import pytest
import torch

from cgtool.runtime.tickets import TICKETS, tickets


def test_every_caller_gets_the_same_zeroed_buffer():
    # One buffer a device, never reallocated: a captured graph keeps its address.
    first = tickets("cpu", 16)
    again = tickets(torch.device("cpu"), 4096)
    assert first.dtype == torch.int32 and first.shape == (16,) and again.shape == (4096,)
    assert first.data_ptr() == again.data_ptr()
    assert again.eq(0).all()


def test_asking_for_more_counters_than_the_buffer_holds_is_refused():
    with pytest.raises(ValueError, match=f"{TICKETS + 1} tickets"):
        tickets("cpu", TICKETS + 1)
