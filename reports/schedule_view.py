"""`cgtool schedule`'s table: an engine's default capture lists, as TableData."""

from __future__ import annotations

from typing import Any

from cgtool.reports.plan_view import ENGINE_NAMES
from cgtool.reports.tables import TableData
from cgtool.units import counted


def _every_size(sizes: list[int]) -> str:
    # Every size, never an ellipsis: this is the list a user copies.
    return f"{' '.join(map(str, sizes))}  ({counted(len(sizes), 'size')})" if sizes else "none (eager)"


def schedule_rows(schedule: dict[str, Any]) -> TableData:
    rows = [
        ["decode batch sizes", _every_size(schedule["decode_bs"])],
        ["extend token bins", _every_size(schedule["piecewise_tokens"])],
        ["largest", f"batch {schedule['max_bs']}, tokens {schedule['max_tokens']}"],
        ["pads to the next size", "yes" if schedule["pads"] else "no (other sizes run eagerly)"],
        ["piecewise on by default", "yes" if schedule["piecewise_on_by_default"] else "no"],
        ["rule from", schedule["source"]],
    ]
    title = f"{ENGINE_NAMES[schedule['engine']]} {schedule['version']} default capture schedule"
    return TableData(title, ["", "value"], rows, wrap_last=True)
