"""A plan figure as a table cell, from its field name alone: `ttft_p99_ms` reads "TTFT p99"
and shows "412.310 ms", and CSV and JSON carry 412.31. Rows and columns built this way show
any figure a plan carries, including ones added after these tables were written."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from cgtool.reports.tables import Cell, gib
from cgtool.units import GIB

_WORDS = {"ttft": "TTFT", "tpot": "TPOT", "kv": "KV"}
# Names that hold a share of 1 rather than a count or a time.
_SHARES = ("coverage", "waste", "share", "fraction", "utilization")


def _fmt_ms(v: float) -> str:
    return f"{v:,.3f} ms"


def _fmt_s(v: float) -> str:
    return f"{v:,.3f} s" if abs(v) < 10 else f"{v:,.1f} s"


def _fmt_count(v: float) -> str:
    return f"{v:,.0f}" if float(v).is_integer() or abs(v) >= 1000 else f"{v:,.2f}"


# (suffix, unit word removed from the label, text) in the order they are tried.
_UNITS: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("_ms", "_ms", _fmt_ms),
    ("_per_s", "_per_s", lambda v: f"{v:,.1f}/s"),
    ("_s", "_s", _fmt_s),
    ("_bytes", "_bytes", lambda v: gib(v) if abs(v) >= GIB else f"{v / 2**20:,.1f} MiB"),
    ("tokens", "", lambda v: f"{v:,.0f}"),
)


def metric_label(name: str) -> str:
    """'ttft_p99_ms' -> 'TTFT p99'; 'kv_tokens' -> 'KV tokens'."""
    stem, per = name, ""
    for suffix, unit, _ in _UNITS:
        if unit and stem.endswith(suffix):
            stem, per = stem[: -len(suffix)], "/s" if suffix == "_per_s" else ""
            break
    return " ".join(_WORDS.get(word, word) for word in stem.split("_") if word) + per


def metric_text(name: str, value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(metric_text(name, v) for v in value) or "none"
    if not isinstance(value, (int, float)):
        return str(value)
    if any(word in name for word in _SHARES) and abs(value) <= 1:
        return f"{value:.1%}"
    for suffix, _, fmt in _UNITS:
        if name.endswith(suffix):
            return fmt(value)
    return _fmt_count(value)


def metric_cell(name: str, value: Any) -> Cell:
    """The value shown for a person, carried plain (a number, a full list, None) for CSV/JSON."""
    return Cell(metric_text(name, value), list(value) if isinstance(value, tuple) else value)


def label_cell(name: str, label: str | None = None) -> Cell:
    """A row's label for a person; CSV and JSON name the row by its field (unit in the name)."""
    return Cell(label if label is not None else metric_label(name), name)


def is_figure(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def extra_figures(row: Any, known: set[str]) -> list[str]:
    """A dataclass row's numeric fields that no table names yet, in declaration order."""
    return [f.name for f in dataclasses.fields(row)
            if f.name not in known and is_figure(getattr(row, f.name))]
