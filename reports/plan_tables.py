"""A plan's tables, each built once as TableData: the terminal (plan_view), plan.html and
`cgtool report --format csv|json` render these same rows in the same order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from cgtool.documents.plan_document import Plan, PlanMemory, ScheduleScore
from cgtool.planner.memory import TRTLLM_DEFAULT_FREE_FRACTION, VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
from cgtool.reports.metric_cells import extra_figures, label_cell, metric_cell, metric_label
from cgtool.reports.tables import Cell, TableData, gib, mib

T = TypeVar("T")
ENGINE_NAMES = {"sglang": "SGLang", "vllm": "vLLM", "trtllm": "TensorRT-LLM"}


def engine_label(plan: Plan, engine: str | None = None) -> str:
    """"SGLang 0.5.23": the engine and the release whose defaults the plan compares with."""
    engine = engine or plan.inputs.engine
    version = plan.inputs.engine_version if engine == plan.inputs.engine else None
    return " ".join(filter(None, (ENGINE_NAMES.get(engine, engine), version)))


def gpus_label(plan: Plan) -> str:
    gpu, tp = plan.inputs.gpu, plan.inputs.tp_size
    return f"{tp} × {gpu} (--tp {tp})" if tp > 1 else gpu


def part_label(plan: Plan) -> str:
    share = plan.basis.held_out_share if plan.basis else 0.0
    return f"held-out traffic (last {share:.0%} of requests)" if share else "the simulated steps"


def plan_sizes_rows(plan: Plan) -> TableData:
    decode, piecewise = plan.decode, plan.piecewise
    rows = [
        ["decode batch sizes", _list(decode.capture_bs), _list(decode.default_capture_bs)],
        ["piecewise tokens", _list(piecewise.capture_num_tokens),
         _list(piecewise.default_capture_num_tokens)],
    ]
    return TableData("Capture sizes", ["", "plan", "engine default"], rows, wrapping={1, 2})


_Row = tuple[str, str, Callable[[ScheduleScore], Any]]
_COMPARISON: tuple[tuple[str, tuple[_Row, ...]], ...] = (
    ("step time", (
        ("expected step", "expected_step_ms", lambda r: f"{r.expected_step_ms:.3f} ms"),
        ("decode graph coverage", "decode_coverage", lambda r: f"{r.decode_coverage:.1%}"),
        ("extend graph coverage", "extend_coverage", lambda r: f"{r.extend_coverage:.1%}"),
        ("padding waste", "padding_waste", lambda r: f"{r.padding_waste:.1%}"),
    )),
    ("graphs: set by the sizes", (
        ("graphs", "num_graphs", lambda r: str(r.num_graphs)),
        ("graph memory (predicted)", "graph_bytes", lambda r: gib(r.graph_bytes)),
        ("capture time (predicted)", "capture_s", lambda r: f"{r.capture_s:.1f} s"),
    )),
    ("KV cache: set by the memory fraction, not the sizes", (
        ("KV tokens", "kv_tokens", lambda r: f"{r.kv_tokens:,}"),
    )),
)
# Fields of a score that are not figures of one schedule, or that a row above shows.
_NOT_FIGURES = {"schedule", "part", "load", "eager", "comm_ms"}
_SHOWN = {name for _, metrics in _COMPARISON for _, name, _ in metrics} | _NOT_FIGURES
SCHEDULE_NAMES = {"plan": "plan", "default": "default", "current": "--compare-plan"}
# What a user weighs first of the closed-loop figures (issue 36): the headline table and the
# terminal show these where a plan carries them; plan.html, CSV and JSON show every figure.
LOOP_HEADLINE = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_ms", "tpot_p99_ms",
                 "output_tokens_per_s", "mean_queue_s", "decode_eager_share")


def headline_rows(plan: Plan) -> list[ScheduleScore]:
    """The schedules of the headline comparison: the plan, the default and, with
    --compare-plan, the old plan's sizes scored on the same steps."""
    rows = [r for r in (plan.row("plan"), plan.row("default")) if r is not None]
    part = "held_out" if plan.basis and plan.basis.held_out_share else "fit"
    first = plan.scenarios[0] if plan.scenarios else None
    current = next((s for s in plan.scenarios if first and s.schedule == "current"
                    and (s.part, s.load, s.eager) == (part, first.load, first.eager)), None)
    if current is None and first is not None:  # nothing held out: the fit rows are the headline
        current = next((s for s in plan.scenarios if s.schedule == "current"
                        and (s.load, s.eager) == (first.load, first.eager)), None)
    return rows + ([current] if current is not None else [])


