"""A plan's tables, each built once as TableData: the terminal (plan_view), plan.html and
`cgtool report --format csv|json` render these same rows in the same order."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from cgtool.documents.plan_document import Plan, PlanMemory, ScheduleScore
from cgtool.planner.memory import TRTLLM_DEFAULT_FREE_FRACTION, VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
from cgtool.reports.tables import TableData, gib, mib

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
    return TableData("Capture sizes", ["", "plan", "engine default"], rows)


_COMPARISON = (
    ("step time", (
        ("expected step", lambda r: f"{r.expected_step_ms:.3f} ms"),
        ("decode graph coverage", lambda r: f"{r.decode_coverage:.1%}"),
        ("extend graph coverage", lambda r: f"{r.extend_coverage:.1%}"),
        ("padding waste", lambda r: f"{r.padding_waste:.1%}"),
    )),
    ("graphs: set by the sizes", (
        ("graphs", lambda r: str(r.num_graphs)),
        ("graph memory (predicted)", lambda r: gib(r.graph_bytes)),
        ("capture time (predicted)", lambda r: f"{r.capture_s:.1f} s"),
    )),
    ("KV cache: set by the memory fraction, not the sizes", (
        ("KV tokens", lambda r: f"{r.kv_tokens:,}"),
    )),
)


def plan_comparison_rows(plan: Plan) -> TableData:
    """The plan against the engine's default on the headline steps, metric by metric."""
    pair = [plan.row("plan"), plan.row("default")]
    loads, basis = plan.inputs.loads or [1.0], plan.basis
    eager = basis.eager_assumptions[0].name if basis and basis.eager_assumptions else ""
    at = f", {loads[0]:g}x load" + (f", {eager} eager cost" if eager else "")
    title = f"Plan vs {engine_label(plan)} default on {part_label(plan)}{at} (predicted)"
    rows: list[list[str]] = []
    headings: set[int] = set()
    for section, metrics in _COMPARISON:
        headings.add(len(rows))
        rows.append([section, "", ""])
        rows += [["  " + label, *(_cell(fmt, r) for r in pair)] for label, fmt in metrics]
        if section == "step time" and plan.inputs.tp_size > 1:
            rows.append(["  of the step: all-reduces (estimated)",
                         *(_cell(lambda r: f"{r.comm_ms:.3f} ms", r) for r in pair)])
    return TableData(title, ["", "plan", "default"], rows, headings=headings)


def plan_memory_rows(plan: Plan) -> TableData:
    """Where one GPU's memory goes under the plan and under the engine's default."""
    memory, tp = plan.memory, plan.inputs.tp_size
    size = gib(memory.gpu_memory_bytes)
    title = (f"Memory per GPU of {gpus_label(plan)}, {size} each" if tp > 1
             else f"Memory on {gpus_label(plan)} ({size})")
    default = _default_memory(plan)
    # Under tensor parallelism every figure is one GPU's: its shard of weights and KV heads.
    shards = [["KV heads per GPU", _opt(memory.kv_heads_per_rank, str), ""]] if tp > 1 else []
    rows = shards + [
        ["weights", gib(memory.weights_bytes), gib(memory.weights_bytes)],
        ["graphs", gib(memory.graph_bytes), _opt(default["graph_bytes"], gib)],
        *_engine_buffer_rows(memory),
        ["activations (eager peak)", gib(memory.activation_bytes), gib(memory.activation_bytes)],
        ["margin kept free" + (" (+ NCCL)" if tp > 1 else ""), gib(memory.margin_bytes),
         _opt(default["margin_bytes"], gib)],
        ["KV cache", gib(memory.kv_bytes), _opt(default["kv_bytes"], gib)],
        ["KV tokens", f"{memory.kv_tokens:,}", _opt(memory.default_kv_tokens, "{:,}".format)],
        ["SGLang --mem-fraction-static", f"{memory.mem_fraction_static:.3f}",
         f"{memory.default_mem_fraction_static:.3f}"],
        ["vLLM --gpu-memory-utilization", _opt(memory.gpu_memory_utilization, "{:.3f}".format),
         f"{VLLM_DEFAULT_GPU_MEMORY_UTILIZATION:.3f}"],
        ["TRT-LLM free_gpu_memory_fraction",
         _opt(memory.trtllm_free_gpu_memory_fraction, "{:.3f}".format),
         f"{TRTLLM_DEFAULT_FREE_FRACTION:.3f}"],
        # The trace runs once, at the plan's pool: the default's peak is not simulated.
        ["peak KV reserved by admitted requests",
         _opt(memory.peak_kv_demand_tokens, "{:,}".format), "not simulated"],
    ]
    measured, predicted = memory.graph_bytes_measured, memory.graph_bytes_predicted
    if measured is not None and predicted is not None:
        error = (predicted - measured) / measured if measured else 0.0
        rows.append(["report's graphs: predicted, measured", gib(predicted),
                     f"{gib(measured)} ({error:+.0%} off)"])
    return TableData(title, ["", "plan", "engine default"], rows)


def _engine_buffer_rows(memory: PlanMemory) -> list[list[str]]:
    """The part of the plan's graph memory that SGLang allocates at its largest decode size."""
    if memory.attention_backend is None or memory.attention_buffer_bytes is None:
        return []
    return [
        [f"  of which {memory.attention_backend} graph buffers", mib(memory.attention_buffer_bytes),
         mib(memory.default_attention_buffer_bytes)],
        ["  of which static inputs + fp32 logits", mib(memory.static_input_bytes),
         mib(memory.default_static_input_bytes)],
    ]


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


def _opt(value: T | None, fmt: Callable[[T], str]) -> str:
    return "-" if value is None else fmt(value)


def _list(sizes: list[int], limit: int = 16) -> str:
    text = " ".join(map(str, sizes[:limit]))
    return text + (f" ... ({len(sizes)} sizes)" if len(sizes) > limit else f" ({len(sizes)})")
