"""Tables: built once as TableData, rendered as rich tables here (and as HTML and markdown)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cgtool.documents.compare import PLAN_METRICS, REPORT_METRICS, Comparison, Metric, MetricChange
from cgtool.documents.results import SIZE_UNITS, CaptureReport
from cgtool.specs.config import ModelConfig
from cgtool.specs.vision import VisionPreset
from cgtool.units import BF16_BYTES, GIB, MIB

if TYPE_CHECKING:
    from cgtool.reports.fit import FittedTable


def gib(num_bytes: float) -> Cell:
    return Cell(f"{num_bytes / GIB:.2f} GiB", num_bytes)


# --- Capture reports and `check` comparisons (plans: reports/plan_tables.py) -----------------------------------
# Each table is built once as TableData and rendered by rich (here), HTML and markdown.


class Cell(str):
    """A cell's text as a person reads it ("11.004 ms", "1 2 4 ... (28 sizes)"), carrying the
    plain value that CSV and JSON write instead (11.004, the full list). A str, so that every
    view that shows text takes it as it is."""

    value: Any

    def __new__(cls, text: str, value: Any) -> Cell:
        cell = super().__new__(cls, text)
        cell.value = value
        return cell


def plain(cell: str) -> Any:
    """What machine-readable output carries for a cell: its value, or its text."""
    return cell.value if isinstance(cell, Cell) else str(cell)


@dataclass(slots=True)
class TableData:
    title: str
    columns: list[str]
    rows: list[list[str]]  # str or Cell
    marked: set[int] = field(default_factory=set)  # row indices to highlight (regressions)
    headings: set[int] = field(default_factory=set)  # rows that title the rows below them
    wrap_last: bool = False  # a long list in the last column wraps in a terminal, never cut
    wrapping: set[int] = field(default_factory=set)  # other text columns that may wrap
    caption: str = ""  # a note under the table (terminal and HTML; not data)
    machine_only: set[int] = field(default_factory=set)  # columns CSV and JSON carry, views not


def for_people(data: TableData) -> TableData:
    """`data` without the columns only CSV and JSON carry (a unit that the cells spell out)."""
    if not data.machine_only:
        return data
    keep = [i for i in range(len(data.columns)) if i not in data.machine_only]
    at = {old: new for new, old in enumerate(keep)}
    return TableData(data.title, [data.columns[i] for i in keep],
                     [[row[i] for i in keep if i < len(row)] for row in data.rows],
                     data.marked, data.headings, data.wrap_last,
                     {at[i] for i in data.wrapping if i in at}, data.caption)


def mib_number(num_bytes: float | None) -> Cell:
    """MiB without the unit, for a column whose header names it; CSV and JSON carry bytes."""
    return Cell("-" if num_bytes is None else f"{num_bytes / MIB:,.1f}", num_bytes)


def mib(num_bytes: float | None) -> Cell:
    return Cell("-" if num_bytes is None else f"{mib_number(num_bytes)} MiB", num_bytes)


def _num(value: float | None, digits: int = 3, suffix: str = "") -> Cell:
    return Cell("-" if value is None else f"{value:,.{digits}f}{suffix}", value)


def _count(value: int | None) -> Cell:
    return Cell("-" if value is None else f"{value:,}", value)


def format_value(value: float | None, unit: str) -> Cell:
    if unit == "bytes":
        return mib(value)
    if unit == "tokens":
        return _count(None if value is None else int(value))
    return _num(value, 3, f" {unit}" if unit else "")


def format_change(pct: float | None) -> Cell:
    if pct is None:
        return Cell("-", None)
    if math.isinf(pct):
        word = "new" if pct > 0 else "gone"
        return Cell(word, word)
    return Cell(f"{pct:+.1f}%", pct)


def stacked(header: str) -> str:
    # "retained MiB" -> "retained" over "MiB": a column is then as wide as its widest word or
    # cell, which keeps the capture table within 120 columns without cutting or wrapping.
    name, _, last = header.rpartition(" ")
    return f"{name}\n{last}" if name else header


def to_rich(data: TableData) -> FittedTable:
    """`data` for a terminal: as wide as the console allows, never a number cut short."""
    from cgtool.reports.fit import FittedTable

    return FittedTable(data)


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
    # CSV and JSON name each column as report.json and sizes.csv do, with bytes for MiB.
    names = ["size", "status", "capture_s", "retained_bytes", "cumulative_retained_bytes",
             "peak_bytes", "non_torch_bytes", "eager_ms", "replay_ms", "speedup", "roofline_pct",
             "kernels_per_forward", "max_abs_diff", "experts_active", "mla_chunks_redone"]
    shown = [SIZE_UNITS[kind], "status", "capture s",
             "retained MiB", "cumulative MiB", "peak MiB", "non-torch MiB", "eager ms",
             "replay ms", "speedup", "roofline %", "kernels", "max |diff|", "experts", "MLA redone"]
    # experts: distinct routed experts per MoE layer, mean over layers; MoE models only.
    # MLA redone: chunks stage 1 did twice in a replay; MLA models where they are counted.
    moe = any(row.experts_active is not None for row in report.sizes_of(kind))
    redone = any(row.mla_chunks_redone is not None for row in report.sizes_of(kind))
    columns: list[str] = [Cell(a, b) for a, b, keep in zip(shown, names, [True] * (len(shown) - 2) + [moe, redone]) if keep]
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
            Cell(f"{row.size}{mode}", row.size), row.status, _num(row.capture_s, 2),
            mib_number(row.retained_bytes), mib_number(cumulative), mib_number(row.peak_bytes),
            mib_number(row.non_torch_bytes), _num(row.eager_ms, 3), _num(row.replay_ms, 3),
            _num(row.speedup, 2, "x"), _num(roofline, 0),
            Cell(str(row.kernels_per_forward), row.kernels_per_forward),
            Cell("-" if row.max_abs_diff is None else f"{row.max_abs_diff:.3g}", row.max_abs_diff),
        ] + ([_num(row.experts_active, 1)] if moe else [])
          + ([_count(row.mla_chunks_redone)] if redone else []))
    return TableData(f"{kind} graphs", columns, rows, marked)


def totals_rows(report: CaptureReport) -> TableData:
    t = report.totals
    bandwidth = t.copy_bandwidth_bytes_s
    # Labels for a person; CSV and JSON name each row by its report.json field.
    rows = [
        [Cell("weights", "weights_bytes"), mib(t.weights_bytes)],
        [Cell("KV pool", "kv_pool_bytes"), Cell(f"{mib(t.kv_pool_bytes)} ({t.kv_tokens:,} tokens)",
                                                t.kv_pool_bytes)],
        [Cell("KV tokens", "kv_tokens"), Cell(f"{t.kv_tokens:,}", t.kv_tokens)],
        [Cell("graph pool", "graph_pool_bytes"), mib(t.graph_pool_bytes)],
        [Cell("non-torch (graphs, workspaces)", "non_torch_bytes"), mib(t.non_torch_bytes)],
        [Cell("peak", "peak_bytes"), mib(t.peak_bytes)],
        [Cell("free before capture", "free_before_capture_bytes"), mib(t.free_before_capture_bytes)],
        [Cell("free after capture", "free_after_capture_bytes"), mib(t.free_after_capture_bytes)],
        [Cell("capture time (capturing alone)", "capture_s"), _num(t.capture_s, 2, " s")],
        [Cell("copy bandwidth", "copy_bandwidth_bytes_s"),
         Cell("-" if bandwidth is None else f"{bandwidth / 1e9:,.0f} GB/s", bandwidth)],
    ]
    for kind, used in t.sglang_mem_usage_bytes.items():
        rows.append([Cell(f"SGLang 'mem usage', {kind}", f"sglang_mem_usage_bytes.{kind}"), mib(used)])
    if t.eager_host_us_per_kernel is not None:
        rows.append([Cell("eager host time per kernel", "eager_host_us_per_kernel"),
                     _num(t.eager_host_us_per_kernel, 1, " µs")])
    if t.plain_torch_host_us_per_kernel is not None:
        rows.append([Cell("plain PyTorch host time per kernel", "plain_torch_host_us_per_kernel"),
                     _num(t.plain_torch_host_us_per_kernel, 1, " µs")])
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
    return TableData("Phases", ["phase", Cell("time s", "time_s"), Cell("share %", "share_pct")],
                     rows)


def spread_rows(report: CaptureReport) -> TableData:
    """How much one timed call varies, per kind, path and call length, pooled over the
    kind's sizes: every eager and replay interval in the report is computed from it."""
    rows = []
    for key, spread in report.totals.sample_spread.items():
        kind, path, regime = key.split(":")
        rows.append([kind, path, Cell(f"{regime} calls", regime), _num(100 * spread.rel_sd, 2),
                     Cell(str(spread.dof), spread.dof)])
    return TableData("Timing spread (sets the 95% intervals)",
                     ["kind", "path", "regime", Cell("sd %", "sd_pct"), "dof"], rows)


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
        ["dependent launches (one-token MoE)",
         "not recorded" if e.dependent_launch is None else "on" if e.dependent_launch else "off"],
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
    columns = ["size", "metric", "baseline", "current", Cell("change", "change_pct"), "verdict",
               "unit"]
    rows: list[list[str]] = []
    marked: set[int] = set()
    for change in comparison.changes:
        if change.regressed:
            marked.add(len(rows))
        rows.append([
            change.label, change.metric, format_value(change.baseline, change.unit),
            format_value(change.current, change.unit),
            change.note or format_change(change.change_pct), _verdict(comparison, change),
            change.unit,
        ])
    title = f"cgtool check ({comparison.subject}; limits {limits_text(comparison)})"
    # The unit: CSV and JSON carry plain numbers; the cells a person reads spell it out.
    return TableData(title, columns, rows, marked, machine_only={6})
