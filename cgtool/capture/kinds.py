"""Each graph kind's session: its runner captures the sizes, then each is verified and timed."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from cgtool.capture.measure import CaptureCost, ReplayCheck, check_replay, measure_capture
from cgtool.capture.memory import oom_request_bytes
from cgtool.capture.options import (
    CaptureFailure,
    CaptureOptions,
    CaptureProgress,
    ProgressCallback,
    SessionState,
)
from cgtool.capture.timing import host_launch_ms, kernels_per_call, profile_kernels_by_size
from cgtool.capture.workbench import Workbench
from cgtool.distributed import barrier, current_tp
from cgtool.errors import EnvironmentProblem
from cgtool.model.moe import count_active_experts
from cgtool.results import KernelRow, SizeResult
from cgtool.runners.pitfalls import diagnose_capture_error, is_capture_error
from cgtool.units import BF16_BYTES, GIB

if TYPE_CHECKING:
    from cgtool.runners.decode import DecodeGraphRunner
    from cgtool.runners.piecewise import PiecewiseGraphRunner
    from cgtool.runners.vit import VitGraphRunner


def capture_decode(
    bench: Workbench,
    opts: CaptureOptions,
    pool: Any,
    bandwidth: float,
    on_progress: ProgressCallback,
    state: SessionState,
) -> None:
    """Capture at the first hidden-state mode, then recapture at each higher one as the
    runtime does; every mode's sizes get their own rows."""
    from cgtool.runners.decode import DecodeGraphRunner

    first, *upward = opts.hidden_modes
    runner = DecodeGraphRunner(bench.runner, opts.capture_bs, opts.enable_cudagraph_gc, hidden_mode=first)
    state.runners.append(runner)  # graphs must outlive the session: they share one pool
    with state.phase("capture"), _sglang_mem_usage(state, "decode"):
        costs = _capture_sizes("decode", runner, runner.capture_bs, pool, on_progress, state, opts)
    calls = _measure_decode(bench, runner, costs, bandwidth, on_progress, state, opts)
    if calls:
        state.eager_host_ms = host_launch_ms(calls[-1][2])  # the smallest batch
    _count_kernels(state, "decode", calls, opts, on_progress, first.flag)
    for mode in upward:
        with state.phase("capture"), _sglang_mem_usage(state, f"decode:{mode.flag}"):
            costs = _capture_sizes("decode", runner, runner.capture_bs, pool, on_progress, state,
                                   opts, record_all=partial(runner.recapture, mode))
        calls = _measure_decode(bench, runner, costs, bandwidth, on_progress, state, opts)
        # Kernel tables and traces stay the first mode's: a recapture adds one copy per graph.
        _count_kernels(state, "decode", calls, replace(opts, profile=False), on_progress, mode.flag)


def _measure_decode(
    bench: Workbench, runner: DecodeGraphRunner, costs: dict[int, CaptureCost], bandwidth: float,
    on_progress: ProgressCallback, state: SessionState, opts: CaptureOptions,
) -> list[tuple[int, Callable[[], object], Callable[[], object]]]:
    """Replay against eager on every output of the runner's mode (logits, hidden states)."""
    calls = []
    mode = runner.hidden_mode.flag
    with state.phase("measure"):
        for i, (bs, cost) in enumerate(costs.items()):
            _progress(on_progress, "decode", "measure", bs, i, len(costs))
            batch = bench.decode_batch(bs)
            eager = partial(runner.eager_outputs, batch)
            replay = partial(runner.replay_outputs, batch)
            check = _measured(state, "decode", bs, partial(
                check_replay, eager=eager, replay=replay, dtype=opts.dtype,
            ), mode)
            if check is None:
                continue
            kv_read = bs * (bench.context_len + 1) * bench.cfg.kv_bytes_per_token(BF16_BYTES)
            roofline_ms = (_weights_read(bench, bs) + kv_read) / bandwidth * 1e3
            _record(state, "decode", bs, cost, check, roofline_ms, mode, _experts_active(bench, eager))
            calls.append((bs, replay, eager))
    return calls


def _experts_active(bench: Workbench, eager: Callable[[], object]) -> float | None:
    """Distinct experts a MoE layer routed this batch to, averaged over the MoE layers: one
    more eager forward, with counting on (it syncs, so it stays out of the timed calls)."""
    if bench.cfg.moe is None:
        return None
    with count_active_experts(bench.runner.model) as counts:
        eager()
    return sum(counts) / len(counts) if counts else None


def _weights_read(bench: Workbench, tokens: int) -> float:
    """Weight bytes a forward over `tokens` rows streams on this rank: all it holds for a dense
    model; for a MoE model the experts that many tokens are expected to reach."""
    if bench.cfg.moe is None:
        return float(bench.weights_bytes)
    return float(bench.cfg.weight_bytes_read(tokens))


