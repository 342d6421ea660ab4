"""`cgtool schedule`."""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated

import typer

from cgtool.commands.common import cli_errors, console
from cgtool.commands.plan import resolve_gpu
from cgtool.planner.schedules import ENGINES, default_schedule
from cgtool.reports.plan_view import schedule_table


@cli_errors
def schedule(
    engine: Annotated[str, typer.Option(help=f"Engine: {', '.join(ENGINES)}.")] = "sglang",
    engine_version: Annotated[
        str | None, typer.Option(help="Engine release (default: the newest cgtool knows).")
    ] = None,
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
    tp: Annotated[int, typer.Option("--tp", min=1, help="Tensor-parallel GPUs per server.")] = 1,
    json_out: Annotated[bool, typer.Option("--json", help="Print the schedule as JSON.")] = False,
) -> None:
    """Print an engine's default capture schedule (SGLang, vLLM, TensorRT-LLM)."""
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
    if json_out:
        console.print_json(json.dumps(data))
    else:
        console.print(schedule_table(data))
