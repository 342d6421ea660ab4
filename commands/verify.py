"""`cgtool verify`: prove a plan on the GPU before anyone pastes it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from cgtool.commands.capture import PrefillBackend
from cgtool.commands.common import (
    check_out_folder,
    cli_errors,
    console,
    err_console,
    import_gpu_module,
)
from cgtool.errors import EnvironmentProblem, InputError
from cgtool.traces.convert import FORMATS


@cli_errors
def verify(
    plan: Annotated[Path, typer.Option(help="plan.json written by `cgtool plan --out DIR`.")],
    trace: Annotated[Path | None, typer.Option(help="The trace the plan was made from: steps then carry their simulated contexts.")] = None,
    trace_format: Annotated[str, typer.Option("--format", help="Format of --trace, as for `cgtool plan`.")] = "cgtool",
    steps: Annotated[int, typer.Option(help="Simulated steps to sample and replay through each graph set.")] = 2000,
    repeats: Annotated[int, typer.Option(help="Timed passes over the sample; the ratio's interval comes from them.")] = 3,
    seed: Annotated[int, typer.Option(help="Seed of the step sample.")] = 0,
    mem_fraction_static: Annotated[float | None, typer.Option(help="Override the plan's --mem-fraction-static.")] = None,
    out: Annotated[Path, typer.Option(help="Folder for verify.json, figures and verify.html.")] = Path("cgtool-verify"),
    headroom: Annotated[str, typer.Option(help="GPU memory the proven fraction must leave free at the worst step (a second build and rehearsal proves it).")] = "1.5GiB",
    prefill_backend: Annotated[PrefillBackend | None, typer.Option(help="Prefill graphs: breakable or piecewise (torch.compile), as for `cgtool capture` (default: the plan's engine release's, breakable for SGLang 0.5.23).")] = None,
) -> None:
    """Capture the plan's and the default's graphs, replay sampled steps through both, compare
    with the predictions and rehearse the plan's memory fraction (GPU only)."""
    from cgtool.commands.plan import parse_bytes

    # What can be checked without the GPU modules (their import needs Triton) is, first.
    headroom_bytes = parse_bytes(headroom, "--headroom")
    if trace_format not in FORMATS:
        raise InputError(f"--format {trace_format} is not a trace format",
                         f"Use one of {', '.join(FORMATS)} (as for `cgtool plan`).")
    check_out_folder(out)
    prepare = import_gpu_module("cgtool.verify.run", _require_gpu).prepare
    inputs = prepare(plan, trace=trace, trace_format=trace_format, num_steps=steps,
                     repeats=repeats, seed=seed, mem_fraction_static=mem_fraction_static,
                     headroom_bytes=headroom_bytes,
                     prefill_backend=prefill_backend and prefill_backend.value)
    _require_gpu()
    _prepare_out(out)
    from cgtool.reports.verify_html import render_verify
    from cgtool.reports.verify_view import print_verify
    from cgtool.verify.result import VERIFY_FILENAME, write_verify
    from cgtool.verify.run import run_verify
    from cgtool.verify.summary import verify_exit_code

    source = "the plan" if inputs.fraction_source == "plan" else "--mem-fraction-static"
    _phase(f"{len(inputs.steps)} steps sampled of {inputs.population.total:,} simulated "
           f"({inputs.population.source}); --mem-fraction-static {inputs.mem_fraction_static:g} from {source}; "
           f"{inputs.prefill_backend} prefill graphs")
    result = run_verify(inputs, _phase)
    write_verify(result, out / VERIFY_FILENAME)
    written = [out / VERIFY_FILENAME, *render_verify(result, out)]
    print_verify(console, result)
    console.print("wrote " + ", ".join(str(p) for p in written), highlight=False, soft_wrap=True)
    raise typer.Exit(verify_exit_code(result))


def _require_gpu() -> None:
    import torch

    if not torch.cuda.is_available():
        raise EnvironmentProblem("cgtool verify needs a CUDA GPU and none is visible",
                                 "Run it on the GPU machine the plan is for.")


def _prepare_out(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--out {out}: cannot create the folder ({exc.strerror})", "Pick a writable folder.") from None


def _phase(text: str) -> None:
    # Timestamped lines, not a live bar: verify runs for minutes and is read from CI logs.
    err_console.print(f"[{time.strftime('%H:%M:%S')}] {text}", highlight=False, soft_wrap=True)
