"""`cgtool plan`."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from cgtool.commands.common import (
    DEFAULT_MODEL,
    EngineVersionOpt,
    ModelOption,
    TpOpt,
    cli_errors,
    console,
    err_console,
)
from cgtool.commands.signals import StopRequest, exit_code, signal_name
from cgtool.commands.trace import load_trace_hinted
from cgtool.documents.compare import compare_plan_warnings
from cgtool.documents.plan_document import PLAN_FILENAME, Plan, write_plan
from cgtool.documents.results import load_plan
from cgtool.errors import CgtoolError, InputError
from cgtool.planner.plan import plan_batches, plan_requests, plan_traffic
from cgtool.planner.releases import off_grid_ceilings, prefill_notes
from cgtool.planner.request import PlanRequest
from cgtool.planner.scenarios import Traffic, parse_loads
from cgtool.planner.schedules import resolve_version
from cgtool.planner.vit import vit_plan
from cgtool.replay.profile import load_profiles  # report.json, verify.json or replay.json
from cgtool.reports.plan_view import plan_view
from cgtool.specs.config import load_model_config
from cgtool.specs.gpus import GpuSpec, gpu_spec
from cgtool.specs.hidden_states import parse_hidden_modes
from cgtool.traces.convert import FORMATS
from cgtool.traces.lengths import (
    ARRIVAL_REMEDY,
    has_no_arrivals,
    read_lengths,
    with_poisson_arrivals,
)
from cgtool.traces.trace import BatchTrace, RequestTrace
from cgtool.units import BYTE_UNITS, counted

FALLBACK_GPU = "H100-80GB"


@dataclass(frozen=True)
class TrafficShape:
    """--rate / --concurrency / --seed: the traffic of a trace without arrival times."""

    rate: float | None
    concurrency: int | None
    seed: int

    @property
    def given(self) -> bool:
        return self.rate is not None or self.concurrency is not None

# Options of `plan` alone; those shared with other commands live in commands/common.py.
TraceOpt = Annotated[Path, typer.Option(help="Workload trace (cgtool JSON Lines, or --format).")]
TraceFormatOpt = Annotated[
    str,
    typer.Option("--format", help="Trace format: " + ", ".join(FORMATS) + ", or lengths (a CSV "
                 "of prompt and output lengths, no arrival times: add --rate or --concurrency)."),
]
RateOpt = Annotated[float | None, typer.Option(
    help="For a trace without arrival times: Poisson arrivals at this many requests a second.")]
ConcurrencyOpt = Annotated[int | None, typer.Option(
    min=1, help="For a trace without arrival times: keep this many requests in flight, a new "
    "one sent as one finishes.")]
SeedOpt = Annotated[int, typer.Option(help="Seed of the --rate arrivals.")]
GpuOpt = Annotated[
    str, typer.Option(help=f"GPU name (e.g. H100-80GB) or auto (falls back to {FALLBACK_GPU}).")
]
ProfileOpt = Annotated[
    list[Path] | None,
    typer.Option(help="Capture report.json, verify.json or replay.json: measured step times and graph "
                      "memory. Repeat it with capture reports at several --context-len to price decode "
                      "attention across them."),
]
BudgetGraphsOpt = Annotated[
    int | None, typer.Option(min=0, help="Capture at most this many graphs in all.")
]
BudgetMemoryOpt = Annotated[str | None, typer.Option(help="Graph memory budget, e.g. 2GiB.")]
EngineOpt = Annotated[str, typer.Option(help="Engine to plan for: sglang or vllm.")]
ChunkOpt = Annotated[
    int | None, typer.Option(min=1, help="Prefill token budget per step (default: the engine's).")
]
MaxRunningOpt = Annotated[
    int | None, typer.Option(min=1, help="Most requests running at once (default: the engine's).")
]
LoadOpt = Annotated[
    str,
    typer.Option(
        help="Replay the trace at these multiples of its arrival rate, e.g. 1,2; sizes "
        "hold up across all of them."
    ),
]
ReplicasOpt = Annotated[
    int, typer.Option(help="Data-parallel servers the trace is split across; one is planned.")
]
ComparePlanOpt = Annotated[
    Path | None,
    typer.Option(help="An existing plan.json whose sizes are scored on this trace too."),
]
OutOpt = Annotated[Path | None, typer.Option(help="Write plan.json and figures to this folder.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")]
AttentionBackendOpt = Annotated[str | None, typer.Option(
    "--attention-backend",
    help="SGLang's attention backend whose graph buffers the plan counts: flashinfer, fa3 or "
    "triton (default: the one SGLang picks for the model and GPU).",
)]
HiddenStatesOpt = Annotated[str, typer.Option(
    "--hidden-states",
    help="Decode graphs' hidden-state mode: null, last or full (last and full add a static output to the graph memory).",
)]


@cli_errors
def plan(
    trace: TraceOpt,
    trace_format: TraceFormatOpt = "cgtool",
    model: ModelOption = DEFAULT_MODEL,
    gpu: GpuOpt = "auto",
    profile: ProfileOpt = None,
    tp: TpOpt = 1,
    budget_graphs: BudgetGraphsOpt = None,
    budget_memory: BudgetMemoryOpt = None,
    engine: EngineOpt = "sglang",
    engine_version: EngineVersionOpt = None,
    chunked_prefill_size: ChunkOpt = None,
    max_running_requests: MaxRunningOpt = None,
    load: LoadOpt = "1,2",
    replicas: ReplicasOpt = 1,
    compare_plan: ComparePlanOpt = None,
    out: OutOpt = None,
    json_out: JsonOpt = False,
    hidden_states: HiddenStatesOpt = "null",
    attention_backend: AttentionBackendOpt = None,
    rate: RateOpt = None,
    concurrency: ConcurrencyOpt = None,
    seed: SeedOpt = 0,
) -> None:
    """Simulate a workload trace and recommend capture sizes and --mem-fraction-static."""
    shape = _traffic_shape(rate, concurrency, seed)
    _check_engine(engine, engine_version)  # before the trace is read: that takes seconds
    loads = parse_loads(load)
    if replicas < 1:
        raise InputError(
            f"--replicas {replicas} is not a number of servers", "Use --replicas 1 or more."
        )
    old_plan = load_plan(compare_plan) if compare_plan is not None else None
    compare = _compare_sizes(old_plan)
    gpu_choice, gpu_note = resolve_gpu(gpu)
    report = load_profiles(profile) if profile else None  # report.json(s), verify.json or replay.json
    request = PlanRequest(
        cfg=load_model_config(model),
        gpu=gpu_choice,
        engine=engine,
        engine_version=engine_version,
        trace_name=str(trace),
        profile=report,
        profile_name=", ".join(str(p) for p in profile) if profile else None,
        tp_size=tp,
        chunked_prefill_size=chunked_prefill_size,
        max_running_requests=max_running_requests,
        budget_graphs=budget_graphs,
        budget_memory_bytes=None if budget_memory is None else parse_bytes(budget_memory),
        loads=loads,
        replicas=replicas,
        compare=compare,
        compare_name=None if compare_plan is None else str(compare_plan),
        hidden_mode=max(parse_hidden_modes(hidden_states)),  # an upward list ends at its highest
        attention_backend=attention_backend,
    )
    stop = StopRequest()
    result = _plan_or_exit(trace, trace_format, request, stop, shape)
    if old_plan is not None:
        result.warnings.extend(compare_plan_warnings(old_plan, result.inputs))
    if gpu_note:
        result.warnings.insert(0, gpu_note)
        if json_out:
            err_console.print(f"[yellow]note:[/] {gpu_note}", highlight=False)
    result.warnings.extend(_compare_ceiling_notes(compare_plan))
    if isinstance(result, Plan):
        result.warnings.extend(_prefill_notes(result, report))
    _show(result, out, json_out)
    if stop.requested():
        _exit_interrupted(result, stop)


def _check_engine(engine: str, engine_version: str | None) -> None:
    if engine not in ("sglang", "vllm"):
        raise InputError(
            f"--engine {engine} cannot be planned for",
            "Use sglang or vllm (see `cgtool schedule` for trtllm).",
        )
    resolve_version(engine, engine_version)


def _compare_sizes(old: Plan | None) -> tuple[tuple[int, ...], tuple[int, ...], int] | None:
    """An existing plan's decode sizes, token sizes and KV tokens, to score beside the new one."""
    if old is None:
        return None
    return (
        tuple(old.decode.capture_bs),
        tuple(old.piecewise.capture_num_tokens),
        old.memory.kv_tokens,
    )


