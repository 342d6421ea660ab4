"""Read back what `--format csv|json` printed, with the standard library only."""

from __future__ import annotations

import csv
import io
import json

from cgtool.reports.tables import TableData


def csv_tables(text: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) per block: a `# title` row, a header row, rows, a blank line."""
    tables: list[tuple[str, list[str], list[list[str]]]] = []
    rows = list(csv.reader(io.StringIO(text)))
    for row in rows:
        if len(row) == 1 and row[0].startswith("# "):
            tables.append((row[0][2:], [], []))
        elif row and not tables[-1][1]:
            tables[-1][1].extend(row)
        elif row:
            tables[-1][2].append(row)
    return tables


def json_tables(text: str) -> list[tuple[str, list[str], list[list[str]]]]:
    return [(t["title"], t["columns"], t["rows"]) for t in json.loads(text)]


def as_tuples(tables: list[TableData]) -> list[tuple[str, list[str], list[list[str]]]]:
    return [(t.title, t.columns, t.rows) for t in tables]
