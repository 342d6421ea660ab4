"""Cost tables fitted to a capture report: measured sizes, the roofline filling the rest.

A report's step times include attention at its context length, which is taken out to leave the
dense part that schedules change; its graph pool rescales the roofline's pool estimates. Decode
rows timed at more than one context (merge_context_reports) price that attention themselves:
the slope of step time over context tokens read, within each size.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cgtool.errors import InputError
from cgtool.planner.cost import (
    CostModel,
    decode_pool_bytes_at,
    extend_pool_bytes_at,
    kernels_per_forward,
    lone_decode_gap_ms,
    roofline_cost,
)
from cgtool.specs.config import ModelConfig
from cgtool.specs.gpus import GpuSpec


def size_table(sizes: np.ndarray, values: np.ndarray, length: int) -> np.ndarray:
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


def _measured_rows(
    report: dict[str, Any], kind: str, source: str, *, all_contexts: bool = False
) -> dict[str, np.ndarray]:
    """A kind's rows by size, at the report's own context (or every context, each row's in
    `context_len`: a row merged from another capture carries the context it was timed at)."""
    own = _report_context(report)
    rows = [r for r in _rank0_ok(report) if r.get("kind") == kind]
    if not all_contexts:
        rows = [r for r in rows if _row_context(r, own) == own]
    rows.sort(key=lambda r: r["size"])
    fields = ("size", "eager_ms", "replay_ms", "capture_s", "retained_bytes", "non_torch_bytes")
    try:
        columns = {f: np.array([float(r[f]) for r in rows]) for f in fields}
        columns["context_len"] = np.array([_row_context(r, own) for r in rows])
        return columns
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
    tables: dict[str, Any] = {}
    kv_ms = base.kv_read_ms_per_token
    lone_gap_ms = _lone_decode_gap_ms(report, cfg, tp_size) if len(decode["size"]) else 0.0
    if len(decode["size"]):
        # Each row holds attention over its context per request: priced from the rows' own
        # spread of contexts where they have one, else the roofline's; taken out, it leaves the
        # dense part (one mean per size over the contexts it was timed at).
        every = _measured_rows(report, "decode", source, all_contexts=True)
        measured_kv = decode_kv_ms_per_token(every)
        if measured_kv is not None:
            kv_ms = tables["kv_read_ms_per_token"] = measured_kv
        for name, column in (("decode_graph_ms", "replay_ms"), ("decode_eager_ms", "eager_ms")):
            sizes, dense = _dense_by_size(every, column, kv_ms)
            tables[name] = size_table(sizes, dense, max_bs + 1)
        tables["decode_graph_ms"] = tables["decode_graph_ms"] + lone_gap_ms
        tables["decode_capture_s"] = size_table(decode["size"], decode["capture_s"], max_bs + 1)
        tables["decode_graph_bytes"] = _per_graph_bytes(decode, base.decode_graph_bytes)
    if len(piecewise["size"]):
        pairs = piecewise["size"] * (piecewise["size"] + 1) / 2  # one request, causal
        attention = base.attention_ms_per_pair * pairs
        for name, column in (("extend_graph_ms", "replay_ms"), ("extend_eager_ms", "eager_ms")):
            dense = np.maximum(piecewise[column] - attention, 0.1 * piecewise[column])
            tables[name] = size_table(piecewise["size"], dense, max_tokens + 1)
        tables["extend_capture_s"] = size_table(
            piecewise["size"], piecewise["capture_s"], max_tokens + 1
        )
        tables["extend_graph_bytes"] = _per_graph_bytes(piecewise, base.extend_graph_bytes)
    scale = _pool_scale(report, cfg, decode["size"], piecewise["size"])
    tables["decode_pool_bytes"] = base.decode_pool_bytes * scale
    tables["extend_pool_bytes"] = base.extend_pool_bytes * scale
    notes = _mismatches(report, cfg, gpu, source) + _tp_mismatch(report, tp_size, source)
    if lone_gap_ms:
        note = (f"{source}: its decode graphs were timed with no prefill graph captured; "
                f"{lone_gap_ms * 1e3:.0f} us a step added, as a server's process holding both replays them")
        notes += (note,)
    # A replay (cgtool.replay.profile) fits attention's price to its own steps, and a verify
    # (cgtool.verify.profile) the extend pairs' to its steps over long cached prefixes: it
    # replaces the roofline's, and the plan says by how much.
    fitted = {k: float(v) for k, v in report.get("attention", {}).items()
              if k in ("kv_read_ms_per_token", "attention_ms_per_pair") and isinstance(v, (int, float)) and v > 0}
    notes += tuple(_attention_note(source, name, price / getattr(base, name)) for name, price in fitted.items())
    # A verify.json that timed no eager step says so: its eager side is the roofline's.
    eager_measured = bool(report.get("eager_measured", True))
    return _with(base, source=source, warnings=notes, eager_measured=eager_measured, **(tables | fitted))


def _lone_decode_gap_ms(report: dict[str, Any], cfg: ModelConfig, tp_size: int) -> float:
    """A capture of decode graphs alone (`--kind decode`) times them faster than a process that
    also captured prefill graphs, as a server does: SERVER_GRAPH_GAP_MS on each of the forward's
    kernels (its own count where the report has one). Zero for any other report."""
    kinds = report.get("settings", {}).get("kinds") or []
    counts = [r["kernels_per_forward"] for r in _rank0_ok(report)
              if r.get("kind") == "decode" and isinstance(r.get("kernels_per_forward"), int)]
    kernels = float(np.median(counts)) if counts else kernels_per_forward(cfg, tp_size)
    return lone_decode_gap_ms(kinds, kernels)


def _attention_note(source: str, name: str, scale: float) -> str:
    what = "decode attention (a context token)" if name == "kv_read_ms_per_token" else "extend attention (a query-key pair)"
    return f"{source}: {what} priced from its own steps, {scale:.2f}x the roofline's"


def _report_context(report: dict[str, Any]) -> float:
    return float(report.get("settings", {}).get("context_len", 0) or 0)


def _row_context(row: dict[str, Any], own: float) -> float:
    return float(row.get("context_len") or own)  # null or absent: the report's own


def merge_context_reports(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One report from captures of one model on one GPU at different --context-len: the first
    whole (its graph memory and piecewise sizes), the others' decode rows added, each marked
    with the context it was timed at, so the fit can price attention per context token."""
    if not reports:
        raise ValueError("no report to merge")
    first = reports[0]
    merged = dict(first)
    rows = [dict(r) for r in first.get("sizes", [])]  # at the report's own context
    for other in reports[1:]:
        context = int(_report_context(other))
        rows += [dict(r) | {"context_len": r.get("context_len") or context}
                 for r in other.get("sizes", []) if r.get("kind") == "decode"]
    merged["sizes"] = rows
    return merged


