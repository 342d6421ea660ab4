"""Tables and JSON for `cgtool trace stats` and `cgtool trace convert`."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from cgtool.reports.fit import FittedTable
from cgtool.reports.tables import Cell, TableData
from cgtool.traces.stats import (
    PERCENTILES,
    BatchStats,
    ContextFilter,
    Distribution,
    RequestStats,
)
from cgtool.units import counted


def _distribution_row(name: str, unit: str, dist: Distribution) -> list[str]:
    return [
        name,
        unit,
        Cell(f"{dist.mean:,.1f}", dist.mean),
        *(Cell(f"{dist.p[q]:,}", dist.p[q]) for q in PERCENTILES),
        Cell(f"{dist.max:,}", dist.max),
    ]


def _distribution_table(title: str, rows: list[list[str]], caption: str) -> FittedTable:
    # Fitted to the terminal: at 80 columns a long trace's figures stay whole.
    columns = ["", "unit", "mean", *(f"p{q}" for q in PERCENTILES), "max"]
    return FittedTable(TableData(title, columns, rows, wrapping={1}, caption=caption), boxed=True,
                       stack_headers=False)


def request_stats_table(stats: RequestStats, context: ContextFilter | None = None) -> FittedTable:
    minutes = stats.duration_s / 60
    caption = (
        f"{counted(stats.num_requests, 'request')} over {minutes:,.1f} min, {stats.rate_per_s:,.2f} req/s"
    )
    caption += f"; {stats.cached_share:.1%} of prompt tokens cached"
    if context is not None:
        caption += (
            f"; {context.dropped:,} longer than the {context.context_len:,}-token context "
            "(dropped, as a server rejects them)"
        )
    rows = [
        _distribution_row("prompt", "tokens", stats.input_len),
        _distribution_row("cached prefix", "tokens", stats.cached_len),
        _distribution_row("output", "tokens", stats.output_len),
    ]
    return _distribution_table(f"Trace {stats.source}", rows, caption)


def batch_stats_table(stats: BatchStats) -> FittedTable:
    caption = (
        f"{stats.num_steps:,} steps: {stats.decode_steps:,} decode, {stats.extend_steps:,} extend "
        "(percentiles weighted by steps)"
    )
    rows = [
        _distribution_row("decode batch", "requests", stats.decode_batch_size),
        _distribution_row("extend batch", "tokens", stats.extend_num_tokens),
    ]
    return _distribution_table(f"Batch trace {stats.source}", rows, caption)


def stats_json(
    stats: RequestStats | BatchStats, context: ContextFilter | None = None
) -> dict[str, Any]:
    data: dict[str, Any] = {"kind": "requests" if isinstance(stats, RequestStats) else "batches"}
    data.update(asdict(stats))
    if context is not None:
        data["context_len"] = context.context_len
        data["dropped_over_context"] = context.dropped
    return data


def skipped_text(skipped: dict[str, int]) -> str:
    return ", ".join(f"{count:,} {reason}" for reason, count in skipped.items())
