"""Tables and JSON for `cgtool trace stats` and `cgtool trace convert`."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rich.table import Table

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
        f"{dist.mean:,.1f}",
        *(f"{dist.p[q]:,}" for q in PERCENTILES),
        f"{dist.max:,}",
    ]


def _distribution_table(title: str) -> Table:
    table = Table(title=title)
    table.add_column("", no_wrap=True)
    table.add_column("unit", no_wrap=True)
    for column in ("mean", *(f"p{q}" for q in PERCENTILES), "max"):
        table.add_column(column, justify="right", no_wrap=True)
    return table


def request_stats_table(stats: RequestStats, context: ContextFilter | None = None) -> Table:
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
    table = _distribution_table(f"Trace {stats.source}")
    table.caption = caption
    table.add_row(*_distribution_row("prompt", "tokens", stats.input_len))
    table.add_row(*_distribution_row("cached prefix", "tokens", stats.cached_len))
    table.add_row(*_distribution_row("output", "tokens", stats.output_len))
    return table


def batch_stats_table(stats: BatchStats) -> Table:
    table = _distribution_table(f"Batch trace {stats.source}")
    table.caption = (
        f"{stats.num_steps:,} steps: {stats.decode_steps:,} decode, {stats.extend_steps:,} extend "
        "(percentiles weighted by steps)"
    )
    table.add_row(*_distribution_row("decode batch", "requests", stats.decode_batch_size))
    table.add_row(*_distribution_row("extend batch", "tokens", stats.extend_num_tokens))
    return table


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
