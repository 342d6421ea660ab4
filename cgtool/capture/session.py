"""One capture session: load, size the KV pool, capture every size, verify and time each."""

from __future__ import annotations

import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from cgtool import __version__
from cgtool.capture.kinds import capture_decode, capture_piecewise
from cgtool.capture.memory import MemoryReading, device_info, read_memory
from cgtool.capture.options import (  # require_cuda is looked up on this module: CPU tests replace it
    CaptureOptions,
    CaptureProgress,
    ProgressCallback,
    SessionState,
    require_cuda,
)
from cgtool.capture.per_size import run_kernel_counts
from cgtool.capture.ranks import gather_ranks
from cgtool.capture.timing import copy_bandwidth_bytes_s, process_age_s
from cgtool.capture.workbench import Workbench, build_workbench
from cgtool.documents.provenance import collect_provenance
from cgtool.documents.results import (
    Artifacts,
    CaptureReport,
    CaptureSettings,
    CaptureTotals,
    Environment,
    ModelInfo,
)
from cgtool.errors import ConfigError, EnvironmentProblem
from cgtool.runtime.dependent_launch import in_effect
from cgtool.runtime.distributed import TensorParallel, connect_collectives, current_tp
from cgtool.specs.config import ModelConfig, load_model_config


def zero_totals() -> CaptureTotals:
    return CaptureTotals(
        weights_bytes=0, kv_pool_bytes=0, kv_tokens=0, graph_pool_bytes=0, peak_bytes=0,
        free_before_capture_bytes=0, free_after_capture_bytes=0, capture_s=0.0, non_torch_bytes=0,
    )


def resolve_model(model: str, random_weights: bool) -> tuple[ModelConfig, Path | None]:
    cfg = load_model_config(model)
    folder = Path(model) if Path(model).is_dir() else None
    if folder is None or random_weights:
        return cfg, None
    if not any(folder.glob("*.safetensors")):
        raise ConfigError(
            f"{folder}: no *.safetensors weights found",
            "Pass --random-weights to profile with random weights of the same shapes.",
        )
    return cfg, folder


def environment() -> Environment:
    info = device_info()
    return Environment(
        gpu_name=info["gpu_name"],
        gpu_memory_bytes=info["gpu_memory_bytes"],
        driver=info["driver"],
        cuda=str(torch.version.cuda),
        torch=torch.__version__,
        cgtool=__version__,
        hostname=socket.gethostname(),
        dependent_launch=in_effect(torch.device("cuda", torch.cuda.current_device())),
    )


