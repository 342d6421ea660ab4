"""Tables: built once as TableData, rendered as rich tables here (and as HTML and markdown)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rich import box
from rich.table import Table

from cgtool.documents.compare import PLAN_METRICS, REPORT_METRICS, Comparison, Metric, MetricChange
from cgtool.specs.config import ModelConfig
from cgtool.documents.results import SIZE_UNITS, CaptureReport
from cgtool.units import BF16_BYTES, GIB, MIB
from cgtool.specs.vision import VisionPreset


def gib(num_bytes: float) -> str:
    return f"{num_bytes / GIB:.2f} GiB"


# --- Capture reports and `check` comparisons (plans: reports/plan_tables.py) -----------------------------------
# Each table is built once as TableData and rendered by rich (here), HTML and markdown.


@dataclass(slots=True)
class TableData:
    title: str
    columns: list[str]
    rows: list[list[str]]
    marked: set[int] = field(default_factory=set)  # row indices to highlight (regressions)
    headings: set[int] = field(default_factory=set)  # rows that title the rows below them
    wrap_last: bool = False  # a long list in the last column wraps in a terminal, never cut


def mib_number(num_bytes: float | None) -> str:
    """MiB without the unit, for a column whose header names it."""
    return "-" if num_bytes is None else f"{num_bytes / MIB:,.1f}"


def mib(num_bytes: float | None) -> str:
    return "-" if num_bytes is None else f"{mib_number(num_bytes)} MiB"


def _num(value: float | None, digits: int = 3, suffix: str = "") -> str:
    return "-" if value is None else f"{value:,.{digits}f}{suffix}"


def format_value(value: float | None, unit: str) -> str:
    if unit == "bytes":
        return mib(value)
    if unit == "tokens":
        return "-" if value is None else f"{int(value):,}"
    return _num(value, 3, f" {unit}" if unit else "")


def format_change(pct: float | None) -> str:
    if pct is None:
        return "-"
    if math.isinf(pct):
        return "new" if pct > 0 else "gone"
    return f"{pct:+.1f}%"


def _stacked(header: str) -> str:
    # "retained MiB" -> "retained" over "MiB": a column is then as wide as its widest word or
    # cell, which keeps the capture table within 120 columns without cutting or wrapping.
    name, _, last = header.rpartition(" ")
    return f"{name}\n{last}" if name else header


def to_rich(data: TableData) -> Table:
    # As wide as its title at least, so that a long title (check's limits) stays on one line.
    table = Table(title=data.title, box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False,
                  min_width=len(data.title))
    last = len(data.columns) - 1
    for i, column in enumerate(data.columns):
        wraps = data.wrap_last and i == last
        table.add_column(_stacked(column), justify="left" if i == 0 or wraps else "right",
                         no_wrap=not wraps)
    for i, row in enumerate(data.rows):
        table.add_row(*row, style=row_style(data, i))
    return table


def row_style(data: TableData, i: int) -> str | None:
    if i in data.marked:
        return "bold red"
    return "bold" if i in data.headings else None


def models_rows(configs: list[ModelConfig]) -> TableData:
    columns = ["preset", "architecture", "layers", "hidden", "heads/kv", "params B",
               "bf16 weights GiB"]
    rows = [[cfg.name, cfg.architecture, str(cfg.num_layers), str(cfg.hidden_size),
             f"{cfg.num_heads}/{cfg.num_kv_heads}", f"{cfg.param_count() / 1e9:.2f}",
             f"{cfg.weight_bytes(BF16_BYTES) / GIB:.2f}"] for cfg in configs]
    return TableData("Model presets", columns, rows)


def vision_models_rows(presets: list[VisionPreset]) -> TableData:
    columns = ["vision preset (--kind vit)", "blocks", "hidden", "heads", "patch px",
               "window px", "full-attention blocks", "out hidden"]
    rows = [[p.name, str(p.depth), str(p.hidden_size), str(p.num_heads), str(p.patch_size),
             str(p.window_size), " ".join(map(str, p.fullatt_block_indexes)), str(p.out_hidden_size)]
            for p in presets]
    return TableData("Vision presets", columns, rows)


def size_rows(report: CaptureReport, kind: str) -> TableData:
    # Units live in the headers so that cells stay short numbers that never wrap.
    columns = [SIZE_UNITS[kind], "status", "capture s",
               "retained MiB", "cumulative MiB", "peak MiB", "non-torch MiB", "eager ms",
               "replay ms", "speedup", "roofline %", "kernels", "max |diff|"]
    moe = any(row.experts_active is not None for row in report.sizes_of(kind))
    if moe:
        columns.append("experts")  # distinct routed experts per MoE layer, mean over layers
    rows: list[list[str]] = []
    marked: set[int] = set()
    cumulative = 0
    for row in report.sizes_of(kind):  # capture order: the pool grows largest first
        cumulative += row.retained_bytes
        roofline = (100 * row.roofline_ms / row.replay_ms
                    if row.roofline_ms and row.replay_ms else None)
        if row.status != "ok":
            marked.add(len(rows))
        mode = "" if row.hidden_mode == "null" else f" hidden {row.hidden_mode}"
        rows.append([
            f"{row.size}{mode}", row.status, _num(row.capture_s, 2), mib_number(row.retained_bytes),
            mib_number(cumulative), mib_number(row.peak_bytes), mib_number(row.non_torch_bytes),
            _num(row.eager_ms, 3), _num(row.replay_ms, 3), _num(row.speedup, 2, "x"),
            _num(roofline, 0), str(row.kernels_per_forward),
            "-" if row.max_abs_diff is None else f"{row.max_abs_diff:.3g}",
        ] + ([_num(row.experts_active, 1)] if moe else []))
    return TableData(f"{kind} graphs", columns, rows, marked)


def totals_rows(report: CaptureReport) -> TableData:
    t = report.totals
    bandwidth = t.copy_bandwidth_bytes_s
    rows = [
        ["weights", mib(t.weights_bytes)],
        ["KV pool", f"{mib(t.kv_pool_bytes)} ({t.kv_tokens:,} tokens)"],
        ["graph pool", mib(t.graph_pool_bytes)],
        ["non-torch (graphs, workspaces)", mib(t.non_torch_bytes)],
        ["peak", mib(t.peak_bytes)],
        ["free before capture", mib(t.free_before_capture_bytes)],
        ["free after capture", mib(t.free_after_capture_bytes)],
        ["capture time (capturing alone)", _num(t.capture_s, 2, " s")],
        ["copy bandwidth", "-" if bandwidth is None else f"{bandwidth / 1e9:,.0f} GB/s"],
    ]
    for kind, used in t.sglang_mem_usage_bytes.items():
        rows.append([f"SGLang 'mem usage', {kind}", mib(used)])
    if t.eager_host_us_per_kernel is not None:
        rows.append(["eager host time per kernel", _num(t.eager_host_us_per_kernel, 1, " µs")])
    if t.plain_torch_host_us_per_kernel is not None:
        rows.append(["plain PyTorch host time per kernel", _num(t.plain_torch_host_us_per_kernel, 1, " µs")])
    return TableData("Totals", ["", "value"], rows)


PHASES = ("startup", "load", "compile", "capture", "measure", "profile", "render")
_COMPILE_CACHE = {"hit": "cache hit", "miss": "cache miss, stored", "not_stored": "not cacheable",
                  "off": "cache off"}


def phase_rows(report: CaptureReport) -> TableData:
    """Seconds in each phase of the session, in the order they run, and their share; the
    compile phase says whether the compile cache served it."""
    phases = report.totals.phase_s
    total = sum(phases.values())
    names = [p for p in PHASES if p in phases] + [p for p in phases if p not in PHASES]
    cache = report.totals.compile_cache
    labels = {"compile": f"compile ({_COMPILE_CACHE[cache]})"} if cache else {}
    rows = [[labels.get(name, name), _num(phases[name], 2),
             _num(100 * phases[name] / total if total else None, 0)] for name in names]
    return TableData("Phases", ["phase", "time s", "share %"], rows)


def spread_rows(report: CaptureReport) -> TableData:
    """How much one timed call varies, per kind, path and call length, pooled over the
    kind's sizes: every eager and replay interval in the report is computed from it."""
    rows = []
    for key, spread in report.totals.sample_spread.items():
        kind, path, regime = key.split(":")
        rows.append([kind, path, f"{regime} calls", _num(100 * spread.rel_sd, 2), str(spread.dof)])
    return TableData("Timing spread (each size's 95% interval comes from it)",
                     ["kind", "path", "regime", "sd %", "dof"], rows)


