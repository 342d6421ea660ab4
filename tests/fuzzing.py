"""Hypothesis settings and a scratch folder shared by the fuzz tests of readers and converters."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

_WORKDIR = Path(tempfile.mkdtemp(prefix="cgtool-fuzz-"))


def fuzz(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,  # leave nothing behind in the repository
        suppress_health_check=[HealthCheck.too_slow],
    )


def fuzz_file(content: bytes | str, name: str = "trace.jsonl") -> Path:
    """Overwritten by every example: a generated file lives only as long as its parse."""
    path = _WORKDIR / name
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_bytes(content)
    return path


def spoil_one_record(
    records: list[dict], data: st.DataObject, bad: dict[str, st.SearchStrategy], optional: str
) -> tuple[int, str]:
    """Give one record a bad value, or take away a required field; returns (index, field).
    `optional` may be missing, so it only ever gets a bad value."""
    index = data.draw(st.integers(0, len(records) - 1))
    field = data.draw(st.sampled_from(sorted(bad)))
    if field != optional and data.draw(st.booleans()):
        del records[index][field]  # missing
    else:
        records[index][field] = data.draw(bad[field])
    return index, field


def spoil_one_cell(
    rows: list[list[str]], data: st.DataObject, bad: dict[int, tuple[str, st.SearchStrategy]]
) -> tuple[int, str]:
    """Put a bad cell in one column of one row; `bad` maps a column to its header and the bad
    cells it may get. Returns (row index, header)."""
    index = data.draw(st.integers(0, len(rows) - 1))
    column = data.draw(st.sampled_from(sorted(bad)))
    name, cells = bad[column]
    rows[index][column] = data.draw(cells)
    return index, name
