"""reports/formats.py: the same TableData rows as rich tables, CSV blocks and JSON."""

from __future__ import annotations

import io

from rich.console import Console
from table_formats import as_tuples, csv_tables, json_tables

from cgtool.commands.common import OutputFormat
from cgtool.reports.formats import FORMATS, print_tables, tables_csv, tables_json
from cgtool.reports.tables import TableData

TABLES = [
    TableData("limits +5%, and over 1.0 MiB", ["size", "note"],
              [["decode bs 8", 'a "quoted", comma'], ["decode bs 4", "ok"]]),
    TableData("Totals", ["", "value"], [["weights", "15,316.5 MiB"]]),
]


def test_csv_blocks_read_back_with_titles_holding_commas_and_quoted_cells():
    assert csv_tables(tables_csv(TABLES)) == as_tuples(TABLES, "csv")


def test_csv_block_starts_with_a_title_row_and_blocks_are_separated_by_a_blank_line():
    lines = tables_csv(TABLES).splitlines()
    assert lines[0] == '"# limits +5%, and over 1.0 MiB"'
    assert lines[lines.index("# Totals") - 1] == ""


def test_json_is_a_list_of_title_columns_rows_in_print_order():
    assert json_tables(tables_json(TABLES)) == as_tuples(TABLES)


def test_table_format_prints_every_row_through_rich():
    console = Console(file=io.StringIO(), width=200)
    print_tables(console, TABLES, "table")
    text = console.file.getvalue()
    assert "decode bs 8" in text and "15,316.5 MiB" in text and "Totals" in text


def test_output_format_names_match_the_renderer():
    assert tuple(f.value for f in OutputFormat) == FORMATS
