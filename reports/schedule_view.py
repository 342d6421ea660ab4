"""`cgtool schedule`'s table: an engine's default capture lists, as TableData."""

from __future__ import annotations

from typing import Any

from cgtool.reports.plan_view import ENGINE_NAMES
from cgtool.reports.tables import Cell, TableData
from cgtool.units import counted


def _every_size(sizes: list[int]) -> Cell:
    # Every size, never an ellipsis: this is the list a user copies. CSV/JSON: the list alone.
    text = f"{' '.join(map(str, sizes))}  ({counted(len(sizes), 'size')})" if sizes else "none (eager)"
    return Cell(text, list(sizes))


def schedule_rows(schedule: dict[str, Any]) -> TableData:
    rows = [
        ["decode batch sizes", _every_size(schedule["decode_bs"])],
        ["extend token bins", _every_size(schedule["piecewise_tokens"])],
        ["largest", f"batch {schedule['max_bs']}, tokens {schedule['max_tokens']}"],
        ["pads to the next size", "yes" if schedule["pads"] else "no (other sizes run eagerly)"],
        ["piecewise on by default", "yes" if schedule["piecewise_on_by_default"] else "no"],
        ["rule from", schedule["source"]],
    ]
    rules = schedule.get("release_rules")
    if rules:
        backend = rules["prefill_backend"]
        if rules["capture_through_chunk"]:
            backend += " (capture through --chunked-prefill-size, or not at all)"
        rows += [["prefill graphs", backend], ["off-grid sizes", rules["ceiling_rule"]],
                 ["memory flag counts", rules["fraction"]]]
        rows += [[f"assumes {e['name']}={e['assumed']}", e["effect"]] for e in rules["env"]]
        rows += [["read from", source] for source in rules["sources"]]
    title = f"{ENGINE_NAMES[schedule['engine']]} {schedule['version']} default capture schedule"
    return TableData(title, ["", "value"], rows, wrap_last=True)
