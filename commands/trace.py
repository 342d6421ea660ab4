"""`cgtool trace convert` and `cgtool trace stats`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from cgtool.commands.common import cli_errors, console, err_console
from cgtool.commands.usage import CgtoolCommand, CgtoolGroup
from cgtool.errors import InputError
from cgtool.reports.trace_tables import (
    batch_stats_table,
    request_stats_table,
    skipped_text,
    stats_json,
)
from cgtool.specs.config import load_model_config
from cgtool.traces.convert import FORMATS, first_requests, load_trace
from cgtool.traces.sniff import guess_format
from cgtool.traces.stats import ContextFilter, batch_stats, drop_over_context, request_stats
from cgtool.traces.trace import ConvertResult, RequestTrace, write_trace
from cgtool.units import counted

trace_app = typer.Typer(
    help="Convert public and production traces to cgtool's format; summarise one.",
    no_args_is_help=True,
    cls=CgtoolGroup,
)

FORMAT_HELP = "Source format: " + ", ".join(FORMATS) + " (see docs/traces.md)."
ModelOption = Annotated[
    str | None,
    typer.Option(
        help="Model preset or HF folder: drop requests longer than its context, as a server would."
    ),
]
ContextOption = Annotated[
    int | None,
    typer.Option("--context-len", min=1, help="Context length in tokens (overrides the model's)."),
]
BlockOption = Annotated[
    int, typer.Option("--block-tokens", min=1, help="Mooncake: tokens per hash_ids block.")
]
IntervalOption = Annotated[
    int,
    typer.Option(
        "--decode-log-interval", min=1, help="SGLang: the server's --decode-log-interval."
    ),
]


def load_trace_hinted(
    path: Path, trace_format: str, block_tokens: int = 512, decode_log_interval: int = 40
) -> ConvertResult:
    """load_trace, and when a file read as cgtool's is refused but looks like a public format,
    the remedy names `--format` for it."""
    try:
        return load_trace(path, trace_format, block_tokens, decode_log_interval)
    except InputError as error:
        guess = guess_format(path) if trace_format == "cgtool" else None
        if guess is None:
            raise
        raise InputError(
            error.message, f"The file looks like the {guess} format: pass --format {guess}."
        ) from None


def _context_len(model: str | None, context_len: int | None) -> tuple[int | None, str]:
    if context_len is not None:
        return context_len, f"--context-len {context_len:,}"
    if model is None:
        return None, ""
    config = load_model_config(model)
    return config.max_context_len, f"{config.name}'s context"


@trace_app.command("convert", cls=CgtoolCommand)
@cli_errors
def convert(
    source: Annotated[Path, typer.Argument(help="The trace file to convert.")],
    trace_format: Annotated[str, typer.Option("--format", "-f", help=FORMAT_HELP)],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write cgtool JSON Lines.")],
    model: ModelOption = None,
    context_len: ContextOption = None,
    limit: Annotated[
        int | None, typer.Option(min=1, help="Keep only the earliest N requests.")
    ] = None,
    block_tokens: BlockOption = 512,
    decode_log_interval: IntervalOption = 40,
) -> None:
    """Convert a trace (Azure, BurstGPT, Mooncake, SGLang logs, vLLM metrics) to cgtool JSONL."""
    if out.resolve() == source.resolve():
        raise InputError(f"--out {out} is the source file itself", "Write to another path.")
    result = load_trace_hinted(source, trace_format, block_tokens, decode_log_interval)
    trace = result.trace
    notes = [f"left out {skipped_text(result.skipped)}"] if result.skipped else []
    limit_len, context_name = _context_len(model, context_len)
    if isinstance(trace, RequestTrace):
        if limit_len is not None:
            context = drop_over_context(trace, limit_len)
            if not len(context.kept):
                raise InputError(
                    f"all {len(trace):,} requests of {source} are longer than {context_name} "
                    f"({limit_len:,} tokens)",
                    "Choose a model with a longer context, or another trace.",
                )
            trace = context.kept
            notes.append(
                f"dropped {context.dropped:,} longer than {context_name} ({limit_len:,} tokens)"
            )
        if limit is not None:
            trace = first_requests(trace, limit)
        summary = counted(len(trace), "request")
    else:
        if limit_len is not None or limit is not None:
            err_console.print(
                "note: --model, --context-len and --limit apply to request traces only"
            )
        summary = (
            f"{len(trace):,} steps ({len(trace.decode_count) + len(trace.extend_count):,} lines)"
        )
    write_trace(trace, out)
    console.print(
        f"Read {result.records_read:,} {trace_format} records from {source}; "
        f"wrote {summary} to {out}" + (f" ({'; '.join(notes)})" if notes else ""),
        highlight=False,
        soft_wrap=True,
    )


@trace_app.command("stats", cls=CgtoolCommand)
@cli_errors
def stats(
    trace_file: Annotated[Path, typer.Argument(help="The trace to summarise.")],
    trace_format: Annotated[str, typer.Option("--format", "-f", help=FORMAT_HELP)] = "cgtool",
    model: ModelOption = None,
    context_len: ContextOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    block_tokens: BlockOption = 512,
    decode_log_interval: IntervalOption = 40,
) -> None:
    """Summarise a trace: count, duration, rate, length percentiles."""
    trace = load_trace_hinted(trace_file, trace_format, block_tokens, decode_log_interval).trace
    limit_len, _ = _context_len(model, context_len)
    context: ContextFilter | None = None
    if isinstance(trace, RequestTrace):
        if limit_len is not None:
            context = drop_over_context(trace, limit_len)
            trace = context.kept
        summary = request_stats(trace)
        table = request_stats_table(summary, context)
    else:
        summary = batch_stats(trace)
        table = batch_stats_table(summary)
    if as_json:
        console.print_json(json.dumps(stats_json(summary, context)))
    else:
        console.print(table)
