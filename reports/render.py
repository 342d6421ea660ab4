"""Render everything for a saved report or plan: sizes.csv, figures/*.png and one HTML page."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cgtool.reports.csv import write_sizes_csv
from cgtool.reports.figures import write_report_figures
from cgtool.reports.html import plan_html, report_html
from cgtool.results import CaptureReport, load_document, resolve_document

REPORT_HTML, PLAN_HTML, FIGURE_DIR, SIZES_CSV = "report.html", "plan.html", "figures", "sizes.csv"


@dataclass(slots=True)
class Rendered:
    document: CaptureReport | dict[str, Any]
    source: Path  # the report.json or plan.json read
    files: list[Path] = field(default_factory=list)
    note: str = ""  # what could not be rendered, and why


def render_path(path: Path, out_dir: Path | None = None) -> Rendered:
    """Load a report or plan (file or folder) and render it into `out_dir` (default: beside it)."""
    source = resolve_document(path)
    document = load_document(source)
    out_dir = out_dir or source.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    if isinstance(document, CaptureReport):
        return Rendered(document, source, render_report(document, out_dir, source.parent))
    files, note = render_plan(document, out_dir)
    return Rendered(document, source, files, note)


def render_report(report: CaptureReport, out_dir: Path, report_dir: Path | None = None) -> list[Path]:
    """sizes.csv, the figures and report.html; artifact links lead back to `report_dir`."""
    figures = write_report_figures(report, out_dir / FIGURE_DIR)
    csv_path = write_sizes_csv(report, out_dir / SIZES_CSV)
    prefix = os.path.relpath(report_dir or out_dir, out_dir)
    prefix = "" if prefix == "." else prefix.replace(os.sep, "/") + "/"
    html_path = out_dir / REPORT_HTML
    html_path.write_text(report_html(report, figures, prefix), encoding="utf-8")
    return [csv_path, *figures, html_path]


def render_plan(plan: dict[str, Any], out_dir: Path) -> tuple[list[Path], str]:
    figures, note = _plan_figures(plan, out_dir / FIGURE_DIR)
    html_path = out_dir / PLAN_HTML
    html_path.write_text(plan_html(plan, figures, note), encoding="utf-8")
    return [*figures, html_path], note


def _plan_figures(plan: dict[str, Any], fig_dir: Path) -> tuple[list[Path], str]:
    # The planner owns its figures (histograms with the chosen sizes, memory breakdown).
    try:
        module = importlib.import_module("cgtool.reports.plan_figures")
    except ImportError:
        return [], "Plan figures are not available in this cgtool version; tables only."
    fig_dir.mkdir(parents=True, exist_ok=True)
    return list(module.write_plan_figures(plan, fig_dir)), ""
