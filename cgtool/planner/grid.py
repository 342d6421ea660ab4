"""Where capture sizes may sit: token bins on a grid, decode batches on SGLang's own list.

A token bin is captured for the steps that pad into it, and the lengths a trace happens to
contain are not the lengths tomorrow's traffic will: a bin at 1,013 tokens fits one prompt
length, one at 1,024 fits the same steps and reads as a deliberate choice. Grid points are
16 tokens apart up to 1,024 tokens, where steps are cheap and a few tokens matter most, and
64 apart above, so a 16,384-token range needs 240 points instead of 1,024. The grid says
where a bin may sit, not how far a step pads: a step pads to the next bin chosen, which may
be several grid points up (and 15 tokens is 1.5% of a 1,024-token step but 4.9% of a
305-token one). A bin may also sit at the limit itself when the limit is off the grid.
"""

from __future__ import annotations

import numpy as np

from cgtool.planner.schedules import sglang_decode_bs

TOKEN_FINE_STEP = 16
TOKEN_FINE_UPTO = 1024
TOKEN_COARSE_STEP = 64
# A token bin must serve at least this share of the extend steps it is fitted on; rarer bins
# are fitted to a few prompt lengths and do not carry to other traffic.
MIN_BIN_SHARE = 0.005


def token_grid_up(tokens: np.ndarray, limit: int) -> np.ndarray:
    """Each size rounded up to the token grid, never above `limit` (the chunk or context)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    fine = -(-tokens // TOKEN_FINE_STEP) * TOKEN_FINE_STEP
    coarse = -(-tokens // TOKEN_COARSE_STEP) * TOKEN_COARSE_STEP
    return np.minimum(np.where(tokens <= TOKEN_FINE_UPTO, fine, coarse), limit)


def decode_grid(upto: int) -> list[int]:
    """SGLang's own decode batch list up to `upto` (ending at `upto`)."""
    return sglang_decode_bs(upto) if upto >= 1 else []


def decode_grid_up(batch: int, limit: int) -> int:
    """The smallest size of the decode list at or above `batch`, within `limit`."""
    return next((s for s in decode_grid(limit) if s >= batch), limit)