def plan_comparison_rows(plan: Plan) -> TableData:
    """The plan against the engine's default (and --compare-plan's sizes) on the headline
    steps, metric by metric; any figure a score carries beyond these gets a row of its own."""
    scores = headline_rows(plan)
    loads, basis = plan.inputs.loads or [1.0], plan.basis
    eager = basis.eager_assumptions[0].name if basis and basis.eager_assumptions else ""
    at = f", {loads[0]:g}x load" + (f", {eager} eager cost" if eager else "")
    title = f"Plan vs {engine_label(plan)} default on {part_label(plan)}{at} (predicted)"
    blank = [""] * len(scores)
    rows: list[list[str]] = []
    headings: set[int] = set()
    for section, metrics in _COMPARISON:
        headings.add(len(rows))
        rows.append([section, *blank])
        rows += [[label_cell(name, "  " + label), *(Cell(fmt(r), getattr(r, name)) for r in scores)]
                 for label, name, fmt in metrics]
        if section == "step time" and plan.inputs.tp_size > 1:
            rows.append([label_cell("comm_ms", "  of the step: all-reduces (estimated)"),
                         *(Cell(f"{r.comm_ms:.3f} ms", r.comm_ms) for r in scores)])
    extra = extra_figures(scores[0], _SHOWN) if scores else []
    if extra:
        headings.add(len(rows))
        rows.append(["serving", *blank])
        rows += [[label_cell(name, "  " + metric_label(name)),
                  *(metric_cell(name, getattr(r, name, None)) for r in scores)] for name in extra]
    served = _served(plan, [r.schedule for r in scores])
    if served:
        headings.add(len(rows))
        rows.append(["served with its own step times (closed loop)", *blank])
        names = extra_figures(next(r for r in served if r is not None), _SHOWN)
        names = [n for n in names if n in LOOP_HEADLINE] or names
        rows += [[label_cell(name, "  " + metric_label(name)),
                  *(metric_cell(name, getattr(r, name, None)) for r in served)] for name in names]
    columns = ["", *(SCHEDULE_NAMES.get(r.schedule, r.schedule) for r in scores)]
    return TableData(title, columns, rows, headings=headings)


def _served(plan: Plan, schedules: list[str]) -> list[Any]:
    """Closed-loop rows (plan.json's `closed_loop`, where the plan has them) of `schedules`
    at the headline's load and eager assumption; [] when there are none."""
    rows = list(getattr(plan, "closed_loop", None) or [])
    if not rows:
        return []
    load, eager = rows[0].load, rows[0].eager
    if plan.basis and plan.basis.eager_assumptions:
        eager = plan.basis.eager_assumptions[0].name
    if plan.inputs.loads:
        load = plan.inputs.loads[0]
    at = {r.schedule: r for r in rows if (r.load, r.eager) == (load, eager)}
    served = [at.get(name) for name in schedules]
    return served if any(r is not None for r in served) else []


