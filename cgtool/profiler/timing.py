"""Latency by CUDA events, kernels per forward by torch.profiler, copy bandwidth."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch


def median_cuda_ms(fn: Callable[[], object], warmup: int = 3, iters: int = 20) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth_bytes_s(num_bytes: int = 1 << 30) -> float:
    """Device-to-device copy rate: the practical ceiling for reading weights and KV."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = median_cuda_ms(lambda: dst.copy_(src), warmup=2, iters=10)
    del src, dst
    return 2 * num_bytes / (ms / 1e3)  # one read plus one write per byte


@dataclass(frozen=True, slots=True)
class KernelStat:
    name: str
    cuda_ms: float
    launches: int


def profile_kernels(fn: Callable[[], object], trace_path: str | None = None) -> list[KernelStat]:
    """Every GPU kernel one call of `fn` launches, heaviest first."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    if trace_path:
        prof.export_chrome_trace(trace_path)
    stats: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and not _is_memory_op(event.name):
            stats.setdefault(event.name, []).append(_device_us(event) / 1e3)
    rows = [KernelStat(name, sum(ts), len(ts)) for name, ts in stats.items()]
    return sorted(rows, key=lambda r: -r.cuda_ms)


def _device_us(event: object) -> float:
    # torch renamed cuda_time_total to device_time_total; accept both.
    return float(getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0.0))


def _is_memory_op(name: str) -> bool:
    return name.startswith(("Memcpy", "Memset", "cudaMemcpy", "cudaMemset"))


def kernels_per_call(stats: list[KernelStat]) -> int:
    return sum(s.launches for s in stats)
