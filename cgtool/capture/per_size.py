"""What every graph kind does per size: capture into the shared pool with its memory cost,
verify and time replay against eager, record the row, count kernels, report progress."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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
from cgtool.capture.sampling import SpreadPools
from cgtool.capture.timing import kernels_per_call, profile_kernels_by_size
from cgtool.documents.results import KernelRow, SampleSpread, SizeResult
from cgtool.errors import EnvironmentProblem
from cgtool.runners.pitfalls import diagnose_capture_error, is_capture_error, is_out_of_memory
from cgtool.runners.pool import freeze_gc
from cgtool.runtime.distributed import all_ranks, barrier, current_tp, eager_collectives_skipped
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


@contextmanager
def timed_sizes(state: SessionState, label: str) -> Iterator[SpreadPools]:
    """One kind's measure loop: the pools its sizes' timings share and, on leaving (a signal
    included), every row it recorded restated with the interval of the whole pool."""
    pools = SpreadPools()
    first = len(state.timed_rows)
    with measuring(state):
        try:
            yield pools
        finally:
            for row, check in state.timed_rows[first:]:
                row.eager_ci95_ms, row.replay_ci95_ms = check.eager.ci95_ms, check.replay.ci95_ms
            for (path, regime), pool in pools.pools.items():
                if pool.rel_sd is not None:
                    state.sample_spread[f"{label}:{path}:{regime}"] = SampleSpread(pool.rel_sd, pool.dof)


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
        # Read at each size: a recapture sets the runner's new mode once its loop starts.
        mode = runner.hidden_mode.flag if hasattr(runner, "hidden_mode") else "null"
        # No collective runs while a size records (those captured run at replay), so a rank
        # that runs out of memory part-way leaves its peers at the same point: past the step.
        with _memory_history(state, opts, kind, first=first), eager_collectives_skipped():
            ran_out = _capture_size(kind, record, size, pool, costs, runner.forward_static)
        if settle_out_of_memory(state, kind, size, ran_out, "capturing", mode) and size in costs:
            # A peer ran out: this rank's graph waits for collectives that peer never recorded.
            # It is never replayed, and kept alive (freeing it while its pool is captured into
            # trips PyTorch's allocator).
            del costs[size]
            runner.drop_size(size)  # type: ignore[union-attr]  # ViT graphs run at TP=1 only
        return True

    (record_all or runner.capture)(step)
    return costs


def _capture_size(
    kind: str, record: Callable[[], None], size: int, pool: Any,
    costs: dict[int, CaptureCost], forward_static: Callable[[int], object],
) -> OutOfMemory | None:
    """A size that runs out of memory is marked failed and the smaller ones are still tried:
    the report then names the largest size that fits, which is what the remedy needs."""
    try:
        costs[size] = measure_capture(record, pool)
    except RuntimeError as error:
        if is_out_of_memory(error):
            return out_of_memory(error)
        if not is_capture_error(error):
            raise
        raise diagnose_capture_error(kind, size, lambda: forward_static(size)) from error
    return None


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
    hidden_mode: str = "null", rehearse: Callable[[], object] | None = None,
) -> ReplayCheck | None:
    """The eager run beside the replay needs activation memory the graph does not: on a
    nearly full GPU it can fail where the capture fitted. With TP a rank that ran out
    mid-forward would leave its peers inside the forward's collectives, so `rehearse` (the
    eager forward) runs first with collectives skipped, leaving the caching allocator holding
    the blocks the real one needs, and the ranks agree whether the size can be measured."""
    tp_size = current_tp().size
    if tp_size > 1 and rehearse is not None and settle_out_of_memory(
        state, kind, size, _rehearsal(rehearse), "measuring", hidden_mode
    ):
        return None
    try:
        return measure()
    except torch.OutOfMemoryError as error:
        ran_out = out_of_memory(error)
        if tp_size > 1:
            raise EnvironmentProblem(
                f"out of memory measuring {kind} size {size} after its rehearsal fitted "
                f"(free {ran_out.free_bytes / GIB:.2f} GiB)",
                "With --tp this ends the run on every rank (the peers wait in its collectives): "
                "lower the largest size (--bs / --tokens) or --mem-fraction-static.",
            ) from error
        _mark_failed(state, kind, size, hidden_mode, "measuring", ran_out, "")
        return None


def warm_eager(forward: Callable[[], object]) -> None:
    """One untimed eager forward before a kind's first size is timed. Piecewise capture runs
    the compiled pieces, never the eager path, so that path's first call specialises its
    Triton kernels and grows the allocator: the first eager sample at qwen2.5-0.5b's 4,096
    tokens read about 190 ms against 11-14 ms after (benchmarks r8). Decode capture warms
    its forward on the capture stream, whose blocks the allocator keeps apart from the
    default stream's. Run at the largest size, it leaves every smaller one warm, so sizes
    can be timed smallest first. Collectives are skipped, as in a rehearsal; running out
    of memory here is left for that size's own measurement to report."""
    _rehearsal(forward)