def capture_piecewise(
    bench: Workbench,
    opts: CaptureOptions,
    pool: Any,
    bandwidth: float,
    on_progress: ProgressCallback,
    state: SessionState,
) -> None:
    from cgtool.runners.piecewise import PiecewiseGraphRunner

    runner = PiecewiseGraphRunner(
        bench.runner,
        capture_num_tokens=opts.capture_num_tokens,
        compiler=opts.compiler,
        enable_cudagraph_gc=opts.enable_cudagraph_gc,
    )
    state.runners.append(runner)
    _progress(on_progress, "piecewise", "compile", None, 0, len(opts.capture_num_tokens))
    with state.phase("compile"):
        runner.warmup()
    with state.phase("capture"), _sglang_mem_usage(state, "piecewise"):
        costs = _capture_sizes(
            "piecewise", runner, runner.capture_num_tokens, pool, on_progress, state, opts
        )
    model = bench.runner.model
    calls = []
    with state.phase("measure"):
        for i, (n, cost) in enumerate(costs.items()):
            _progress(on_progress, "piecewise", "measure", n, i, len(costs))
            batch = bench.extend_batch(n)
            eager = partial(bench.runner.forward_eager, batch)
            replay = partial(runner.replay, batch)
            # Compared on every token's final hidden state and the last token's logits; timed
            # as a server runs prefill, to the last token's logits.
            check = _measured(state, "piecewise", n, partial(
                check_replay,
                eager=partial(_with_last_logits, model, eager),
                replay=partial(_with_last_logits, model, replay),
                dtype=opts.dtype,
                timed_eager=lambda f=eager: model.compute_logits(f()[-1:]),
                timed_replay=lambda f=replay: model.compute_logits(f()[-1:]),
            ))
            if check is None:
                continue
            flops = 2 * bench.cfg.active_param_count() * n  # each token through its own experts
            bytes_ms = _weights_read(bench, n) / bandwidth * 1e3
            peak = _peak_flops()
            roofline_ms = max(bytes_ms, flops / peak * 1e3) if peak else bytes_ms
            _record(state, "piecewise", n, cost, check, roofline_ms)
            calls.append((n, replay, eager))
    _count_kernels(state, "piecewise", calls, opts, on_progress)


def _with_last_logits(model: Any, forward: Callable[[], torch.Tensor]) -> list[torch.Tensor]:
    hidden = forward()  # [num_tokens, hidden]
    return [hidden, model.compute_logits(hidden[-1:])]


@contextmanager
def _sglang_mem_usage(state: SessionState, kind: str) -> Iterator[None]:
    """SGLang's `mem usage` of a kind's capture: free memory before minus after, each read
    after emptying the allocator's cache, as its `Capture cuda graph end` line reports it."""
    torch.cuda.empty_cache()
    free_before = torch.cuda.mem_get_info()[0]
    try:
        yield
    finally:
        torch.cuda.empty_cache()
        state.sglang_mem_usage_bytes[kind] = free_before - torch.cuda.mem_get_info()[0]


def _count_kernels(
    state: SessionState, kind: str, calls: list[tuple[int, Callable[[], object], Callable[[], object]]],
    opts: CaptureOptions, on_progress: ProgressCallback, hidden_mode: str = "null",
) -> None:
    """Kernels per forward of every size from one profiler pass over the replays; with
    --profile, their tables, and a Chrome trace of each --profile-sizes size."""
    if not calls:
        return
    _progress(on_progress, kind, "profile", None, 0, 1)
    with state.phase("profile"):
        kernels = profile_kernels_by_size([(size, replay) for size, replay, _ in calls])
        for row in state.sizes:  # this process's rows: ranks are stamped when gathered
            if row.kind == kind and row.hidden_mode == hidden_mode and row.size in kernels:
                row.kernels_per_forward = kernels_per_call(kernels[row.size])
        if not opts.profile:
            return
        for size, stats in kernels.items():
            state.kernel_tables[f"{kind}:{size}"] = [
                KernelRow(k.name, k.cuda_ms, k.launches) for k in stats[:15]
            ]
        for size, replay, _ in calls:
            if size in opts.profile_sizes.get(kind, ()):
                name = f"trace_{kind}_{size}.json"
                opts.out_dir.mkdir(parents=True, exist_ok=True)
                profile_kernels_by_size([(size, replay)], str(opts.out_dir / name))
                state.chrome_traces[f"{kind}:{size}"] = name


def _capture_sizes(
    kind: str, runner: DecodeGraphRunner | PiecewiseGraphRunner | VitGraphRunner, sizes: list[int], pool: Any,
    on_progress: ProgressCallback, state: SessionState, opts: CaptureOptions,
    record_all: Callable[[Callable[..., bool]], None] | None = None,
) -> dict[int, CaptureCost]:
    """The runner's loop (`record_all`, by default its capture) records the sizes (largest
    first, GC frozen); around each this adds progress, the TP barrier, the cost and, with
    --profile, the memory history of the kind's first size."""
    costs: dict[int, CaptureCost] = {}

    def step(index: int, size: int, record: Callable[[], None]) -> bool:
        _progress(on_progress, kind, "capture", size, index, len(sizes))
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


def _measured(
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


def _record(
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


def _peak_flops() -> float | None:
    from cgtool.gpus import match_nvml_name

    spec = match_nvml_name(torch.cuda.get_device_name(0))
    return spec.bf16_flops if spec else None


def _progress(cb: Any, kind: str, phase: str, size: int | None, done: int, total: int) -> None:
    cb(CaptureProgress(kind, phase, size, done, total, torch.cuda.mem_get_info()[0]))
