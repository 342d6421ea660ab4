"""One self-contained HTML page per report or plan: figures inlined as base64 PNG, no network."""

from __future__ import annotations

import base64
import html
from pathlib import Path

from cgtool.documents.compare import plan_verdict
from cgtool.documents.plan_document import Plan
from cgtool.documents.results import CaptureReport
from cgtool.reports.plan_scenarios import plan_tables
from cgtool.reports.rank_tables import rank_tables
from cgtool.reports.tables import (
    TableData,
    environment_rows,
    for_people,
    kernel_rows,
    mib,
    phase_rows,
    size_rows,
    spread_rows,
    totals_rows,
)

MEMORY_VIZ_URL = "https://pytorch.org/memory_viz"
PERFETTO_URL = "https://ui.perfetto.dev"
PLAN_VS_DEFAULT = "Plan against the engine's default"

_CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 0; color: #1d2731;
       background: #f5f6f8; }
main { max-width: 1240px; margin: 0 auto; padding: 24px 32px 64px; }
h1 { font-size: 26px; margin: 0 0 4px; } h2 { font-size: 20px; margin: 32px 0 12px; }
.sub { color: #5b6670; margin-bottom: 16px; }
.banner { background: #fff3cd; border-left: 6px solid #edae49; padding: 10px 14px; margin: 12px 0; }
.cards { display: flex; gap: 12px; flex-wrap: wrap; margin: 16px 0; }
.card { background: #fff; border-radius: 8px; padding: 12px 16px; min-width: 170px;
        box-shadow: 0 1px 3px rgba(0,0,0,.12); }
.card b { display: block; font-size: 22px; color: #00798c; } .card span { color: #5b6670; font-size: 13px; }
.figs { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 12px; }
.figs img { width: 100%; background: #fff; border-radius: 6px; box-shadow: 0 1px 3px rgba(0,0,0,.12); }
table { border-collapse: collapse; background: #fff; font-size: 13px; margin: 8px 0 16px;
        box-shadow: 0 1px 3px rgba(0,0,0,.12); }
caption { text-align: left; font-weight: 600; padding: 6px 0; }
th, td { padding: 4px 10px; border-bottom: 1px solid #e3e6ea; text-align: right; white-space: nowrap; }
th:first-child, td:first-child { text-align: left; }
th { background: #30638e; color: #fff; }
tr.heading td { font-weight: 600; background: #eef1f4; }
tr.marked td { background: #fde2e4; color: #a4161a; font-weight: 600; }
pre { background: #1d2731; color: #e9f1f7; padding: 12px; border-radius: 6px; overflow-x: auto; }
details { margin: 8px 0; } summary { cursor: pointer; font-weight: 600; }
"""


def report_html(report: CaptureReport, figures: list[Path], artifact_prefix: str = "") -> str:
    """The page for a capture report; `artifact_prefix` leads from the page to the report folder."""
    title = f"{report.model.name} on {report.environment.gpu_name}"
    body = [f"<h1>cgtool capture report: {_e(title)}</h1>",
            f"<div class='sub'>created {_e(report.created)}, status {_e(report.status)}</div>"]
    if report.status == "incomplete":
        body.append(f"<div class='banner'>Incomplete run: {_e(report.incomplete_reason or '')}</div>")
    body.append(_report_cards(report))
    for kind in report.kinds():
        body.append(f"<h2>{_e(kind)} graphs</h2>")
        body.append(_figures([f for f in figures if f.name.startswith(f"{kind}_")]))
        body.append(table_html(size_rows(report, kind)))
    body.append("<h2>Memory and environment</h2>")
    body.append(table_html(totals_rows(report)) + table_html(environment_rows(report)))
    timing = [t for t in (spread_rows(report), phase_rows(report)) if t.rows]
    if timing:
        body.append("<h2>Timing</h2>" + "".join(table_html(t) for t in timing))
    tp_tables = rank_tables(report)
    if tp_tables:
        body.append(f"<h2>Tensor parallelism: {report.settings.tp_size} ranks</h2>")
        body.append("".join(table_html(t) for t in tp_tables))
    body.append(_kernel_sections(report))
    body.append(_artifact_links(report, artifact_prefix))
    return _page(f"cgtool report: {title}", "\n".join(body))


def plan_html(plan: Plan, figures: list[Path]) -> str:
    """The page for a plan, its figures inlined."""
    inputs = plan.inputs
    title = f"{inputs.model} on {inputs.gpu} ({inputs.engine})"
    body = [f"<h1>cgtool capture plan: {_e(title)}</h1>",
            (f"<div class='sub'>trace {_e(inputs.trace)}, created {_e(plan.created)}, "
             f"status {_e(plan.status)}</div>")]
    body += [f"<div class='banner'>{_e(w)}</div>" for w in plan.all_warnings()]
    verdict = plan_verdict(plan)
    if verdict is not None:
        body.append(f"<div class='banner'>--compare-plan {_e(inputs.compare_plan or '')}: "
                    f"{_e(verdict.sentence)}</div>")
    body.append(_plan_cards(plan))
    body.append("<h2>Recommended flags</h2>")
    # The planned engine first, then the same sizes spelled for the others.
    for engine in sorted(plan.flags, key=lambda e: e != inputs.engine):
        body.append(f"<b>{_e(engine)}</b><pre>{_e(flag_text(plan.flags[engine]))}</pre>")
    body.append("<h2>Figures</h2>")
    body.append(_figures(figures) if figures else "<p>No figures.</p>")
    body.append(f"<h2>{_e(PLAN_VS_DEFAULT)}</h2>")
    body += [table_html(t) for t in plan_tables(plan)]
    return _page(f"cgtool plan: {title}", "\n".join(body))


def flag_text(lines: list[str]) -> str:
    """Flags one a line, continued with a backslash, as a shell takes them; notes after."""
    flags = [line for line in lines if line.startswith("--")]
    notes = [line for line in lines if not line.startswith("--")]
    return "\n".join([" \\\n".join(flags), *notes]).strip()


def table_html(data: TableData) -> str:
    data = for_people(data)
    head = "".join(f"<th>{_e(c)}</th>" for c in data.columns)
    rows = "".join(
        _row_open(data, i)
        + "".join(f"<td>{_e(cell)}</td>" for cell in row) + "</tr>"
        for i, row in enumerate(data.rows)
    )
    caption = f"<caption>{_e(data.title)}</caption>" if data.title else ""
    note = f"<p class='sub'>{_e(data.caption)}</p>" if data.caption else ""
    return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>{note}"


def _row_open(data: TableData, i: int) -> str:
    if i in data.marked:
        return "<tr class='marked'>"
    return "<tr class='heading'>" if i in data.headings else "<tr>"


def png_data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _figures(paths: list[Path]) -> str:
    images = "".join(f"<img alt='{_e(p.stem)}' src='{png_data_uri(p)}'>" for p in paths)
    return f"<div class='figs'>{images}</div>"


def _cards(items: list[tuple[str, str]]) -> str:
    return "<div class='cards'>" + "".join(
        f"<div class='card'><b>{_e(value)}</b><span>{_e(label)}</span></div>"
        for value, label in items) + "</div>"


def _report_cards(report: CaptureReport) -> str:
    t = report.totals
    failed = sum(s.status == "failed" for s in report.sizes)
    unsafe = sum(s.status == "unsafe" for s in report.sizes)
    items = [(mib(t.graph_pool_bytes), "graph pool"), (f"{t.capture_s:.1f} s", "capture time"),
             (f"{t.kv_tokens:,}", "KV tokens"), (f"{len(report.sizes) - failed}", "sizes captured"),
             (f"{failed} / {unsafe}", "failed / unsafe sizes")]
    for kind in report.kinds():
        smallest = min(report.sizes_of(kind), key=lambda s: s.size)
        if smallest.speedup is not None:
            items.append((f"{smallest.speedup:.2f}x", f"{kind} speedup at size {smallest.size}"))
    return _cards(items)


def _plan_cards(plan: Plan) -> str:
    memory = plan.memory
    items = [headline_flag(plan), (mib(memory.graph_bytes), "graph memory"),
             (f"{memory.kv_tokens:,}", "KV tokens")]
    if plan.inputs.engine == "vllm":  # one shared list; its small sizes are full decode graphs
        items += [(str(len(plan.piecewise.capture_num_tokens)), "capture sizes (one list)"),
                  (str(len(plan.decode.capture_bs)), "of them full decode graphs")]
    else:
        items += [(str(len(plan.decode.capture_bs)), "decode sizes"),
                  (str(len(plan.piecewise.capture_num_tokens)), "piecewise sizes")]
    row = plan.row("plan")
    if row:
        items.append((f"{row.expected_step_ms:.3f} ms", "expected step time"))
    return _cards(items)


def headline_flag(plan: Plan) -> tuple[str, str]:
    """The planned engine's own memory flag and its value, as its flags spell it."""
    memory = plan.memory
    if plan.inputs.engine == "vllm" and memory.gpu_memory_utilization is not None:
        return f"{memory.gpu_memory_utilization:.3f}", "--gpu-memory-utilization"
    return f"{memory.mem_fraction_static:.3f}", "--mem-fraction-static"


def _kernel_sections(report: CaptureReport) -> str:
    tables = report.artifacts.kernel_tables
    if not tables:
        return ""
    parts = ["<h2>Kernels per forward (--profile)</h2>"]
    for key in tables:
        parts.append(f"<details><summary>{_e(key)}</summary>{table_html(kernel_rows(report, key))}"
                     "</details>")
    return "\n".join(parts)


def _artifact_links(report: CaptureReport, prefix: str) -> str:
    items = []
    snapshot, trace = report.artifacts.memory_snapshot, report.artifacts.chrome_trace
    if snapshot:
        # Torch's own HTML viewer loads scripts from the network; link the pickle instead.
        items.append(f"<li>Memory snapshot: <a href='{_e(prefix + snapshot)}'>{_e(snapshot)}</a>. "
                     f"Open <a href='{MEMORY_VIZ_URL}'>{MEMORY_VIZ_URL}</a> and drop the file "
                     "onto it to see every allocation of the graph pool.</li>")
    if trace:
        items.append(f"<li>Profiler trace: <a href='{_e(prefix + trace)}'>{_e(trace)}</a>. "
                     f"Open it in <a href='{PERFETTO_URL}'>{PERFETTO_URL}</a> or chrome://tracing.</li>")
    if not items:
        return ""
    return "<h2>Artifacts</h2><ul>" + "".join(items) + "</ul>"


def _page(title: str, body: str) -> str:
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>{_e(title)}</title><style>{_CSS}</style></head>"
            f"<body><main>\n{body}\n</main></body></html>\n")


def _e(text: str) -> str:
    return html.escape(str(text), quote=True)
