"""Counters for kernels whose last program to finish does the closing reduction.

A launch that ends in a sum across its programs (the MoE's top-k sum, MLA's merge of chunks,
routing after the router's logits) can do that sum in the program that finishes last, rather
than in a second launch: every program writes its part and takes a ticket with an atomic add;
the one that draws the last number reads the parts and puts the counter back to zero. Each
launch a replayed graph makes costs some microseconds whatever its work (issue 33), so at
decode sizes one launch fewer is worth more than the reduction.

The counters therefore rest at zero between launches, and one buffer serves every layer and
every graph of a device (launches on one stream never overlap). It is never freed, because a
captured graph keeps its address.
"""

from __future__ import annotations

import torch

# Enough for the largest user: MLA decode at 4,096 requests x 64 blocks of 16 heads (1 MiB).
TICKETS = 1 << 18

_BUFFERS: dict[tuple[str, int], torch.Tensor] = {}


def tickets(device: torch.device | str, count: int) -> torch.Tensor:
    """`count` int32 counters at zero on `device`, shared by every kernel that takes tickets."""
    device = torch.device(device)
    index = device.index if device.index is not None else (
        torch.cuda.current_device() if device.type == "cuda" else 0
    )
    if count > TICKETS:
        raise ValueError(f"{count} tickets asked for; the buffer holds {TICKETS}")
    key = (device.type, index)
    buffer = _BUFFERS.get(key)
    if buffer is None:
        # Made once a device. Inside a capture this comes from the graph's pool, which the
        # reference here keeps alive; the zeroing it captures only repeats the resting state.
        buffer = _BUFFERS[key] = torch.zeros(TICKETS, dtype=torch.int32, device=torch.device(device.type, index))
    return buffer[:count]
