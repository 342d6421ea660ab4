"""`cgtool trace convert` and `cgtool trace stats`."""

from __future__ import annotations

import typer

from cgtool.commands.common import not_available

trace_app = typer.Typer(help="Convert public and production traces to cgtool's format; summarise one.")


@trace_app.command("convert")
def convert() -> None:
    """Convert a trace (Azure, BurstGPT, Mooncake, SGLang logs, vLLM metrics) to cgtool JSONL."""
    not_available("trace convert")


@trace_app.command("stats")
def stats() -> None:
    """Summarise a trace: count, duration, rate, length percentiles."""
    not_available("trace stats")