def decode_kv_ms_per_token(rows: dict[str, np.ndarray], column: str = "replay_ms") -> float | None:
    """ms per context token of one request, fitted to decode rows timed at several contexts:
    a size's rows share their dense part, so within a size only attention moves with the
    context; the least-squares slope over all sizes (one intercept each) of step time against
    size x context. None where no size was timed at two contexts."""
    load = rows["size"] * rows["context_len"]
    return within_slope(rows["size"], load, rows[column])


def within_slope(group: np.ndarray, x: np.ndarray, y: np.ndarray) -> float | None:
    """Least-squares slope of y on x with one intercept per group (a fixed-effects fit); None
    when x never varies inside a group or the slope comes out negative (noise, not a cost)."""
    xc, yc = np.asarray(x, dtype=np.float64).copy(), np.asarray(y, dtype=np.float64).copy()
    for g in np.unique(group):
        inside = group == g
        xc[inside] -= xc[inside].mean()
        yc[inside] -= yc[inside].mean()
    spread = float(xc @ xc)
    if spread <= 0:
        return None
    slope = float(xc @ yc) / spread
    return slope if slope > 0 else None


def _dense_by_size(rows: dict[str, np.ndarray], column: str, kv_ms: float) -> tuple[np.ndarray, np.ndarray]:
    """Per size, the mean over its rows of the time less attention at that row's context."""
    attention = kv_ms * rows["size"] * rows["context_len"]
    dense = np.maximum(rows[column] - attention, 0.1 * rows[column])
    sizes = np.unique(rows["size"])
    return sizes, np.array([dense[rows["size"] == n].mean() for n in sizes])


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
