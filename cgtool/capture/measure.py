"""Per-size measurement: memory around a capture; replay against eager; latency with its spread."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cgtool.capture.memory import read_memory
from cgtool.capture.timing import Timing, time_cuda, timed_call

Outputs = Sequence[torch.Tensor]  # what a forward is compared on: logits, or hidden states + logits


@dataclass(frozen=True, slots=True)
class CaptureCost:
    capture_s: float
    retained_bytes: int  # growth of the graph pool
    peak_bytes: int  # bytes newly reserved from the device during the capture (≥ retained)
    non_torch_bytes: int  # growth of memory outside torch's allocator


def measure_capture(capture: Callable[[], None], pool: Any) -> CaptureCost:
    before = read_memory(pool)
    reserved_before = _reserved_total()
    start = time.perf_counter()
    capture()
    torch.cuda.synchronize()
    capture_s = time.perf_counter() - start
    after = read_memory(pool)
    # Not the peak of reserved memory: torch.cuda.graph empties the allocator's cache on
    # entry, so reserved memory can fall while the pool grows. Every byte the capture took
    # from the device, reused or kept, is counted here instead.
    return CaptureCost(
        capture_s=capture_s,
        retained_bytes=after.pool_bytes - before.pool_bytes,
        peak_bytes=_reserved_total() - reserved_before,
        non_torch_bytes=after.non_torch_bytes - before.non_torch_bytes,
    )


def _reserved_total() -> int:
    """All bytes ever reserved from the device by this process (a counter that only grows)."""
    return int(torch.cuda.memory_stats().get("reserved_bytes.all.allocated", 0))


# A replay's launch gap (the host issuing its input copies and the graph launch while the GPU
# waits) was 0.3-0.6 ms on the H100 host (issue 14): over 2% of replays shorter than this.
BACK_TO_BACK_BELOW_MS = 25.0


@dataclass(frozen=True, slots=True)
class ReplayCheck:
    eager: Timing
    replay: Timing
    max_abs_diff: float  # of the output whose difference is largest against its tolerance
    tolerance: float
    worst_output: int  # index into the compared outputs
    worst_token: int  # row (token, or request of a decode batch) of the largest difference

    @property
    def safe(self) -> bool:
        return self.max_abs_diff <= self.tolerance

    @property
    def eager_ms(self) -> float:
        return self.eager.mean_ms

    @property
    def replay_ms(self) -> float:
        return self.replay.mean_ms


def replay_tolerance(reference: torch.Tensor, dtype: torch.dtype) -> float:
    """Bitwise equality is expected; allow a few ulps of the dtype at the output's scale."""
    scale = float(reference.abs().max()) if reference.numel() else 0.0
    return 4 * torch.finfo(dtype).eps * max(scale, 1.0)


def compare_outputs(
    expected: Outputs, got: Outputs, dtype: torch.dtype
) -> tuple[float, float, int, int]:
    """(max |got - expected|, its tolerance, which output, which row) for the output whose
    difference is largest relative to its own tolerance; every row of every output counts."""
    worst = (0.0, 1.0, 0, 0)
    for index, (e, g) in enumerate(zip(expected, got, strict=True)):
        diff = (g.float() - e.float()).abs().reshape(e.shape[0], -1).amax(dim=1)  # [rows]
        tolerance = replay_tolerance(e, dtype)
        row = int(diff.argmax()) if diff.numel() else 0
        value = float(diff[row]) if diff.numel() else 0.0
        if value / tolerance > worst[0] / worst[1]:
            worst = (value, tolerance, index, row)
    return worst


def check_replay(
    eager: Callable[[], Outputs],
    replay: Callable[[], Outputs],
    dtype: torch.dtype,
    timed_eager: Callable[[], object] | None = None,
    timed_replay: Callable[[], object] | None = None,
) -> ReplayCheck:
    """Compare once on every row of every output, then time each path until its mean is
    known to within a few percent. The timed calls default to the compared ones, and do the
    same GPU work: the compared call is also the first timed one (a call saved on an eager
    path of tens of ms), except for replays short enough to be timed back to back."""
    outputs, eager_ms = timed_call(eager)
    expected = [t.float().clone() for t in outputs]  # before replay runs: nothing may alias it
    outputs, replay_ms = timed_call(replay)
    got = [t.float().clone() for t in outputs]
    diff, tolerance, output, row = compare_outputs(expected, got, dtype)
    return ReplayCheck(
        eager=time_cuda(timed_eager or eager, first_ms=eager_ms),
        replay=time_cuda(
            timed_replay or replay, first_ms=replay_ms, back_to_back_below_ms=BACK_TO_BACK_BELOW_MS
        ),
        max_abs_diff=diff,
        tolerance=tolerance,
        worst_output=output,
        worst_token=row,
    )
