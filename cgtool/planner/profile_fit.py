"""Cost tables fitted to a capture report: measured sizes, the roofline filling the rest.

A report's step times include attention at its context length, which is taken out to leave the
dense part that schedules change; its graph pool rescales the roofline's pool estimates.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cgtool.specs.config import ModelConfig
from cgtool.errors import InputError
from cgtool.specs.gpus import GpuSpec
from cgtool.planner.cost import (
    CostModel,
    decode_pool_bytes_at,
    extend_pool_bytes_at,
    roofline_cost,
)


def _interpolate(sizes: np.ndarray, values: np.ndarray, length: int) -> np.ndarray:
    """Linear between measured sizes, flat below the first, beyond the last extended along
    the slope of the last two (eager cost keeps growing past the captured range)."""
    grid = np.arange(length, dtype=np.float64)
    table = np.interp(grid, sizes, values)
    if len(sizes) >= 2 and sizes[-1] > sizes[-2]:
        slope = max((values[-1] - values[-2]) / (sizes[-1] - sizes[-2]), 0.0)
        beyond = grid > sizes[-1]
        table[beyond] = values[-1] + slope * (grid[beyond] - sizes[-1])
    # A larger size computes more rows and cannot be faster; a dip is timing noise, and the
    # optimiser relies on tables that never fall.
    return np.maximum.accumulate(table)


def _rank0_ok(report: dict[str, Any]) -> list[dict[str, Any]]:
    # A tensor-parallel report holds a row per rank and size; its totals are rank 0's, and the
    # ranks step together (every all-reduce waits for all), so rank 0 stands for the server.
    rows = report.get("sizes", [])
    return [r for r in rows if r.get("status") == "ok" and r.get("rank", 0) == 0]


def _measured_rows(report: dict[str, Any], kind: str, source: str) -> dict[str, np.ndarray]:
    rows = [r for r in _rank0_ok(report) if r.get("kind") == kind]
    rows.sort(key=lambda r: r["size"])
    fields = ("size", "eager_ms", "replay_ms", "capture_s", "retained_bytes", "non_torch_bytes")
    try:
        return {f: np.array([float(r[f]) for r in rows]) for f in fields}
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(
            f"{source}: a '{kind}' size lacks a numeric {exc}",
            "Re-run `cgtool capture` to rewrite the report.",
        ) from None


def profile_cost(
    report: dict[str, Any],
    cfg: ModelConfig,
    gpu: GpuSpec,
    *,
    max_bs: int,
    max_tokens: int,
    source: str,
    tp_size: int = 1,
) -> CostModel:
    """Tables from a capture report's measured sizes, the roofline filling what it lacks."""
    base = roofline_cost(cfg, gpu, max_bs=max_bs, max_tokens=max_tokens, tp_size=tp_size)
    decode = _measured_rows(report, "decode", source)
    piecewise = _measured_rows(report, "piecewise", source)
    if not len(decode["size"]) and not len(piecewise["size"]):
        if report.get("memory_proof"):
            # A verify whose sample had too few steps to time a kind: its proven fraction still
            # counts (cgtool.planner.proven); the step times stay the roofline's.
            return base
        raise InputError(
            f"{source}: no size was captured successfully", "Plan without --profile, or re-capture."
        )
    context_len = float(report.get("settings", {}).get("context_len", 0) or 0)
    tables: dict[str, Any] = {}
    if len(decode["size"]):
        # Measured at context_len per request: take that attention read out of the dense part.
        attention = base.kv_read_ms_per_token * decode["size"] * context_len
        for name, column in (("decode_graph_ms", "replay_ms"), ("decode_eager_ms", "eager_ms")):
            dense = np.maximum(decode[column] - attention, 0.1 * decode[column])
            tables[name] = _interpolate(decode["size"], dense, max_bs + 1)
        tables["decode_capture_s"] = _interpolate(decode["size"], decode["capture_s"], max_bs + 1)
        tables["decode_graph_bytes"] = _per_graph_bytes(decode, base.decode_graph_bytes)
    if len(piecewise["size"]):
        pairs = piecewise["size"] * (piecewise["size"] + 1) / 2  # one request, causal
        attention = base.attention_ms_per_pair * pairs
        for name, column in (("extend_graph_ms", "replay_ms"), ("extend_eager_ms", "eager_ms")):
            dense = np.maximum(piecewise[column] - attention, 0.1 * piecewise[column])
            tables[name] = _interpolate(piecewise["size"], dense, max_tokens + 1)
        tables["extend_capture_s"] = _interpolate(
            piecewise["size"], piecewise["capture_s"], max_tokens + 1
        )
        tables["extend_graph_bytes"] = _per_graph_bytes(piecewise, base.extend_graph_bytes)
    scale = _pool_scale(report, cfg, decode["size"], piecewise["size"])
    tables["decode_pool_bytes"] = base.decode_pool_bytes * scale
    tables["extend_pool_bytes"] = base.extend_pool_bytes * scale
    notes = _mismatches(report, cfg, gpu, source) + _tp_mismatch(report, tp_size, source)
    # A replay (cgtool.replay.profile) fits attention's price to its own steps: it replaces the roofline's.
    fitted = {k: float(v) for k, v in report.get("attention", {}).items()
              if k in ("kv_read_ms_per_token", "attention_ms_per_pair") and isinstance(v, (int, float)) and v > 0}
    return _with(base, source=source, warnings=notes, **tables, **fitted)


