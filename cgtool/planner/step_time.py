"""The time of one forward step: the one formula the simulator, batch-trace plans and `verify`
predict with.

A step is a dense part that depends only on how many rows it computes (a table per size: a
graph's padded size, or the real size eagerly) plus an attention part that depends on what the
rows attend to:

    decode step of b requests holding C context tokens in all:  dense[b] + kv_ms * C
    extend step of new tokens n after a cached prefix p:         dense[n] + pair_ms * pairs(n, p)
    pairs(n, p) = n * p + n * (n + 1) / 2   (causal attention over the prefix and the chunk)

Each decode step reads `b` more context tokens than the one before, so k identical decode steps
take k * first + kv_ms * b * k * (k - 1) / 2: an arithmetic series (`decode_run_ms`).
Every function works on Python numbers and on numpy arrays alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import numpy as np

Number = TypeVar("Number", float, np.ndarray)


@dataclass(frozen=True, eq=False)
class StepCost:
    """What one step takes under a given capture schedule."""

    decode_ms: np.ndarray  # [max_running + 1] dense ms of a decode step of b requests
    extend_ms: np.ndarray  # [chunked_prefill_size + 1] dense ms of an extend step of n tokens
    kv_read_ms_per_token: float  # decode attention, per context token
    attention_ms_per_pair: float  # extend attention, per (query, key) token pair


def attention_pairs(new_tokens: Number, prefix_tokens: Number) -> Number:
    """Query-key pairs of `new_tokens` computed after `prefix_tokens` already in the cache."""
    return new_tokens * prefix_tokens + new_tokens * (new_tokens + 1) / 2.0


def decode_step_ms(dense_ms: Number, kv_ms_per_token: float, context_tokens: Number) -> Number:
    """One decode step: its dense part plus reading every running request's context."""
    return dense_ms + kv_ms_per_token * context_tokens


def extend_step_ms(dense_ms: Number, ms_per_pair: float, pairs: Number) -> Number:
    """One extend step: its dense part plus the attention over `pairs` query-key pairs."""
    return dense_ms + ms_per_pair * pairs


def decode_run_ms(first_ms: float, growth_ms: float, steps: int) -> float:
    """`steps` decode steps of one batch, the first taking `first_ms`, each next `growth_ms`
    longer (kv_ms * batch: every request's context grows by one token a step)."""
    return steps * first_ms + growth_ms * steps * (steps - 1) / 2
