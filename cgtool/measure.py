"""Per-size measurement: memory around a capture; replay against eager; latency; kernels."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from cgtool.profiler.memory import read_memory
from cgtool.profiler.timing import KernelStat, kernels_per_call, median_cuda_ms, profile_kernels


@dataclass(frozen=True, slots=True)
class CaptureCost:
    capture_s: float
    retained_bytes: int  # growth of the graph pool
    peak_bytes: int  # highest reserved memory during the capture, above where it started
    non_torch_bytes: int  # growth of memory outside torch's allocator


def measure_capture(capture: Callable[[], None], pool: Any) -> CaptureCost:
    before = read_memory(pool)
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    capture()
    torch.cuda.synchronize()
    capture_s = time.perf_counter() - start
    after = read_memory(pool)
    return CaptureCost(
        capture_s=capture_s,
        retained_bytes=after.pool_bytes - before.pool_bytes,
        peak_bytes=torch.cuda.max_memory_reserved() - before.reserved_bytes,
        non_torch_bytes=after.non_torch_bytes - before.non_torch_bytes,
    )


@dataclass(frozen=True, slots=True)
class ReplayCheck:
    eager_ms: float
    replay_ms: float
    max_abs_diff: float
    tolerance: float
    kernels: list[KernelStat]

    @property
    def safe(self) -> bool:
        return self.max_abs_diff <= self.tolerance


def replay_tolerance(reference: torch.Tensor, dtype: torch.dtype) -> float:
    """Bitwise equality is expected; allow a few ulps of the dtype at the logits' scale."""
    scale = float(reference.abs().max())
    return 4 * torch.finfo(dtype).eps * max(scale, 1.0)


def check_replay(
    eager: Callable[[], torch.Tensor],
    replay: Callable[[], torch.Tensor],
    dtype: torch.dtype,
    iters: int = 20,
    trace_path: str | None = None,
) -> ReplayCheck:
    """`eager` and `replay` return the same quantity (logits) for the same batch."""
    expected = eager().float().clone()
    got = replay().float().clone()
    diff = float((got - expected).abs().max())
    return ReplayCheck(
        eager_ms=median_cuda_ms(eager, iters=iters),
        replay_ms=median_cuda_ms(replay, iters=iters),
        max_abs_diff=diff,
        tolerance=replay_tolerance(expected, dtype),
        kernels=profile_kernels(eager, trace_path),
    )


def kernel_count(check: ReplayCheck) -> int:
    return kernels_per_call(check.kernels)
