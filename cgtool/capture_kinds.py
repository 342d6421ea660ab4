"""The sizes loop of each graph kind: capture largest first, then verify and time each size."""

from __future__ import annotations

import gc
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from cgtool.distributed import barrier, current_tp
from cgtool.errors import EnvironmentProblem
from cgtool.measure import CaptureCost, ReplayCheck, check_replay, kernel_count, measure_capture
from cgtool.results import KernelRow, SizeResult
from cgtool.runners.pitfalls import diagnose_capture_error, is_capture_error
from cgtool.runners.pool import freeze_gc

if TYPE_CHECKING:
    from cgtool.capture import CaptureOptions, ProgressCallback, SessionState
    from cgtool.workbench import Workbench


def capture_decode(
    bench: Workbench,
    opts: CaptureOptions,
    pool: Any,
    bandwidth: float,
    on_progress: ProgressCallback,
    state: SessionState,
) -> None:
    from cgtool.runners.decode import DecodeGraphRunner

    runner = DecodeGraphRunner(bench.runner, opts.capture_bs, opts.enable_cudagraph_gc)
    state.runners.append(runner)  # graphs must outlive the session: they share one pool
    costs = _capture_sizes(
        "decode", runner.capture_one, runner.capture_bs, pool, on_progress, state,
        opts.enable_cudagraph_gc, runner.forward_static,
    )
    model = bench.runner.model
    for i, (bs, cost) in enumerate(costs.items()):
        _progress(on_progress, "decode", "measure", bs, i, len(costs))
        batch = bench.decode_batch(bs)
        check = _measured(state, "decode", bs, lambda: check_replay(
            eager=lambda: model.compute_logits(bench.runner.forward_eager(batch)),
            replay=lambda: runner.replay(batch),
            dtype=opts.dtype,
            trace_path=_trace_path(opts, state, "decode", bs),
        ))
        if check is None:
            continue
        kv_read = bs * (bench.context_len + 1) * bench.cfg.kv_bytes_per_token(2)
        roofline_ms = (bench.weights_bytes + kv_read) / bandwidth * 1e3
        _record(state, "decode", bs, cost, check, roofline_ms, opts.profile)


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
    runner.warmup()
    sizes = sorted(set(opts.capture_num_tokens))
    costs = _capture_sizes(
        "piecewise", runner.capture_one, sizes, pool, on_progress, state, opts.enable_cudagraph_gc,
        runner.forward_static,
    )
    model = bench.runner.model
    for i, (n, cost) in enumerate(costs.items()):
        _progress(on_progress, "piecewise", "measure", n, i, len(costs))
        batch = bench.extend_batch(n)
        check = _measured(state, "piecewise", n, lambda: check_replay(
            eager=lambda: model.compute_logits(bench.runner.forward_eager(batch)[-1:]),
            replay=lambda: model.compute_logits(runner.replay(batch)[-1:]),
            dtype=opts.dtype,
            trace_path=_trace_path(opts, state, "piecewise", n),
        ))
        if check is None:
            continue
        flops = 2 * bench.cfg.param_count() * n
        bytes_ms = bench.weights_bytes / bandwidth * 1e3
        roofline_ms = max(bytes_ms, flops / _peak_flops() * 1e3) if _peak_flops() else bytes_ms
        _record(state, "piecewise", n, cost, check, roofline_ms, opts.profile)


def _capture_sizes(
    kind: str, capture_one: Any, sizes: list[int], pool: Any, on_progress: Any,
    state: SessionState, enable_gc: bool, forward_static: Callable[[int], object] | None = None,
) -> dict[int, CaptureCost]:
    """Largest first, as SGLang does: later, smaller graphs reuse the first one's pool memory.

    GC is collected once and frozen for the whole loop, not per size (a collection costs
    tens of milliseconds with a model loaded)."""
    costs: dict[int, CaptureCost] = {}
    ordered = sorted(sizes, reverse=True)
    with freeze_gc(enable_gc):
        _capture_each(kind, capture_one, ordered, pool, on_progress, state, costs, forward_static)
    return costs


