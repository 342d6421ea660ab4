"""Latency by CUDA events, kernels per forward by the kineto profiler, copy bandwidth."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import torch

_T = TypeVar("_T")

# Two-sided 95% Student t quantiles by degrees of freedom; past 30 the normal's 1.96 is close.
_T95 = (12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23, 2.20, 2.18, 2.16, 2.14,
        2.13, 2.12, 2.11, 2.10, 2.09, 2.09, 2.08, 2.07, 2.07, 2.06, 2.06, 2.06, 2.05, 2.05,
        2.05, 2.04)


def t95(dof: int) -> float:
    return _T95[dof - 1] if dof <= len(_T95) else 1.96


@dataclass(frozen=True, slots=True)
class Timing:
    """Mean time of one call, with the half-width of its 95% confidence interval."""

    mean_ms: float
    ci95_ms: float
    batches: int  # timed batches, each `calls_per_batch` calls between two CUDA events
    calls_per_batch: int


def time_cuda(
    fn: Callable[[], object],
    rel_ci: float = 0.03,
    min_batches: int = 2,
    max_batches: int = 15,
    batch_ms: float = 5.0,
    budget_s: float = 0.03,
) -> Timing:
    """Time `fn`, already warm and short (a copy, one linear), in batches until the 95%
    interval of the mean is within `rel_ci` of it, `max_batches` were timed, or another
    batch would end past `budget_s` (`min_batches` at least). The forwards a capture
    session measures are timed call by call instead (measure.check_replay).

    One pair of events per batch rather than per call: the events' own cost and the
    synchronisation after each batch would otherwise be part of short calls' times. The
    first batch is one call, which sizes the others."""
    first = _one_batch_ms(fn, 1)
    calls = max(1, min(64, int(batch_ms / max(first, 1e-3))))
    samples = [first] if calls == 1 else []
    start = time.perf_counter()
    while True:
        batch_start = time.perf_counter()
        samples.append(_one_batch_ms(fn, calls) / calls)
        n = len(samples)
        if n < min_batches:
            continue
        mean = statistics.fmean(samples)
        ci = t95(n - 1) * statistics.stdev(samples) / math.sqrt(n)
        now = time.perf_counter()
        # No batch starts that would end past the budget (the last one's length foretells it).
        past_budget = now - start + (now - batch_start) > budget_s
        if ci <= rel_ci * mean or n >= max_batches or past_budget:
            return Timing(mean, ci, n, calls)


def _one_batch_ms(fn: Callable[[], object], calls: int) -> float:
    return timed_call(lambda: [fn() for _ in range(calls)])[1]


def timed_call(fn: Callable[[], _T]) -> tuple[_T, float]:
    """(what `fn` returned, GPU ms from its first kernel's queueing to its last's end).
    Work queued on the result afterwards (a copy to compare it) is outside the time."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    result = fn()
    end.record()
    end.synchronize()
    return result, start.elapsed_time(end)


class CallTimer:
    """Queues calls with a CUDA event after each, one before the first: each call's GPU time
    is the gap between its two events. Nothing waits in between, so the host stays ahead of
    the GPU and a call's time holds no launch gap except where the GPU sat idle before it."""

    def __init__(self) -> None:
        self.marks = [_recorded_event()]

    def call(self, fn: Callable[[], _T]) -> _T:
        result = fn()
        self.marks.append(_recorded_event())
        return result

    def ms(self, index: int) -> float:
        """The `index`-th call's time, waiting for that call only (later ones keep running)."""
        self.marks[index + 1].synchronize()
        return self.marks[index].elapsed_time(self.marks[index + 1])

    def all_ms(self) -> list[float]:
        self.marks[-1].synchronize()
        return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]


# About 2 ms at an H100's 1.98 GHz: longer than the host takes to queue a decode replay
# (its input copies and the graph launch, 0.07-0.6 ms on the H100 host, issue 14), with room
# for a slow host (one lent H100 host once took 1.7 ms to queue a 0.3 ms call behind a spin).
HOLD_CYCLES = 4_000_000


def hold_gpu() -> None:
    """Keep the GPU busy for about two milliseconds, so that the calls queued next run back
    to back behind the spin and the first of them holds no launch gap either. A torch
    without the private spin leaves that first call's gap in its time."""
    spin = getattr(torch.cuda, "_sleep", None)
    if spin is not None:
        spin(HOLD_CYCLES)


def _recorded_event() -> torch.cuda.Event:
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def host_launch_ms(fn: Callable[[], object], repeats: int = 5) -> float:
    """Host time to issue one call, the GPU idle before it: the launch overhead of eager code
    (the call returns once its kernels are queued, which for one forward fits the queue).
    The median of `repeats` calls: one call alone can land on a pause of the host."""
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e3