def _prefill_notes(plan: Plan, profile: dict | None) -> list[str]:
    inputs = plan.inputs
    settings = (profile or {}).get("settings") or {}
    measured = settings.get("prefill_backend", "piecewise") if "kinds" in settings else None
    return prefill_notes(inputs.engine, inputs.engine_version, tuple(plan.piecewise.capture_num_tokens),
                         measured)


def _compare_ceiling_notes(path: Path | None) -> list[str]:
    """Sizes of the --compare-plan that its own engine release would not capture as written."""
    if path is None:
        return []
    old = load_plan(path)
    inputs = old.inputs
    try:
        notes = off_grid_ceilings(
            inputs.engine, inputs.engine_version, tuple(old.decode.capture_bs),
            tuple(old.piecewise.capture_num_tokens), inputs.chunked_prefill_size,
            inputs.max_running_requests,
        )
    except CgtoolError:  # a release cgtool no longer knows: nothing to say of its grid
        return []
    return [f"--compare-plan {path.name}: {note}" for note in notes]


def resolve_gpu(name: str) -> tuple[GpuSpec, str | None]:
    if name.lower() != "auto":
        return gpu_spec(name), None
    try:
        return gpu_spec("auto"), None
    except CgtoolError:
        return gpu_spec(
            FALLBACK_GPU
        ), f"no GPU found; planning for {FALLBACK_GPU} (name one with --gpu)"


