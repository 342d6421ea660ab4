"""Render everything for a saved report (sizes.csv, figures/*.png, report.html) or plan
(plan_*.png beside plan.json, plan.html, engine option files)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from cgtool.documents.plan_document import Plan
from cgtool.documents.results import CaptureReport, load_document, resolve_document
from cgtool.reports.csv import write_sizes_csv
from cgtool.reports.figures import write_report_figures
from cgtool.reports.html import plan_html, report_html
from cgtool.reports.plan_scenarios import plan_tables
from cgtool.reports.rank_tables import rank_tables
from cgtool.reports.tables import TableData, phase_rows, size_rows, spread_rows, totals_rows

REPORT_HTML, PLAN_HTML, FIGURE_DIR, SIZES_CSV = "report.html", "plan.html", "figures", "sizes.csv"


@dataclass(slots=True)
class Rendered:
    document: CaptureReport | Plan
    source: Path  # the report.json or plan.json read
    files: list[Path] = field(default_factory=list)


def render_path(path: Path, out_dir: Path | None = None) -> Rendered:
    """Load a report or plan (file or folder) and render it into `out_dir` (default: beside it)."""
    source = resolve_document(path)
    document = load_document(source)
    out_dir = out_dir or source.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    if isinstance(document, CaptureReport):
        return Rendered(document, source, render_report(document, out_dir, source.parent))
    return Rendered(document, source, render_plan(document, out_dir))


def printed_tables(document: CaptureReport | Plan) -> list[TableData]:
    """The tables `cgtool report` prints: a report's as `capture` printed them (sizes, totals,
    timing spread, phases, and every rank's with --tp); a plan's as plan.html shows them."""
    if isinstance(document, CaptureReport):
        tables = [size_rows(document, kind) for kind in document.kinds()] + [totals_rows(document)]
        if document.totals.sample_spread:
            tables.append(spread_rows(document))
        if document.totals.phase_s:
            tables.append(phase_rows(document))
        return tables + rank_tables(document)
    return plan_tables(document)


def render_report(report: CaptureReport, out_dir: Path, report_dir: Path | None = None) -> list[Path]:
    """sizes.csv, the figures and report.html; artifact links lead back to `report_dir`."""
    figures = write_report_figures(report, out_dir / FIGURE_DIR)
    csv_path = write_sizes_csv(report, out_dir / SIZES_CSV)
    prefix = os.path.relpath(report_dir or out_dir, out_dir)
    prefix = "" if prefix == "." else prefix.replace(os.sep, "/") + "/"
    html_path = out_dir / REPORT_HTML
    html_path.write_text(report_html(report, figures, prefix), encoding="utf-8")
    return [csv_path, *figures, html_path]


def render_plan(plan: Plan, out_dir: Path) -> list[Path]:
    """The plan's figures beside plan.json (as `plan --out` lays them out), plan.html, and the
    TensorRT-LLM options file its flags name."""
    from cgtool.reports.plan_figures import write_plan_figures  # matplotlib only when rendering

    figures = list(write_plan_figures(plan, out_dir))
    html_path = out_dir / PLAN_HTML
    html_path.write_text(plan_html(plan, figures), encoding="utf-8")
    return [*figures, html_path, *write_engine_files(plan, out_dir)]


_OPTIONS_FILE_LINE = re.compile(r"#\s*(?P<name>[\w.-]+\.ya?ml):\s*(?P<body>.+)")


def engine_files(plan: Plan) -> dict[str, str]:
    """Files the flags ask for by name: TensorRT-LLM takes its graph sizes only from an
    options file, which the flags spell out as a `# NAME.yaml: CONTENT` line."""
    files = {}
    for line in plan.flags.get("trtllm", []):
        match = _OPTIONS_FILE_LINE.fullmatch(line.strip())
        if match:
            files[match["name"]] = match["body"] + "\n"
    return files


def write_engine_files(plan: Plan, out_dir: Path) -> list[Path]:
    written = []
    for name, text in engine_files(plan).items():
        (out_dir / name).write_text(text, encoding="utf-8")
        written.append(out_dir / name)
    return written
