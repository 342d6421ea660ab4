"""One set of TableData rows, three outputs: rich tables, CSV blocks, or JSON.

CSV: one block per table, a `# title` row, the header row, then the rows; blocks are separated
by a blank line. JSON: a list of `{"title", "columns", "rows"}` objects in print order (a list,
not an object keyed by title, because the order carries meaning and titles are sentences).
Cells are the strings the table shows, so all three formats agree row for row.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence

from rich.console import Console

from cgtool.reports.tables import TableData, to_rich

FORMATS = ("table", "csv", "json")


def tables_csv(tables: Sequence[TableData]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for i, table in enumerate(tables):
        if i:
            out.write("\n")
        writer.writerow([f"# {table.title}"])  # quoted when the title holds a comma
        writer.writerow(table.columns)
        writer.writerows(table.rows)
    return out.getvalue()


def tables_json(tables: Sequence[TableData]) -> str:
    data = [{"title": t.title, "columns": t.columns, "rows": t.rows} for t in tables]
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def print_tables(console: Console, tables: Sequence[TableData], output: str) -> None:
    """Write `tables` to `console` as rich tables, CSV or JSON (`output` is one of FORMATS)."""
    if output == "table":
        for table in tables:
            console.print(to_rich(table))
        return
    text = {"csv": tables_csv, "json": tables_json}[output](tables)
    console.file.write(text)  # raw: no markup, wrapping or highlighting may touch the data
    console.file.flush()
