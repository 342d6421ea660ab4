"""One set of TableData rows, three outputs: rich tables, CSV blocks, or JSON.

CSV: one block per table, a `# title` row, the header row, then the rows; blocks are separated
by a blank line. JSON: a list of `{"title", "columns", "rows"}` objects in print order (a list,
not an object keyed by title, because the order carries meaning and titles are sentences).
The rows are the same in all three, row for row. A table shows a cell as text ("11.004 ms",
"457,515", "1 2 4 ... (28 sizes)"); CSV and JSON carry the plain value behind it (11.004,
457515, every size), so a script reads numbers, not a display. Row labels of mixed-unit
tables are then their field names with the unit in them (expected_step_ms, graph_bytes).
CSV writes a list as its numbers separated by spaces and a missing value as an empty cell.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from typing import Any

from rich.console import Console

from cgtool.reports.tables import TableData, plain, to_rich

FORMATS = ("table", "csv", "json")


def tables_csv(tables: Sequence[TableData]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for i, table in enumerate(tables):
        if i:
            out.write("\n")
        writer.writerow([f"# {table.title}"])  # quoted when the title holds a comma
        writer.writerow(plain(c) for c in table.columns)
        writer.writerows([_csv_value(plain(cell)) for cell in row] for row in table.rows)
    return out.getvalue()


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value))
    return value


def _json_value(value: Any) -> Any:
    # JSON has no infinity: a metric that appeared or vanished ("new", "gone") stays a word.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def tables_json(tables: Sequence[TableData]) -> str:
    data = [{"title": t.title, "columns": [plain(c) for c in t.columns],
             "rows": [[_json_value(plain(cell)) for cell in row] for row in t.rows]} for t in tables]
    return json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def print_tables(console: Console, tables: Sequence[TableData], output: str) -> None:
    """Write `tables` to `console` as rich tables, CSV or JSON (`output` is one of FORMATS)."""
    if output == "table":
        for table in tables:
            console.print(to_rich(table))
        return
    text = {"csv": tables_csv, "json": tables_json}[output](tables)
    console.file.write(text)  # raw: no markup, wrapping or highlighting may touch the data
    console.file.flush()
