"""`cgtool check`: the CI gate on capture memory (and, opt-in, timings)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cgtool.commands.common import (
    EXIT_CHECK_FAILED,
    FormatOption,
    OutputFormat,
    cli_errors,
    console,
    err_console,
)
from cgtool.documents.compare import (
    DEFAULT_REPORT_METRICS,
    PLAN_METRICS,
    REPORT_METRICS,
    Comparison,
    compare_plans,
    compare_reports,
)
from cgtool.documents.invariants import require_memory_invariants
from cgtool.documents.plan_document import Plan
from cgtool.documents.results import CaptureReport, load_document, resolve_document
from cgtool.errors import InputError
from cgtool.reports.formats import print_tables
from cgtool.reports.markdown import comparison_markdown
from cgtool.reports.tables import comparison_rows, format_change


@cli_errors
def check(
    baseline: Annotated[Path, typer.Argument(help="Baseline report.json, plan.json or verify.json, or its folder.")],
    current: Annotated[Path, typer.Argument(help="Current report.json, plan.json or verify.json, or its folder.")],
    max_regress: Annotated[str, typer.Option(
        help="Largest allowed growth of memory (and plan figures), e.g. 5%.")] = "5%",
    latency_regress: Annotated[str, typer.Option(
        help="Largest allowed growth of timings (capture_s, replay_ms, eager_ms); looser "
             "because GPU timings drift a few percent between runs.")] = "15%",
    metric: Annotated[str | None, typer.Option(
        help=f"Comma-separated report metrics: {', '.join(REPORT_METRICS)}. "
             f"Default: {', '.join(DEFAULT_REPORT_METRICS)} (deterministic). Plans always "
             f"compare {', '.join(PLAN_METRICS)}.")] = None,
    markdown: Annotated[str | None, typer.Option(
        help="Write a markdown summary to this file ('-' prints it instead of the table).")] = None,
    force: Annotated[bool, typer.Option(
        help="Compare even when GPU or model differ.")] = False,
    output: FormatOption = OutputFormat.table,
) -> None:
    """Compare two capture reports (or two plans) size by size; exit 1 on a regression."""
    if markdown == "-" and output is not OutputFormat.table:
        raise InputError(f"--markdown - and --format {output.value} both want stdout",
                         "Write the markdown to a file, or drop --format.")
    max_pct = parse_percent(max_regress, "--max-regress")
    latency_pct = parse_percent(latency_regress, "--latency-regress")
    comparison = _compare_verifies(baseline, current, max_pct)  # two verify.json: proven memory
    if comparison is None:
        before, after = load_document(baseline), load_document(current)
        _require_consistent_memory((baseline, before), (current, after))
        comparison = _compare(before, after, metric, max_pct, latency_pct, force)
    summary = comparison_markdown(comparison, str(baseline), str(current)) if markdown else ""
    if markdown == "-":
        console.print(summary, markup=False, highlight=False, soft_wrap=True)
    else:
        if markdown:  # before the verdict is printed: an unwritable path is bad input (exit 2)
            Path(markdown).write_text(summary)
        _print_comparison(comparison, output)
    if not comparison.passed:
        raise typer.Exit(EXIT_CHECK_FAILED)


def parse_percent(text: str, option: str) -> float:
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        raise InputError(f"{option} '{text}' is not a percentage", "Write it like 5%.") from None
    if not 0 <= value < 1e6:
        raise InputError(f"{option} {text} is out of range", "Use a percentage of 0 or more.")
    return value


def _compare_verifies(baseline: Path, current: Path, max_pct: float) -> Comparison | None:
    from cgtool.verify.gate import compare_verifies
    from cgtool.verify.result import is_verify_document, load_verify

    if not (is_verify_document(baseline) and is_verify_document(current)):
        return None
    return compare_verifies(load_verify(baseline), load_verify(current), max_pct)


def _require_consistent_memory(*documents: tuple[Path, CaptureReport | Plan]) -> None:
    # A report whose memory figures contradict each other gates nothing: refuse it (exit 2).
    for path, document in documents:
        if isinstance(document, CaptureReport):
            require_memory_invariants(document, str(resolve_document(path)))


def _compare(before: CaptureReport | Plan, after: CaptureReport | Plan, metric: str | None,
             max_pct: float, latency_pct: float, force: bool) -> Comparison:
    if isinstance(before, CaptureReport) and isinstance(after, CaptureReport):
        names = [m.strip() for m in metric.split(",") if m.strip()] if metric else None
        return compare_reports(before, after, names or DEFAULT_REPORT_METRICS, max_pct,
                               latency_pct, force)
    if isinstance(before, Plan) and isinstance(after, Plan):
        if metric:
            raise InputError("--metric applies to capture reports, not plans",
                             f"Plans are compared on {', '.join(PLAN_METRICS)}; drop --metric.")
        return compare_plans(before, after, max_pct, force)
    raise InputError("cannot compare a capture report with a plan",
                     "Pass two report.json files or two plan.json files.")


def _print_comparison(comparison: Comparison, output: OutputFormat) -> None:
    print_tables(console, [comparison_rows(comparison)], output.value)
    # With CSV or JSON, stdout holds only the data; the verdict goes to stderr.
    notes = console if output is OutputFormat.table else err_console
    if comparison.added:
        notes.print("Sizes only in current: " + ", ".join(comparison.added), soft_wrap=True)
    if comparison.removed:
        notes.print("Sizes only in baseline: " + ", ".join(comparison.removed), soft_wrap=True)
    for warning in comparison.warnings:
        notes.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    if comparison.passed:
        notes.print("[green]PASS[/]: no regression beyond the limits.", highlight=False)
        return
    notes.print(f"[bold red]FAIL[/]: {len(comparison.regressions)} regression(s)", highlight=False)
    for change in comparison.regressions:
        detail = change.note or f"{format_change(change.change_pct)} (limit +{change.threshold_pct:g}%)"
        notes.print(f"  {change.label}: {change.metric} {detail}", highlight=False, soft_wrap=True)