def environment_rows(report: CaptureReport) -> TableData:
    e, m, s = report.environment, report.model, report.settings
    rows = [
        ["GPU", f"{e.gpu_name} ({mib(e.gpu_memory_bytes)})"],
        ["driver / CUDA / torch", f"{e.driver} / {e.cuda} / {e.torch}"],
        ["cgtool / host", f"{e.cgtool} / {e.hostname}"],
        ["model", (f"{m.name} ({m.architecture}, {m.num_layers} layers, {m.dtype}, "
                   f"{mib(m.param_bytes)}, config {m.config_hash})")],
        ["compiler / attention", f"{s.compiler} / {s.attention_backend}"],
        ["mem-fraction-static", f"{s.mem_fraction_static:g}"],
        ["context length / TP", f"{s.context_len:,} / {s.tp_size}"],
        ["cudagraph GC", "enabled" if s.enable_cudagraph_gc else "frozen during capture"],
        ["created / status", f"{report.created} / {report.status}"
                             + (f" ({report.incomplete_reason})" if report.incomplete_reason else "")],
    ]
    return TableData("Environment", ["", "value"], rows)


def kernel_rows(report: CaptureReport, key: str, top: int = 10) -> TableData:
    kernels = sorted(report.artifacts.kernel_tables.get(key, []), key=lambda k: -k.cuda_ms)
    total_ms = sum(k.cuda_ms for k in kernels) or 1.0
    rows = [[k.name, _num(k.cuda_ms, 3, " ms"), _num(100 * k.cuda_ms / total_ms, 1, "%"),
             str(k.launches)] for k in kernels[:top]]
    return TableData(f"Kernels per forward, {key}", ["kernel", "CUDA time", "share", "launches"],
                     rows)


