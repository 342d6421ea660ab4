"""Per-size measurement: memory around a capture; replay against eager; latency with its spread."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cgtool.capture.memory import read_memory
from cgtool.capture.sampling import PathTiming, SpreadPools, regime_of
from cgtool.capture.timing import CallTimer, hold_gpu, timed_call
from cgtool.runtime.distributed import all_ranks

Outputs = Sequence[torch.Tensor]  # what a forward is compared on: logits, or hidden states + logits
MOST_SAMPLES = 15  # timed calls of one path at one size


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


@dataclass(frozen=True, slots=True)
class ReplayCheck:
    eager: PathTiming
    replay: PathTiming
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
    pools: SpreadPools | None = None,
    timed_eager: Callable[[], object] | None = None,
    timed_replay: Callable[[], object] | None = None,
    rel_ci: float = 0.03,
    budget_ms: float = 30.0,
) -> ReplayCheck:
    """Compare eager and replay once on every row of every output, then time each path as
    often as the spread pooled in `pools` asks (sampling.py). The compared call of each path
    is its first sample; the timed calls default to the compared ones and do the same GPU work.

    Replays are timed back to back behind a short spin of the GPU (`hold_gpu`): the host
    issues each replay while the GPU is still busy, as a server's overlapped scheduler does,
    so a lone replay's launch gap is not counted as GPU time. Eager calls start on an idle
    GPU: an eager step is the host's launching as much as the GPU's work."""
    pools = pools if pools is not None else SpreadPools()
    timed_eager, timed_replay = timed_eager or eager, timed_replay or replay
    outputs, eager_first = timed_call(eager)
    expected = _copied(outputs)  # before replay runs: nothing may alias it
    hold_gpu()
    first = CallTimer()
    got = _copied(first.call(replay))
    replay_first = first.ms(0)
    regime = regime_of(eager_first, replay_first)
    replay_pool, eager_pool = pools.pool("replay", regime), pools.pool("eager", regime)
    # With TP every rank must issue the same forwards (they hold collectives): the counts
    # are agreed, each the largest any rank asked for.
    more_replays, more_eagers = _agreed_most([
        replay_pool.samples_for(regime, replay_first, rel_ci, budget_ms, MOST_SAMPLES) - 1,
        eager_pool.samples_for(regime, eager_first, rel_ci, budget_ms, MOST_SAMPLES) - 1,
    ])
    replay_ms = [replay_first, *_timed_calls(timed_replay, more_replays, held=True)]
    eager_ms = [eager_first, *_timed_calls(timed_eager, more_eagers, held=False)]
    replay_pool.add(replay_ms)
    eager_pool.add(eager_ms)
    diff, tolerance, output, row = compare_outputs(expected, got, dtype)
    return ReplayCheck(
        eager=PathTiming(tuple(eager_ms), regime, eager_pool),
        replay=PathTiming(tuple(replay_ms), regime, replay_pool),
        max_abs_diff=diff,
        tolerance=tolerance,
        worst_output=output,
        worst_token=row,
    )


def _timed_calls(fn: Callable[[], object], count: int, held: bool) -> list[float]:
    if count <= 0:
        return []
    if held:
        hold_gpu()
    timer = CallTimer()
    for _ in range(count):
        timer.call(fn)
    return timer.all_ms()


def _copied(outputs: Outputs) -> list[torch.Tensor]:
    return [t.float().clone() for t in outputs]


def _agreed_most(counts: list[int]) -> list[int]:
    """Each count's largest value over the ranks (the counts themselves without TP)."""
    return [max(column) for column in zip(*all_ranks(counts), strict=True)]
