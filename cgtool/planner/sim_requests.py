"""The simulator's view of a request list: kept, ordered by arrival, timed from the first one.

Times start at the first arrival, so a trace stamped in Unix seconds (1.7e9) simulates exactly
as the same trace starting at 0: the loop's clock never holds a large number whose last bits
would decide which of two close events comes first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cgtool.errors import InputError
from cgtool.planner.step_time import attention_pairs

# Past the last request: an arrival that never comes and a request that never fits, so the
# loop tests no index against the number of requests.
NEVER_MS = math.inf
NEVER_FITS = 1 << 62


@dataclass(slots=True)
class Requests:
    """Per request, in arrival order, as lists (indexing a list is several times faster than
    indexing an array); `arrival_ms` and `footprint` end with one sentinel each."""

    arrival_ms: list[float]  # from the first arrival; with a concurrency, set as requests finish
    new: list[int]  # prompt tokens to compute (input minus cached)
    cached: np.ndarray  # read for split prompts only, which are rare
    decode_steps: list[int]  # output tokens after the first
    footprint: list[int]  # KV tokens reserved from admission to finish
    cum_new: list[int]  # prefix sums, so a run of requests is admitted at once
    cum_footprint: list[int]
    cum_pairs: list[float]


@dataclass(frozen=True, eq=False)
class Prepared:
    requests: Requests
    dropped: int  # longer than the context or the KV pool, or without a prompt
    index: np.ndarray  # [kept] each kept request's position in the arrays given
    origin_s: float  # the first arrival, in the clock of the arrays given
    footprint: np.ndarray  # [kept]
    output_tokens: np.ndarray  # [kept]


def prepare(
    arrival_s, input_len, output_len, cached_len, limit_tokens: int, concurrency: int | None = None
) -> Prepared:
    """The loop's lists. With `concurrency` N the arrival times are not used: the first N
    requests (in the order given) arrive at 0 and each later one when a request finishes."""
    prompt = np.asarray(input_len, dtype=np.int64)
    arrival = np.asarray(arrival_s, dtype=np.float64) if concurrency is None else np.zeros(len(prompt))
    output = np.asarray(output_len, dtype=np.int64)
    cached = np.zeros_like(prompt) if cached_len is None else np.asarray(cached_len, dtype=np.int64)
    if not (len(arrival) == len(prompt) == len(output) == len(cached)):
        raise InputError(
            "request arrays differ in length", "Pass one value per request in each array."
        )
    decode_steps = np.maximum(output - 1, 0)
    footprint = prompt + decode_steps + 1
    keep = (footprint <= limit_tokens) & (prompt >= 1)
    index = np.nonzero(keep)[0]
    if len(index) and not np.all(arrival[index][1:] >= arrival[index][:-1]):
        index = index[np.argsort(arrival[index], kind="stable")]
    origin = float(arrival[index[0]]) if len(index) else 0.0
    arrival, prompt, cached, decode_steps, footprint = (
        a[index] for a in (arrival, prompt, cached, decode_steps, footprint)
    )
    cached = np.clip(cached, 0, prompt - 1)  # the last prompt token is always computed
    new = prompt - cached
    arrival_ms = ((arrival - origin) * 1e3).tolist()
    if concurrency is not None:
        arrival_ms[concurrency:] = [NEVER_MS] * max(len(arrival_ms) - concurrency, 0)
    footprints = footprint.tolist()
    arrival_ms.append(NEVER_MS)
    footprints.append(NEVER_FITS)
    requests = Requests(
        arrival_ms,
        new.tolist(),
        cached,
        decode_steps.tolist(),
        footprints,
        np.concatenate([[0], np.cumsum(new)]).tolist(),
        np.concatenate([[0], np.cumsum(footprint)]).tolist(),
        np.concatenate([[0.0], np.cumsum(attention_pairs(new, cached))]).tolist(),
    )
    return Prepared(
        requests, len(keep) - len(index), index, origin, footprint, decode_steps + 1
    )