def plan_memory_rows(plan: Plan) -> TableData:
    """Where one GPU's memory goes under the plan and under the engine's default."""
    memory, tp = plan.memory, plan.inputs.tp_size
    size = gib(memory.gpu_memory_bytes)
    title = (f"Memory per GPU of {gpus_label(plan)}, {size} each" if tp > 1
             else f"Memory on {gpus_label(plan)} ({size})")
    default = _default_memory(plan)
    # Under tensor parallelism every figure is one GPU's: its shard of weights and KV heads.
    shards = [[label_cell("kv_heads_per_rank", "KV heads per GPU"),
               _opt(memory.kv_heads_per_rank, str), ""]] if tp > 1 else []
    margin = "margin kept free" + (" (+ NCCL)" if tp > 1 else "")
    rows = shards + [
        [label_cell("weights_bytes", "weights"), _gib(memory.weights_bytes), _gib(memory.weights_bytes)],
        [label_cell("graph_bytes", "graphs"), _gib(memory.graph_bytes), _gib(default["graph_bytes"])],
        *_engine_buffer_rows(memory),
        [label_cell("activation_bytes", "activations (eager peak)"), _gib(memory.activation_bytes),
         _gib(memory.activation_bytes)],
        [label_cell("margin_bytes", margin), _gib(memory.margin_bytes), _gib(default["margin_bytes"])],
        *_margin_part_rows(memory),
        [label_cell("kv_bytes", "KV cache"), _gib(memory.kv_bytes), _gib(default["kv_bytes"])],
        [label_cell("kv_tokens", "KV tokens"), _opt(memory.kv_tokens, "{:,}".format),
         _opt(memory.default_kv_tokens, "{:,}".format)],
        [label_cell("mem_fraction_static", "SGLang --mem-fraction-static"),
         _opt(memory.mem_fraction_static, "{:.3f}".format),
         _opt(memory.default_mem_fraction_static, "{:.3f}".format)],
        [label_cell("gpu_memory_utilization", "vLLM --gpu-memory-utilization"),
         _opt(memory.gpu_memory_utilization, "{:.3f}".format),
         _opt(VLLM_DEFAULT_GPU_MEMORY_UTILIZATION, "{:.3f}".format)],
        [label_cell("trtllm_free_gpu_memory_fraction", "TRT-LLM free_gpu_memory_fraction"),
         _opt(memory.trtllm_free_gpu_memory_fraction, "{:.3f}".format),
         _opt(TRTLLM_DEFAULT_FREE_FRACTION, "{:.3f}".format)],
        # The trace runs once, at the plan's pool: the default's peak is not simulated.
        [label_cell("peak_kv_demand_tokens", "peak KV reserved by admitted requests"),
         _opt(memory.peak_kv_demand_tokens, "{:,}".format), Cell("not simulated", None)],
    ]
    measured, predicted = memory.graph_bytes_measured, memory.graph_bytes_predicted
    if measured is not None and predicted is not None:
        error = (predicted - measured) / measured if measured else 0.0
        rows.append([label_cell("graph_bytes_predicted_measured", "report's graphs: predicted, measured"),
                     _gib(predicted), Cell(f"{gib(measured)} ({error:+.0%} off)", measured)])
    return TableData(title, ["", "plan", "engine default"], rows)


def _engine_buffer_rows(memory: PlanMemory) -> list[list[str]]:
    """The part of the plan's graph memory that SGLang allocates at its largest decode size."""
    if memory.attention_backend is None or memory.attention_buffer_bytes is None:
        return []
    return [
        [label_cell("attention_buffer_bytes", f"  of which {memory.attention_backend} graph buffers"),
         _mib(memory.attention_buffer_bytes), _mib(memory.default_attention_buffer_bytes)],
        [label_cell("static_input_bytes", "  of which static inputs + fp32 logits"),
         _mib(memory.static_input_bytes), _mib(memory.default_static_input_bytes)],
    ]


def _margin_part_rows(memory: PlanMemory) -> list[list[str]]:
    """The margin's named parts, each with its source (cgtool.planner.margin)."""
    from cgtool.planner.margin import SOURCES

    return [[f"  {name.replace('_', ' ')} ({SOURCES.get(name, 'unstated')})", _mib(part), "-"]
            for name, part in (memory.margin_parts or {}).items()]


def _default_memory(plan: Plan) -> dict[str, float | None]:
    """The engine default's graph memory (from the comparison), its KV cache (the plan's bytes
    per KV token times the default's KV tokens) and what that leaves free. Weights and
    activations are the same under both."""
    memory, row = plan.memory, plan.row("default")
    if row is None or memory.default_kv_tokens is None:  # not in every older plan
        return dict.fromkeys(("graph_bytes", "kv_bytes", "margin_bytes"))
    per_token = memory.kv_bytes / memory.kv_tokens if memory.kv_tokens else 0.0
    kv_bytes = per_token * memory.default_kv_tokens
    used = memory.weights_bytes + memory.activation_bytes + row.graph_bytes
    return {"graph_bytes": row.graph_bytes, "kv_bytes": kv_bytes,
            "margin_bytes": max(memory.gpu_memory_bytes - used - kv_bytes, 0.0)}


def _cell(fmt: Callable[[ScheduleScore], str], row: ScheduleScore | None) -> str:
    return "-" if row is None else fmt(row)


def _opt(value: T | None, fmt: Callable[[T], str]) -> Cell:
    return Cell("-" if value is None else fmt(value), value)


def _gib(num_bytes: float | None) -> Cell:
    return Cell("-" if num_bytes is None else gib(num_bytes),
                None if num_bytes is None else round(num_bytes))


def _mib(num_bytes: float | None) -> Cell:
    return Cell(mib(num_bytes), None if num_bytes is None else round(num_bytes))


def _list(sizes: list[int], limit: int = 16) -> Cell:
    """The first sizes for a person, every size for CSV and JSON."""
    text = " ".join(map(str, sizes[:limit]))
    return Cell(text + (f" ... ({len(sizes)} sizes)" if len(sizes) > limit else f" ({len(sizes)})"),
                list(sizes))