def parse_bytes(text: str, option: str = "--budget-memory") -> int:
    """'8GiB', '512 MiB', '1.5e9' or a plain number of bytes."""
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    try:
        value = float(match.group(1)) if match else float("nan")
    except ValueError:
        value = float("nan")
    if not match or unit not in BYTE_UNITS or not value >= 0:
        raise InputError(
            f"{option} '{text}' is not an amount of memory",
            "Write it like 8GiB, 512MiB or 8000000000.",
        )
    return int(value * BYTE_UNITS[unit])


def _plan_or_exit(
    trace: Path, trace_format: str, request: PlanRequest, stop: StopRequest, shape: TrafficShape
) -> Plan:
    try:
        with stop.installed():
            return _run_plan(trace, trace_format, request, stop, shape)
    except KeyboardInterrupt as interrupt:
        when = "by a second signal" if stop.deferring else "before the simulation began"
        err_console.print(
            f"[yellow]interrupted by {signal_name(interrupt)}[/] {when}; no plan was written",
            highlight=False,
        )
        raise typer.Exit(exit_code(interrupt)) from None


def _traffic_shape(rate: float | None, concurrency: int | None, seed: int) -> TrafficShape:
    if rate is not None and concurrency is not None:
        raise InputError("--rate and --concurrency both given",
                         "Pick one: Poisson arrivals at a rate, or a number of requests in flight.")
    if rate is not None and not (rate > 0 and math.isfinite(rate)):
        raise InputError(f"--rate {rate} is not a rate", "Give requests per second above 0.")
    return TrafficShape(rate, concurrency, seed)


def _read(trace: Path, trace_format: str, shape: TrafficShape) -> RequestTrace | BatchTrace | Traffic:
    """The trace, with arrivals made up by --rate or a client by --concurrency when it has none."""
    lengths = trace_format == "lengths" or (trace_format == "cgtool" and has_no_arrivals(trace))
    if not lengths:
        if shape.given:
            raise InputError(
                f"--rate and --concurrency are for traces without arrival times; {trace} has them",
                "Drop the flag (--load scales the trace's own arrivals).",
            )
        return load_trace_hinted(trace, trace_format).trace
    if not shape.given:
        raise InputError(f"{trace} gives prompt and output lengths but no arrival times",
                         ARRIVAL_REMEDY)
    lengths_trace = read_lengths(trace)
    if shape.rate is not None:
        return with_poisson_arrivals(lengths_trace, shape.rate, shape.seed)
    return Traffic(None, lengths_trace.input_len, lengths_trace.output_len,
                   lengths_trace.cached_len, shape.concurrency)


def _run_plan(
    trace: Path, trace_format: str, request: PlanRequest, stop: StopRequest, shape: TrafficShape
) -> Plan:
    err_console.print(f"reading {trace}", highlight=False)
    loaded = _read(trace, trace_format, shape)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
    )
    if not isinstance(loaded, BatchTrace):
        err_console.print(f"simulating {counted(len(loaded), 'request')}", highlight=False)
    # From here a signal ends the simulation at its next poll, and the plan of what was
    # simulated is still written; before, there is nothing worth keeping.
    stop.defer()
    with Progress(*columns, console=err_console, transient=True) as progress:
        tasks: dict[str, int] = {}

        def report(stage: str, fraction: float) -> None:
            if stage not in tasks:
                tasks[stage] = progress.add_task(stage, total=1.0)
            progress.update(tasks[stage], completed=fraction)

        if isinstance(loaded, Traffic):
            return plan_traffic(loaded, request, report, stop.requested)
        if isinstance(loaded, RequestTrace):
            result = plan_requests(
                loaded.arrival_s,
                loaded.input_len,
                loaded.output_len,
                loaded.cached_len,
                request,
                report,
                stop.requested,
            )
            result.vit = vit_plan(loaded.images)
            return result
        return plan_batches(
            loaded.decode_batch_size,
            loaded.decode_count,
            loaded.extend_num_tokens,
            loaded.extend_count,
            request,
            report,
        )


def _show(result: Plan, out: Path | None, json_out: bool) -> None:
    written = _write_outputs(out, result) if out is not None else []
    if json_out:
        console.print_json(json.dumps(result.to_dict()))
        return
    console.print(plan_view(result), soft_wrap=True)
    for path in written:
        console.print(f"wrote {path}", highlight=False, soft_wrap=True)


def _write_outputs(out: Path, result: Plan) -> list[Path]:
    from cgtool.reports.render import render_plan  # matplotlib only when asked

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CgtoolError(
            f"--out {out}: cannot create the folder ({exc.strerror})", "Pick a writable folder."
        ) from None
    write_plan(result, out / PLAN_FILENAME)
    return [out / PLAN_FILENAME, *render_plan(result, out)]


def _exit_interrupted(result: Plan, stop: StopRequest) -> None:
    state = "marked incomplete" if result.status == "incomplete" else "complete all the same"
    err_console.print(f"[yellow]interrupted by {stop.name()}[/]; the plan above is {state}")
    raise typer.Exit(stop.exit_code())