def _capture_each(
    kind: str, capture_one: Any, ordered: list[int], pool: Any, on_progress: Any,
    state: SessionState, costs: dict[int, CaptureCost],
    forward_static: Callable[[int], object] | None = None,
) -> None:
    """A size that runs out of memory is marked failed and the smaller ones are still tried:
    the report then names the largest size that fits, which is what the remedy needs."""
    for i, size in enumerate(ordered):
        _progress(on_progress, kind, "capture", size, i, len(ordered))
        barrier()  # with TP, every rank records the same size together (NCCL needs it)
        try:
            costs[size] = measure_capture(lambda: capture_one(size), pool)
        except torch.OutOfMemoryError as oom:
            _note_out_of_memory(state, kind, size, str(oom))
        except RuntimeError as error:
            if forward_static is None or not is_capture_error(error):
                raise
            raise diagnose_capture_error(kind, size, lambda: forward_static(size)) from error


def _measured(
    state: SessionState, kind: str, size: int, measure: Callable[[], ReplayCheck]
) -> ReplayCheck | None:
    """The eager run beside the replay needs activation memory the graph does not: on a
    nearly full GPU it can fail where the capture fitted."""
    try:
        return measure()
    except torch.OutOfMemoryError as oom:
        _note_out_of_memory(state, kind, size, str(oom), doing="measuring")
        return None


def _note_out_of_memory(
    state: SessionState, kind: str, size: int, message: str, doing: str = "capturing"
) -> None:
    from cgtool.capture import CaptureFailure

    gc.collect()  # the failed attempt's tensors, so the next size starts from the same memory
    free, total = torch.cuda.mem_get_info()
    if current_tp().size > 1:
        # The other ranks have issued collectives this one never will: no size can follow.
        raise EnvironmentProblem(
            f"out of memory {doing} {kind} size {size} (free {free / (1 << 30):.2f} GiB)",
            "With --tp a size that does not fit ends the run on every rank: lower the largest "
            "size (--bs / --tokens) or --mem-fraction-static.",
        )
    state.sizes.append(_failed_row(kind, size))
    if state.failed is None:
        state.failed = CaptureFailure(kind, size, free, _tried_bytes(message), total)
        state.incomplete_reason = (
            f"out of memory {doing} {kind} size {size} (free {free / (1 << 30):.2f} GiB)"
        )


_TRIED = re.compile(r"Tried to allocate ([0-9.]+) (B|KiB|MiB|GiB|TiB)")
_UNIT = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def _tried_bytes(message: str) -> int:
    """The size of the allocation PyTorch's out-of-memory message names (0 if it names none)."""
    match = _TRIED.search(message)
    return int(float(match.group(1)) * _UNIT[match.group(2)]) if match else 0


def _record(
    state: SessionState,
    kind: str,
    size: int,
    cost: CaptureCost,
    check: ReplayCheck,
    roofline_ms: float,
    keep_kernels: bool,
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
            kernels_per_forward=kernel_count(check),
            max_abs_diff=check.max_abs_diff,
            status="ok" if check.safe else "unsafe",
            roofline_ms=roofline_ms,
        )
    )
    if keep_kernels:
        state.kernel_tables[f"{kind}:{size}"] = [
            KernelRow(k.name, k.cuda_ms, k.launches) for k in check.kernels[:15]
        ]


def _failed_row(kind: str, size: int) -> SizeResult:
    return SizeResult(
        kind=kind, size=size, capture_s=0.0, retained_bytes=0, peak_bytes=0,  # type: ignore[arg-type]
        non_torch_bytes=0, eager_ms=None, replay_ms=None, speedup=None,
        kernels_per_forward=0, max_abs_diff=None, status="failed",
    )


def _trace_path(opts: CaptureOptions, state: SessionState, kind: str, size: int) -> str | None:
    if not opts.profile or state.chrome_trace is not None:
        return None
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    state.chrome_trace = f"trace_{kind}_{size}.json"
    return str(opts.out_dir / state.chrome_trace)


def _peak_flops() -> float | None:
    from cgtool.gpus import match_nvml_name

    spec = match_nvml_name(torch.cuda.get_device_name(0))
    return spec.bf16_flops if spec else None


def _progress(cb: Any, kind: str, phase: str, size: int | None, done: int, total: int) -> None:
    from cgtool.capture import CaptureProgress

    cb(CaptureProgress(kind, phase, size, done, total, torch.cuda.mem_get_info()[0]))
