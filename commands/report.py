"""`cgtool report`: re-render tables, sizes.csv, figures and the HTML page from a saved run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cgtool.commands.common import FormatOption, OutputFormat, cli_errors, console, err_console
from cgtool.documents.plan_document import Plan
from cgtool.documents.results import CaptureReport
from cgtool.reports.formats import print_tables
from cgtool.reports.plan_view import plan_view


@cli_errors
def report(
    path: Annotated[Path, typer.Argument(
        help="A capture or plan output folder, or its report.json / plan.json.")],
    out: Annotated[Path | None, typer.Option(
        help="Write the rendered files here instead of beside the input.")] = None,
    output: FormatOption = OutputFormat.table,
) -> None:
    """Re-render tables, figures and an HTML page from a saved report or plan."""
    from cgtool.reports.capture_view import lone_decode_note
    from cgtool.reports.render import printed_tables, render_path  # matplotlib: when rendering

    rendered = render_path(path, out)
    document = rendered.document
    if isinstance(document, CaptureReport) and document.status == "incomplete":
        err_console.print(f"[yellow]incomplete run:[/] {document.incomplete_reason}",
                          highlight=False, soft_wrap=True)
    if isinstance(document, Plan) and output is OutputFormat.table:
        console.print(plan_view(document), soft_wrap=True)  # as `cgtool plan` prints, flags first
    else:
        print_tables(console, printed_tables(document), output.value)
    # With CSV or JSON, stdout holds only the data; the list of files goes to stderr.
    notes = console if output is OutputFormat.table else err_console
    note = lone_decode_note(document) if isinstance(document, CaptureReport) else None
    if note:
        notes.print(f"[bold]note:[/] {note}", highlight=False, soft_wrap=True)
    for written in rendered.files:
        notes.print(f"wrote {written}", highlight=False, soft_wrap=True)

