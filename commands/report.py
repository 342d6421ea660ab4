"""`cgtool report`: re-render tables, sizes.csv, figures and the HTML page from a saved run."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cgtool.commands.common import cli_errors, console, err_console
from cgtool.reports.plan_view import plan_view
from cgtool.reports.tables import size_rows, to_rich, totals_rows
from cgtool.results import CaptureReport

if TYPE_CHECKING:
    from cgtool.reports.render import Rendered


@cli_errors
def report(
    path: Annotated[Path, typer.Argument(
        help="A capture or plan output folder, or its report.json / plan.json.")],
    out: Annotated[Path | None, typer.Option(
        help="Write the rendered files here instead of beside the input.")] = None,
) -> None:
    """Re-render tables, figures and an HTML page from a saved report or plan."""
    from cgtool.reports.render import render_path  # matplotlib: only when rendering

    rendered = render_path(path, out)
    _print_tables(rendered)
    for written in rendered.files:
        console.print(f"wrote {written}", highlight=False, soft_wrap=True)


def _print_tables(rendered: Rendered) -> None:
    document = rendered.document
    if isinstance(document, CaptureReport):
        if document.status == "incomplete":
            err_console.print(f"[yellow]incomplete run:[/] {document.incomplete_reason}",
                              highlight=False, soft_wrap=True)
        tables = [size_rows(document, kind) for kind in document.kinds()] + [totals_rows(document)]
        for table in tables:
            console.print(to_rich(table))
    else:  # the same view as `cgtool plan`, flags first
        console.print(plan_view(document), soft_wrap=True)
