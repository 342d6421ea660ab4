"""Read back what `--format csv|json` printed, with the standard library only."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from cgtool.reports.tables import TableData, plain


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


def json_tables(text: str) -> list[tuple[str, list[Any], list[list[Any]]]]:
    return [(t["title"], t["columns"], t["rows"]) for t in json.loads(text)]


def _as_csv(value: Any) -> str:
    if value is None:
        return ""
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


def as_tuples(tables: list[TableData], output: str = "json") -> list[tuple[str, list[Any], list[list[Any]]]]:
    """The tables as `--format output` carries them: each cell's plain value (CSV: as text)."""
    cast = _as_csv if output == "csv" else (lambda v: v)
    return [(t.title, [cast(plain(c)) for c in t.columns],
             [[cast(plain(c)) for c in row] for row in t.rows]) for t in tables]
