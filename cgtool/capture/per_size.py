"""What every graph kind does per size: capture into the shared pool with its memory cost,
verify and time replay against eager, record the row, count kernels, report progress."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from cgtool.capture.measure import CaptureCost, ReplayCheck, measure_capture
from cgtool.capture.memory import oom_request_bytes
from cgtool.capture.options import (
    CaptureFailure,
    CaptureOptions,
    CaptureProgress,
    ProgressCallback,
    SessionState,
)
from cgtool.capture.timing import kernels_per_call, profile_kernels_by_size
from cgtool.distributed import barrier, current_tp
from cgtool.errors import EnvironmentProblem
from cgtool.results import KernelRow, SizeResult
from cgtool.runners.pitfalls import diagnose_capture_error, is_capture_error
from cgtool.runners.pool import freeze_gc
from cgtool.units import GIB

if TYPE_CHECKING:
    from cgtool.runners.decode import DecodeGraphRunner
    from cgtool.runners.piecewise import PiecewiseGraphRunner
    from cgtool.runners.vit import VitGraphRunner


# (size, its replay, its eager run): the calls of a kind measured, kept for counting kernels.
MeasuredCall = tuple[int, Callable[[], object], Callable[[], object]]


@contextmanager
def sglang_mem_usage(state: SessionState, kind: str) -> Iterator[None]:
    """SGLang's `mem usage` of a kind's capture: free memory before minus after, each read
    after emptying the allocator's cache, as its `Capture cuda graph end` line reports it."""
    torch.cuda.empty_cache()
    free_before = torch.cuda.mem_get_info()[0]
    try:
        yield
    finally:
        torch.cuda.empty_cache()
        state.sglang_mem_usage_bytes[kind] = free_before - torch.cuda.mem_get_info()[0]


@contextmanager
def measuring(state: SessionState) -> Iterator[None]:
    """The measure phase, with the garbage collector frozen but not run first: a collection
    over a loaded model's objects pauses the host for tens of milliseconds, which one eager
    step would otherwise be timed with (issue 14: eager bs 1 ranged 16-46 ms in one run)."""
    with state.phase("measure"), freeze_gc(enable_cudagraph_gc=False, collect=False):
        yield


def count_kernels(
    state: SessionState, kind: str, calls: list[MeasuredCall],
    opts: CaptureOptions, on_progress: ProgressCallback, graph_kernels: Callable[[int], int | None],
    hidden_mode: str = "null",
) -> None:
    """Kernels per replay of every size, read from the graphs; with --profile, from one
    profiler pass over the replays, with their tables and a Chrome trace of each
    --profile-sizes size. What a replay runs outside its graphs (piecewise attention, a
    decode input's dtype cast) is counted once, by profiling the smallest and largest size.

    The profiling waits for `run_kernel_counts` at the end of the session: once a profiler
    has run, CUPTI stays attached to the process and every later launch pays for it (on the
    H100, a decode-only session measured eager bs 1 at 14 ms and replay at 6.19 ms, while the
    same sizes measured after piecewise's kernel count took 26 and 6.59 ms). The graphs'
    counts are read now, before a recapture replaces them."""
    if not calls:
        return
    in_graphs = {size: graph_kernels(size) for size, _, _ in calls}
    state.pending_kernel_counts.append(
        partial(_count_now, state, kind, calls, opts, on_progress, in_graphs, hidden_mode)
    )


def run_kernel_counts(state: SessionState) -> None:
    """The kernel counts `count_kernels` deferred, once every size of every kind is measured."""
    while state.pending_kernel_counts:
        state.pending_kernel_counts.pop(0)()


def _count_now(
    state: SessionState, kind: str, calls: list[MeasuredCall], opts: CaptureOptions,
    on_progress: ProgressCallback, in_graphs: dict[int, int | None], hidden_mode: str,
) -> None:
    report_progress(on_progress, kind, "profile", None, 0, 1)
    with state.phase("profile"):
        if opts.profile:
            counts = _profile_all(state, kind, calls, opts)
        else:
            counts = _counts_from_graphs(calls, in_graphs)
        for row in state.sizes:  # this process's rows: ranks are stamped when gathered
            if row.kind == kind and row.hidden_mode == hidden_mode and row.size in counts:
                row.kernels_per_forward = counts[row.size]