def _report_tp_size(report: dict[str, Any]) -> int:
    # Reports written before tensor-parallel capture carry no tp_size: they ran on one GPU.
    return int(report.get("settings", {}).get("tp_size", 1) or 1)


def _tp_mismatch(report: dict[str, Any], tp_size: int, source: str) -> tuple[str, ...]:
    measured = _report_tp_size(report)
    if measured == tp_size:
        return ()
    return (
        (f"{source} was measured at --tp {measured}, the plan is for --tp {tp_size}: its step "
        "times and graph memory are of the other split"),
    )


def _per_graph_bytes(rows: dict[str, np.ndarray], fallback: float) -> float:
    # The largest size was captured first and grew the pool; the others show what one more
    # graph costs.
    if len(rows["size"]) < 2:
        return fallback
    extra = rows["retained_bytes"][:-1] + rows["non_torch_bytes"][:-1]
    return float(np.median(extra))


def _pool_scale(
    report: dict[str, Any], cfg: ModelConfig, decode_sizes: np.ndarray, tokens: np.ndarray
) -> float:
    measured = float(report.get("totals", {}).get("graph_pool_bytes", 0) or 0)
    tp = _report_tp_size(report)
    predicted = max(
        float(decode_pool_bytes_at(cfg, decode_sizes[-1:], tp).sum()),
        float(extend_pool_bytes_at(cfg, tokens[-1:], tp).sum()) if len(tokens) else 0.0,
    )
    return measured / predicted if measured > 0 and predicted > 0 else 1.0


def _mismatches(
    report: dict[str, Any], cfg: ModelConfig, gpu: GpuSpec, source: str
) -> tuple[str, ...]:
    notes = []
    measured_gpu = str(report.get("environment", {}).get("gpu_name", ""))
    if measured_gpu and not any(
        n.lower() in measured_gpu.lower() for n in gpu.nvml_names + (gpu.name,)
    ):
        notes.append(f"{source} was measured on {measured_gpu}, the plan is for {gpu.name}")
    report_hash = report.get("model", {}).get("config_hash")
    if report_hash and report_hash != cfg.config_hash():
        notes.append(
            f"{source} was measured on another model ({report.get('model', {}).get('name')})"
        )
    if report.get("status") == "incomplete":
        notes.append(f"{source} is incomplete: sizes it lacks are interpolated or estimated")
    return tuple(notes)


def _with(base: CostModel, **changes: Any) -> CostModel:
    values = {name: getattr(base, name) for name in CostModel.__dataclass_fields__}
    return CostModel(**(values | changes))


def predicted_graph_bytes(
    report: dict[str, Any], cfg: ModelConfig, gpu: GpuSpec
) -> tuple[int, int]:
    """(roofline prediction, measurement) of graph memory for the sizes a report captured."""
    ok = _rank0_ok(report)
    decode = [int(r["size"]) for r in ok if r.get("kind") == "decode"]
    tokens = [int(r["size"]) for r in ok if r.get("kind") == "piecewise"]
    model = roofline_cost(
        cfg,
        gpu,
        max_bs=max(decode, default=1),
        max_tokens=max(tokens, default=1),
        tp_size=_report_tp_size(report),
    )
    totals = report.get("totals", {})
    measured = int(totals.get("graph_pool_bytes", 0)) + int(totals.get("non_torch_bytes", 0))
    return model.graph_bytes(decode, tokens), measured