def _rehearsal(rehearse: Callable[[], object]) -> OutOfMemory | None:
    try:
        with eager_collectives_skipped():
            rehearse()  # its outputs, wrong without the collectives, are dropped at once
    except torch.OutOfMemoryError as error:
        return out_of_memory(error)
    return None


@dataclass(frozen=True, slots=True)
class OutOfMemory:
    """What one rank read when an allocation failed."""

    free_bytes: int
    total_bytes: int
    shortfall_bytes: int  # the allocation that failed: at least this much more was needed


def out_of_memory(error: RuntimeError) -> OutOfMemory:
    gc.collect()  # the failed attempt's tensors, so the next size starts from the same memory
    free, total = torch.cuda.mem_get_info()
    return OutOfMemory(free, total, oom_request_bytes(str(error)))


def settle_out_of_memory(
    state: SessionState, kind: str, size: int, ran_out: OutOfMemory | None, doing: str,
    hidden_mode: str = "null",
) -> bool:
    """Whether `size` ran out of memory on any rank; if so it is marked failed, on every rank
    alike. With TP every rank must call this at the same point (it is a collective)."""
    tp = current_tp()
    if tp.size == 1:
        first = None if ran_out is None else (0, ran_out)
    else:
        first = _first_rank_out_of_memory(ran_out)
    if first is None:
        return False
    rank, reading = first
    _mark_failed(state, kind, size, hidden_mode, doing, reading, f" on rank {rank}" if tp.size > 1 else "")
    return True


def _first_rank_out_of_memory(ran_out: OutOfMemory | None) -> tuple[int, OutOfMemory] | None:
    mine = [0, 0, 0, 0] if ran_out is None else [
        1, ran_out.free_bytes, ran_out.total_bytes, ran_out.shortfall_bytes]
    for rank, (failed, free, total, shortfall) in enumerate(all_ranks(mine)):
        if failed:
            return rank, OutOfMemory(free, total, shortfall)
    return None


def _mark_failed(
    state: SessionState, kind: str, size: int, hidden_mode: str, doing: str, reading: OutOfMemory,
    on_rank: str,
) -> None:
    state.sizes.append(_failed_row(kind, size, hidden_mode))
    if state.failed is None:
        state.failed = CaptureFailure(kind, size, reading.free_bytes, reading.shortfall_bytes, reading.total_bytes)
        state.incomplete_reason = (
            f"out of memory {doing} {kind} size {size}{on_rank} (free {reading.free_bytes / GIB:.2f} GiB)"
        )


def record_size(
    state: SessionState, kind: str, size: int, cost: CaptureCost, check: ReplayCheck,
    roofline_ms: float, hidden_mode: str = "null", experts_active: float | None = None,
    mla_chunks_redone: int | None = None,
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
            mla_chunks_redone=mla_chunks_redone,
            eager_samples=len(check.eager.samples),
            replay_samples=len(check.replay.samples),
        )
    )
    state.timed_rows.append((state.sizes[-1], check))


def _failed_row(kind: str, size: int, hidden_mode: str = "null") -> SizeResult:
    return SizeResult(
        kind=kind, size=size, capture_s=0.0, retained_bytes=0, peak_bytes=0,  # type: ignore[arg-type]
        non_torch_bytes=0, eager_ms=None, replay_ms=None, speedup=None,
        kernels_per_forward=0, max_abs_diff=None, status="failed", hidden_mode=hidden_mode,
    )


def peak_flops() -> float | None:
    from cgtool.specs.gpus import match_nvml_name

    spec = match_nvml_name(torch.cuda.get_device_name(0))
    return spec.bf16_flops if spec else None


def report_progress(cb: Any, kind: str, phase: str, size: int | None, done: int, total: int) -> None:
    cb(CaptureProgress(kind, phase, size, done, total, torch.cuda.mem_get_info()[0]))