def _counts_from_graphs(calls: list[MeasuredCall], in_graphs: dict[int, int | None]) -> dict[int, int]:
    """Graph kernels plus those the replay runs outside them, from profiling the smallest and
    the largest size; every size is profiled where the two disagree or a graph
    cannot be read (a torch without keep_graph)."""
    if None in in_graphs.values():
        return _profiled_counts(calls)
    probes = [calls[0], calls[-1]] if len(calls) > 1 else calls[:1]
    profiled = _profiled_counts(probes)
    between = {profiled[size] - in_graphs[size] for size in profiled}  # type: ignore[operator]
    if len(between) != 1:
        return _profiled_counts(calls)
    extra = between.pop()
    return {size: n + extra for size, n in in_graphs.items()}  # type: ignore[operator]


def _profiled_counts(calls: list[MeasuredCall]) -> dict[int, int]:
    kernels = profile_kernels_by_size([(size, replay) for size, replay, _ in calls])
    return {size: kernels_per_call(stats) for size, stats in kernels.items()}


def _profile_all(
    state: SessionState, kind: str, calls: list[MeasuredCall],
    opts: CaptureOptions,
) -> dict[int, int]:
    kernels = profile_kernels_by_size([(size, replay) for size, replay, _ in calls])
    for size, stats in kernels.items():
        state.kernel_tables[f"{kind}:{size}"] = [KernelRow(k.name, k.cuda_ms, k.launches) for k in stats[:15]]
    for size, replay, _ in calls:
        if size in opts.profile_sizes.get(kind, ()):
            name = f"trace_{kind}_{size}.json"
            opts.out_dir.mkdir(parents=True, exist_ok=True)
            profile_kernels_by_size([(size, replay)], str(opts.out_dir / name))
            state.chrome_traces[f"{kind}:{size}"] = name
    return {size: kernels_per_call(stats) for size, stats in kernels.items()}


def capture_each_size(
    kind: str, runner: DecodeGraphRunner | PiecewiseGraphRunner | VitGraphRunner, sizes: list[int], pool: Any,
    on_progress: ProgressCallback, state: SessionState, opts: CaptureOptions,
    record_all: Callable[[Callable[..., bool]], None] | None = None,
) -> dict[int, CaptureCost]:
    """The runner's loop (`record_all`, by default its capture) records the sizes (largest
    first, GC frozen); around each this adds progress, the TP barrier, the cost and, with
    --profile, the memory history of the kind's first size."""
    costs: dict[int, CaptureCost] = {}

    def step(index: int, size: int, record: Callable[[], None]) -> bool:
        report_progress(on_progress, kind, "capture", size, index, len(sizes))
        barrier()  # with TP, every rank records the same size together (NCCL needs it)
        first = index == 0 and kind not in state.memory_snapshots  # not again on a recapture
        with _memory_history(state, opts, kind, first=first):
            # Read at each size: a recapture sets the runner's new mode once its loop starts.
            mode = runner.hidden_mode.flag if hasattr(runner, "hidden_mode") else "null"
            _capture_size(kind, record, size, pool, state, costs, runner.forward_static, mode)
        return True

    (record_all or runner.capture)(step)
    return costs


def _capture_size(
    kind: str, record: Callable[[], None], size: int, pool: Any, state: SessionState,
    costs: dict[int, CaptureCost], forward_static: Callable[[int], object], hidden_mode: str = "null",
) -> None:
    """A size that runs out of memory is marked failed and the smaller ones are still tried:
    the report then names the largest size that fits, which is what the remedy needs."""
    try:
        costs[size] = measure_capture(record, pool)
    except torch.OutOfMemoryError as oom:
        _note_out_of_memory(state, kind, size, str(oom), hidden_mode=hidden_mode)
    except RuntimeError as error:
        if not is_capture_error(error):
            raise
        raise diagnose_capture_error(kind, size, lambda: forward_static(size)) from error