def model_info(cfg: ModelConfig, dtype: torch.dtype) -> ModelInfo:
    return ModelInfo(
        name=cfg.name,
        architecture=cfg.architecture,
        config_hash=cfg.config_hash(),
        dtype=str(dtype).removeprefix("torch."),
        param_bytes=cfg.weight_bytes(torch.finfo(dtype).bits // 8),
        num_layers=cfg.num_layers,
    )


def settings_of(opts: CaptureOptions) -> CaptureSettings:
    return CaptureSettings(
        kinds=list(opts.kinds),  # type: ignore[arg-type]
        capture_bs=opts.capture_bs,
        capture_num_tokens=opts.capture_num_tokens,
        compiler=opts.compiler,  # type: ignore[arg-type]
        mem_fraction_static=opts.mem_fraction_static,
        attention_backend="sdpa" if opts.kinds == ("vit",) else "triton",
        context_len=opts.context_len,
        enable_cudagraph_gc=opts.enable_cudagraph_gc,
        tp_size=opts.tp_size,
        hidden_states=[mode.flag for mode in opts.hidden_modes],
        moe_backend=opts.moe_backend,
        image_sizes=[list(size) for size in opts.image_sizes],
        prefill_backend=opts.prefill_backend,  # type: ignore[arg-type]
    )


def run_capture(opts: CaptureOptions, on_progress: ProgressCallback, state: SessionState) -> CaptureReport:
    """Capture and measure every size; `state` keeps what was gathered if this stops early."""
    from cgtool.runners.pool import get_global_graph_memory_pool

    note_startup(state)
    require_cuda()
    tp = current_tp()
    cfg, weights_dir = resolve_model(opts.model, opts.random_weights)
    state.cfg = cfg
    _check_sizes(cfg, opts)
    on_progress(CaptureProgress("", "load", None, 0, 1, torch.cuda.mem_get_info()[0]))
    with state.phase("load"):
        bench, bandwidth = _load(cfg, weights_dir, opts, tp)
    pool = get_global_graph_memory_pool()
    torch.cuda.empty_cache()  # free memory read without the allocator's cached blocks, as SGLang does
    before = read_memory(pool)
    state.totals = CaptureTotals(
        weights_bytes=bench.weights_bytes, kv_pool_bytes=bench.runner.kv_pool.nbytes,
        kv_tokens=bench.kv_tokens, graph_pool_bytes=0, peak_bytes=0,
        free_before_capture_bytes=before.free_bytes, free_after_capture_bytes=before.free_bytes,
        capture_s=0.0, non_torch_bytes=0, copy_bandwidth_bytes_s=bandwidth,
    )
    if "piecewise" in opts.kinds:
        capture_piecewise(bench, opts, pool, bandwidth, on_progress, state)
    if "decode" in opts.kinds and state.incomplete_reason is None:
        capture_decode(bench, opts, pool, bandwidth, on_progress, state)
    run_kernel_counts(state)
    totals = totals_after_capture(pool, before, state)
    if tp.size > 1:
        gather_ranks(state, totals)
    return build_report(opts, cfg, state, totals)


def note_startup(state: SessionState) -> None:
    """The `startup` phase: process start (interpreter, imports) to the session's start."""
    age = process_age_s()
    if age is not None:
        state.phase_s.setdefault("startup", age)


def totals_after_capture(pool: Any, before: MemoryReading, state: SessionState) -> CaptureTotals:
    """The session's totals once every kind is captured: `state.totals` (set after loading)
    with the pool's growth, the peak and what the runners and the allocator added."""
    torch.cuda.empty_cache()
    after = read_memory(pool)
    pool_growth = after.pool_bytes - before.pool_bytes
    static = sum(r.static_buffer_bytes for r in state.runners)  # type: ignore[attr-defined]
    return replace(
        state.totals or zero_totals(),
        graph_pool_bytes=pool_growth,
        peak_bytes=torch.cuda.max_memory_reserved(),
        free_after_capture_bytes=after.free_bytes,
        capture_s=state.phase_s.get("capture", 0.0),
        non_torch_bytes=after.non_torch_bytes - before.non_torch_bytes,
        static_buffer_bytes=static,
        other_torch_bytes=after.reserved_bytes - before.reserved_bytes - pool_growth - static,
    )


def _load(
    cfg: ModelConfig, weights_dir: Path | None, opts: CaptureOptions, tp: TensorParallel
) -> tuple[Workbench, float]:

    max_bs = max(opts.capture_bs, default=1) if "decode" in opts.kinds else 1
    max_tokens = max(opts.capture_num_tokens, default=16) if "piecewise" in opts.kinds else 16
    bench = build_workbench(
        cfg,
        weights_dir=weights_dir,
        dtype=opts.dtype,
        mem_fraction_static=opts.mem_fraction_static,
        max_bs=max_bs,
        max_tokens=max_tokens,
        context_len=opts.context_len,
        seed=opts.seed,
        kv_tokens=opts.max_total_tokens,
        tp=tp,
        moe_backend=opts.moe_backend,
    )
    connect_collectives([1, max_bs, max_tokens], cfg.hidden_size, opts.dtype)
    return bench, copy_bandwidth_bytes_s()


def build_report(
    opts: CaptureOptions,
    cfg: ModelConfig | None,
    state: SessionState,
    totals: CaptureTotals,
) -> CaptureReport:
    """`state.model` names the model when it is no language model (a vision tower)."""
    totals.phase_s = dict(state.phase_s)
    totals.sglang_mem_usage_bytes = dict(state.sglang_mem_usage_bytes)
    totals.eager_host_us_per_kernel = _host_us_per_kernel(state)
    totals.plain_torch_host_us_per_kernel = state.plain_torch_host_us
    totals.compile_cache = state.compile_cache
    totals.sample_spread = dict(state.sample_spread)
    snapshots = dict(state.memory_snapshots)
    traces = dict(state.chrome_traces)
    return CaptureReport(
        environment=environment(),
        model=state.model or model_info(cfg, opts.dtype),  # type: ignore[arg-type]
        settings=settings_of(opts),
        sizes=state.sizes,
        totals=totals,
        artifacts=Artifacts(
            memory_snapshot=next(iter(snapshots.values()), None),
            chrome_trace=next(iter(traces.values()), None),
            kernel_tables=state.kernel_tables,
            memory_snapshots=snapshots,
            chrome_traces=traces,
        ),
        status="incomplete" if state.incomplete_reason else "complete",
        incomplete_reason=state.incomplete_reason,
        rank_totals=state.rank_totals,
        provenance=collect_provenance(),
    )


def _host_us_per_kernel(state: SessionState) -> float | None:
    """Host time per kernel of the smallest eager decode step: the eager path's overhead."""
    rows = [s for s in state.sizes if s.kind == "decode" and s.kernels_per_forward and s.rank == 0]
    if state.eager_host_ms is None or not rows:
        return None
    return state.eager_host_ms * 1e3 / min(rows, key=lambda s: s.size).kernels_per_forward


def partial_report(opts: CaptureOptions, state: SessionState, reason: str) -> CaptureReport | None:
    """What was measured before an interruption, marked incomplete; None if nothing was loaded
    (state.cfg and state.model are set only once a GPU session has begun)."""
    if state.cfg is None and state.model is None:
        return None
    where = f" during {state.stopped_in}" if state.stopped_in else ""
    state.incomplete_reason = f"{reason}{where}"
    return build_report(opts, state.cfg, state, state.totals or zero_totals())


def checkpoint_report(opts: CaptureOptions, state: SessionState, phase: str) -> CaptureReport | None:
    """The report as it stands when `phase` begins, marked incomplete, without touching the
    session's own state: what stays on disk if the process dies inside the phase, where no
    handler runs (SIGKILL after a grace period, a crash in the driver or the profiler)."""
    if state.cfg is None and state.model is None:
        return None
    report = build_report(opts, state.cfg, state, replace(state.totals or zero_totals()))
    report.status = "incomplete"
    report.incomplete_reason = "; ".join(filter(None, (
        state.incomplete_reason,
        f"the session ended during {phase} without saving again (killed or crashed)",
    )))
    return report


def _check_sizes(cfg: ModelConfig, opts: CaptureOptions) -> None:
    too_long = [n for n in opts.capture_num_tokens if n > cfg.max_context_len]
    if too_long:
        raise EnvironmentProblem(
            f"token count {too_long[0]} is above {cfg.name}'s context length {cfg.max_context_len}",
            "Drop it from --tokens or lower --max-tokens.",
        )
