"""`cgtool schedule`."""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated

import typer

from cgtool.commands.common import (
    FORMAT_HELP,
    EngineVersionOpt,
    OutputFormat,
    TpOpt,
    cli_errors,
    console,
)
from cgtool.commands.plan import resolve_gpu
from cgtool.errors import InputError
from cgtool.planner.releases import release_rules
from cgtool.planner.schedules import ENGINES, default_schedule
from cgtool.reports.formats import print_tables
from cgtool.reports.schedule_view import schedule_rows


@cli_errors
def schedule(
    engine: Annotated[str, typer.Option(help=f"Engine: {', '.join(ENGINES)}.")] = "sglang",
    engine_version: EngineVersionOpt = None,
    max_bs: Annotated[
        int | None,
        typer.Option(help="Largest decode batch size (default: the engine's for the GPU)."),
    ] = None,
    max_tokens: Annotated[
        int | None, typer.Option(help="Largest extend token count (default: the engine's).")
    ] = None,
    gpu: Annotated[
        str,
        typer.Option(
            help="GPU whose memory sets the engine's defaults, e.g. H100-80GB, or auto (as "
            "`cgtool plan`: this machine's, else H100-80GB)."
        ),
    ] = "auto",
    tp: TpOpt = 1,
    given: Annotated[OutputFormat | None, typer.Option("--format", help=FORMAT_HELP)] = None,
    json_out: Annotated[bool, typer.Option(
        "--json", help="Print the schedule as JSON (the same as --format json).")] = False,
) -> None:
    """Print an engine's default capture schedule (SGLang, vLLM, TensorRT-LLM)."""
    output = _one_format(given, json_out)
    if tp < 1:
        raise InputError(f"--tp {tp} is not a number of GPUs", "Use --tp 1 or more.")
    spec, _ = resolve_gpu(gpu)  # the same GPU `cgtool plan` picks
    result = default_schedule(
        engine,
        engine_version,
        max_bs=max_bs,
        max_tokens=max_tokens,
        gpu_memory_bytes=spec.memory_bytes,
        tp_size=tp,
        gpu_name=spec.name,
    )
    data = dataclasses.asdict(result)
    data["decode_bs"], data["piecewise_tokens"] = (
        list(result.decode_bs),
        list(result.piecewise_tokens),
    )
    rules = release_rules(result.engine, result.version)
    data["release_rules"] = {
        "prefill_backend": rules.prefill_backend,
        "prefill_on_by_default": rules.prefill_on_by_default,
        "capture_through_chunk": rules.capture_through_chunk,
        "ceiling_rule": rules.ceiling_rule,
        "fraction": rules.fraction,
        "env": [dataclasses.asdict(e) for e in rules.env],
        "sources": [s.cite() for s in rules.sources],
    }
    if output is OutputFormat.json:
        # The schedule itself, as `--json` has always printed it: whole lists and numbers.
        console.print_json(json.dumps(data))
    else:
        print_tables(console, [schedule_rows(data)], output.value)


def _one_format(given: OutputFormat | None, json_out: bool) -> OutputFormat:
    # --json is the older spelling of --format json; the two may not disagree.
    if json_out and given is not None and given is not OutputFormat.json:
        raise InputError(f"--json and --format {given.value} ask for different outputs",
                         "Give one of them.")
    return OutputFormat.json if json_out else given or OutputFormat.table