def _metric(comparison: Comparison, name: str) -> Metric | None:
    return (REPORT_METRICS if comparison.subject == "report" else PLAN_METRICS).get(name)


def limits_text(comparison: Comparison) -> str:
    """Each metric's limit and its floor: changes under the floor never fail, whatever their
    percentage (a few KiB over a near-empty pool say nothing)."""
    parts = []
    for name in comparison.metrics:
        metric = _metric(comparison, name)
        if metric is None:
            continue
        pct = comparison.latency_regress_pct if metric.timing else comparison.max_regress_pct
        floor = f" and over {format_value(metric.floor, metric.unit)}" if metric.floor else ""
        parts.append(f"{name} +{pct:g}%{floor}")
    return ", ".join(parts)


def _verdict(comparison: Comparison, change: MetricChange) -> str:
    if change.regressed:
        return "REGRESSED"
    metric, pct = _metric(comparison, change.metric), change.change_pct
    if metric is None or not metric.floor or pct is None:
        return "ok"
    worse_pct = pct if metric.higher_is_worse else -pct
    # Worse by more than the limit, yet ok: the change is under the metric's floor.
    if worse_pct > change.threshold_pct:
        return f"ok (under {format_value(metric.floor, metric.unit)})"
    return "ok"


def comparison_rows(comparison: Comparison) -> TableData:
    columns = ["size", "metric", "baseline", "current", "change", "verdict"]
    rows: list[list[str]] = []
    marked: set[int] = set()
    for change in comparison.changes:
        if change.regressed:
            marked.add(len(rows))
        rows.append([
            change.label, change.metric, format_value(change.baseline, change.unit),
            format_value(change.current, change.unit),
            change.note or format_change(change.change_pct), _verdict(comparison, change),
        ])
    title = f"cgtool check ({comparison.subject}; limits {limits_text(comparison)})"
    return TableData(title, columns, rows, marked)