@contextmanager
def _memory_history(state: SessionState, opts: CaptureOptions, kind: str, first: bool) -> Iterator[None]:
    """With --profile, the allocator's history around the first (largest) capture of a kind:
    recorded through a whole session it made captures ten times slower (issue 14)."""
    if not (opts.profile and first):
        yield
        return
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        yield
    finally:
        opts.out_dir.mkdir(parents=True, exist_ok=True)
        name = f"memory_{kind}.pickle"
        torch.cuda.memory._dump_snapshot(str(opts.out_dir / name))
        torch.cuda.memory._record_memory_history(enabled=None)
        state.memory_snapshots[kind] = name


def measured(
    state: SessionState, kind: str, size: int, measure: Callable[[], ReplayCheck],
    hidden_mode: str = "null",
) -> ReplayCheck | None:
    """The eager run beside the replay needs activation memory the graph does not: on a
    nearly full GPU it can fail where the capture fitted."""
    try:
        return measure()
    except torch.OutOfMemoryError as oom:
        _note_out_of_memory(state, kind, size, str(oom), doing="measuring", hidden_mode=hidden_mode)
        return None


def _note_out_of_memory(
    state: SessionState, kind: str, size: int, message: str, doing: str = "capturing",
    hidden_mode: str = "null",
) -> None:
    gc.collect()  # the failed attempt's tensors, so the next size starts from the same memory
    free, total = torch.cuda.mem_get_info()
    what = f"out of memory {doing} {kind} size {size} (free {free / GIB:.2f} GiB)"
    if current_tp().size > 1:
        # The other ranks have issued collectives this one never will: no size can follow.
        raise EnvironmentProblem(
            what,
            "With --tp a size that does not fit ends the run on every rank: lower the largest "
            "size (--bs / --tokens) or --mem-fraction-static.",
        )
    state.sizes.append(_failed_row(kind, size, hidden_mode))
    if state.failed is None:
        state.failed = CaptureFailure(kind, size, free, oom_request_bytes(message), total)
        state.incomplete_reason = what


def record_size(
    state: SessionState, kind: str, size: int, cost: CaptureCost, check: ReplayCheck,
    roofline_ms: float, hidden_mode: str = "null", experts_active: float | None = None,
) -> None:
    state.sizes.append(
        SizeResult(
            kind=kind,  # type: ignore[arg-type]
            size=size,
            capture_s=cost.capture_s,
            retained_bytes=cost.retained_bytes,
            peak_bytes=cost.peak_bytes,
            non_torch_bytes=cost.non_torch_bytes,
            eager_ms=check.eager_ms,
            replay_ms=check.replay_ms,
            speedup=check.eager_ms / check.replay_ms,
            kernels_per_forward=0,  # counted for all sizes at once afterwards
            max_abs_diff=check.max_abs_diff,
            status="ok" if check.safe else "unsafe",
            roofline_ms=roofline_ms,
            eager_ci95_ms=check.eager.ci95_ms,
            replay_ci95_ms=check.replay.ci95_ms,
            max_diff_at=check.worst_token,
            hidden_mode=hidden_mode,
            experts_active=experts_active,
        )
    )


def _failed_row(kind: str, size: int, hidden_mode: str = "null") -> SizeResult:
    return SizeResult(
        kind=kind, size=size, capture_s=0.0, retained_bytes=0, peak_bytes=0,  # type: ignore[arg-type]
        non_torch_bytes=0, eager_ms=None, replay_ms=None, speedup=None,
        kernels_per_forward=0, max_abs_diff=None, status="failed", hidden_mode=hidden_mode,
    )


def peak_flops() -> float | None:
    from cgtool.gpus import match_nvml_name

    spec = match_nvml_name(torch.cuda.get_device_name(0))
    return spec.bf16_flops if spec else None


def report_progress(cb: Any, kind: str, phase: str, size: int | None, done: int, total: int) -> None:
    cb(CaptureProgress(kind, phase, size, done, total, torch.cuda.mem_get_info()[0]))
