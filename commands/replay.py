"""`cgtool replay`: a slice of a trace through cgtool's own continuous-batching loop, measured
against the simulator's prediction of the same slice."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from cgtool.commands.capture import PrefillBackend
from cgtool.commands.common import DEFAULT_MODEL, cli_errors, console, err_console
from cgtool.commands.signals import StopRequest
from cgtool.errors import EnvironmentProblem, InputError


@cli_errors
def replay(
    trace: Annotated[Path, typer.Option(help="Requests in cgtool's JSON Lines (cgtool trace convert).")],
    plan: Annotated[Path | None, typer.Option(help="plan.json: its sizes and limits (with --default: its default's sizes).")] = None,
    default: Annotated[bool, typer.Option("--default", help="Replay the engine's default capture sizes.")] = False,
    requests: Annotated[int, typer.Option(help="The slice: the first N requests of the trace.")] = 300,
    load: Annotated[float, typer.Option(help="Arrival rate multiple: arrival times are divided by it.")] = 1.0,
    model: Annotated[str | None, typer.Option(help=f"Model preset or HF folder (default: the plan's, else {DEFAULT_MODEL}).")] = None,
    profile: Annotated[list[Path] | None, typer.Option(help="Capture report of this model and GPU: the prediction's step times; repeat it with reports at several --context-len.")] = None,
    chunked_prefill_size: Annotated[int | None, typer.Option(help="Tokens per extend step (default: the plan's or the engine's).")] = None,
    max_running_requests: Annotated[int | None, typer.Option(help="Most requests running at once (default: the plan's or the engine's).")] = None,
    mem_fraction_static: Annotated[float | None, typer.Option(help="Sizes the KV pool as SGLang does (default: the plan's or the engine's).")] = None,
    max_total_tokens: Annotated[int | None, typer.Option(help="Fix the KV pool at this many tokens instead.")] = None,
    gpu: Annotated[str, typer.Option(help="The GPU the roofline prediction is for: auto or a name from `cgtool plan --help`.")] = "auto",
    device: Annotated[str, typer.Option(help="cuda (graphs), or cpu (eager, the torch backend: checks the policy).")] = "cuda",
    seed: Annotated[int, typer.Option(help="Seed of the random weights and prompt tokens.")] = 0,
    out: Annotated[Path, typer.Option(help="Folder for replay.json, figures and replay.html.")] = Path("cgtool-replay"),
    prefill_backend: Annotated[PrefillBackend | None, typer.Option(help="Prefill graphs: breakable or piecewise (torch.compile), as for `cgtool capture` (default: the plan's engine release's, else SGLang's latest: breakable).")] = None,
) -> None:
    """Run a trace slice through cgtool's model, KV pool and graphs under the simulator's
    scheduling policy, and print measured against predicted TTFT, TPOT, throughput, step
    time and decode batch sizes."""
    from cgtool.replay.run import prepare, resolve_gpu

    if device not in ("cuda", "cpu"):
        raise InputError(f"--device {device!r} is neither cuda nor cpu", "Use --device cuda or --device cpu.")
    if device == "cuda":
        _require_gpu()
    inputs = prepare(trace, plan=plan, default=default, requests=requests, load=load, model=model,
                     gpu=resolve_gpu(gpu, device), chunked_prefill_size=chunked_prefill_size,
                     max_running_requests=max_running_requests, mem_fraction_static=mem_fraction_static,
                     max_total_tokens=max_total_tokens, profile=profile, device=device, seed=seed,
                     prefill_backend=prefill_backend and prefill_backend.value)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--out {out}: cannot create the folder ({exc.strerror})", "Pick a writable folder.") from None
    stop = StopRequest()
    with stop.installed():
        result = _run(inputs, stop)
    from cgtool.replay.result import REPLAY_FILENAME, write_replay
    from cgtool.reports.replay_view import print_replay, render_replay

    write_replay(result, out / REPLAY_FILENAME)
    written = [out / REPLAY_FILENAME, *render_replay(result, out)]
    print_replay(console, result)
    console.print("wrote " + ", ".join(str(p) for p in written), highlight=False, soft_wrap=True)
    if stop.requested():
        err_console.print(f"stopped by {stop.name()}: replay.json is marked incomplete", highlight=False)
        raise typer.Exit(stop.exit_code())


def _run(inputs, stop: StopRequest):
    from cgtool.documents.provenance import collect_provenance
    from cgtool.replay.loop import Graphs
    from cgtool.replay.session import build_bench, capture_graphs, replay_once

    _phase(f"build {inputs.cfg.name} on {inputs.device}")
    bench = build_bench(inputs)
    graphs = Graphs()
    if inputs.device == "cuda":
        graphs = capture_graphs(bench, inputs.capture_bs, inputs.capture_num_tokens, _phase,
                                inputs.prefill_backend)
    stop.defer()  # from here a signal ends the loop at a step boundary and the run is kept
    result = replay_once(inputs, bench, graphs, _phase, stop.requested)
    result.provenance = collect_provenance()
    return result


def _require_gpu() -> None:
    import torch

    if not torch.cuda.is_available():
        raise EnvironmentProblem("cgtool replay needs a CUDA GPU and none is visible",
                                 "Run it on the GPU machine, or pass --device cpu to check the policy.")


def _phase(text: str) -> None:
    err_console.print(f"[{time.strftime('%H:%M:%S')}] {text}", highlight=False, soft_wrap=True)