def plain_torch_host_us(device: torch.device | str = "cuda", ops: int = 256) -> float:
    """Host microseconds plain PyTorch takes to issue one kernel here: a chain of `ops`
    out-of-place adds over 4,096 elements, each an allocation and a launch as an eager
    model's elementwise ops are, the GPU idle before. The yardstick of the eager path's host
    time per kernel, measured on the same host in the same run: hosts lent for one machine
    kind launched the same eager step at 25-52 µs a kernel (benchmarks r8)."""
    x = torch.ones(4096, device=device, dtype=torch.bfloat16)
    step = torch.zeros_like(x)

    def chain() -> torch.Tensor:
        y = x
        for _ in range(ops):
            y = torch.add(y, step)
        return y

    chain()  # the allocator's first blocks
    return host_launch_ms(chain) * 1e3 / ops


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
    copy = partial(torch.empty_like(src).copy_, src)
    copy()
    ms = time_cuda(copy, rel_ci=0.01, budget_s=0.2).mean_ms
    return 2 * num_bytes / (ms / 1e3)  # one read plus one write per byte


_RANGE = "cgtool_size_"  # the profiler range around one size's call


@dataclass(frozen=True, slots=True)
class KernelStat:
    name: str
    cuda_ms: float
    launches: int


def _kineto_profile() -> torch.autograd.profiler.profile:
    """A profiler of host ranges and GPU kernels: torch.autograd's, which
    torch.profiler.profile wraps. The wrapper's first start imports torch._inductor, and with
    it dynamo and sympy (its prepare_trace asks `hasattr(torch, "_inductor")`, a lazy import):
    that import was 5.6 of the 6.9 s a first profiler session took on the H100 host, in a
    decode-only session that compiles nothing (2026-11-24)."""
    return torch.autograd.profiler.profile(use_cpu=True, use_device="cuda", use_kineto=True)


def _is_memory_op(name: str) -> bool:
    return name.startswith(("Memcpy", "Memset", "cudaMemcpy", "cudaMemset"))


def kernels_per_call(stats: list[KernelStat]) -> int:
    return sum(s.launches for s in stats)


def profile_kernels_by_size(
    calls: Sequence[tuple[int, Callable[[], object]]], trace_path: str | None = None
) -> dict[int, list[KernelStat]]:
    """Every kernel each (size, call) launches, from one profiler session for all sizes.

    Starting the profiler costs far more than a forward, so all sizes share one session;
    each call runs alone on an idle GPU inside its own range, and a kernel belongs to the
    range its GPU start time falls in."""
    from torch.autograd.profiler import record_function

    torch.cuda.synchronize()  # the calls are warm: they were verified and timed before
    with _kineto_profile() as prof:
        for size, fn in calls:
            with record_function(f"{_RANGE}{size}"):
                fn()
                torch.cuda.synchronize()
    if trace_path:
        prof.export_chrome_trace(trace_path)
    return _kernels_in_ranges(prof.function_events, [size for size, _ in calls])


def _kernels_in_ranges(events: object, sizes: list[int]) -> dict[int, list[KernelStat]]:
    ranges = {}
    kernels = []
    for event in events:  # type: ignore[attr-defined]
        on_gpu = event.device_type == torch.autograd.DeviceType.CUDA
        if event.name.startswith(_RANGE):
            # Kineto puts each range on the GPU's timeline too, as a user annotation spanning the
            # range's kernels: counted as one, it topped every kernel table and added one to
            # every count up to benchmarks r9.
            if not on_gpu:
                ranges[int(event.name.removeprefix(_RANGE))] = event.time_range
        elif on_gpu and not _is_memory_op(event.name):
            kernels.append(event)
    result: dict[int, list[KernelStat]] = {}
    for size in sizes:
        span = ranges.get(size)
        stats: dict[str, list[float]] = {}
        for k in kernels:
            if span is not None and span.start <= k.time_range.start <= span.end:
                stats.setdefault(k.name, []).append((k.time_range.end - k.time_range.start) / 1e3)
        rows = [KernelStat(name, sum(ts), len(ts)) for name, ts in stats.items()]
        result[size] = sorted(rows, key=lambda r: -r.cuda_ms)
    return result


def process_age_s() -> float | None:
    """Seconds since this process started (interpreter, imports, CUDA set-up so far), read
    from /proc; None where there is no /proc."""
    import os

    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            # Field 22 is the start time in clock ticks after boot; the name (field 2) may hold spaces.
            start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
            up_s = float(uptime.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, up_s - start_ticks / os.sysconf("SC_CLK_TCK"))
