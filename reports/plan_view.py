"""Rich rendering of a plan: the flags to paste, then the plan against the engine default."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from cgtool.planner.memory import TRTLLM_DEFAULT_FREE_FRACTION, VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
from cgtool.reports.tables import gib

ENGINE_NAMES = {"sglang": "SGLang", "vllm": "vLLM", "trtllm": "TensorRT-LLM"}


def tp_size(plan: dict[str, Any]) -> int:
    # Plans written before `plan --tp` existed were all for one GPU.
    return int(plan["inputs"].get("tp_size") or 1)


def gpus_label(plan: dict[str, Any]) -> str:
    gpu, tp = plan["inputs"]["gpu"], tp_size(plan)
    return f"{tp} × {gpu} (--tp {tp})" if tp > 1 else gpu


def _sizes(sizes: list[int], limit: int = 40) -> str:
    if not sizes:
        return "none (eager)"
    shown = " ".join(str(s) for s in sizes[:limit])
    return shown + (f" … ({len(sizes)} sizes)" if len(sizes) > limit else f"  ({len(sizes)} sizes)")


def flag_block(lines: list[str], title: str) -> Text:
    # Plain lines, never wrapped or boxed, so that they paste into a shell as they are.
    text = Text(f"# {title}\n", style="bold", no_wrap=True, overflow="ignore")
    text.append(" \\\n".join(line for line in lines if line.startswith("--")), style="")
    for note in (line for line in lines if not line.startswith("--")):
        text.append("\n" + note, style="dim")
    return text


def _part_label(plan: dict[str, Any]) -> str:
    basis = plan.get("basis") or {}
    share = basis.get("held_out_share") or 0.0
    return f"held-out traffic (last {share:.0%} of requests)" if share else "the simulated steps"


def comparison_table(plan: dict[str, Any]) -> Table:
    rows = {row["schedule"]: row for row in plan["comparison"]}
    plan_row, default_row = rows["plan"], rows["default"]
    inputs = plan["inputs"]
    loads = inputs.get("loads") or [1.0]
    eager = ((plan.get("basis") or {}).get("eager_assumptions") or [{"name": ""}])[0]["name"]
    at = f", {loads[0]:g}x load" + (f", {eager} eager cost" if eager else "")
    table = Table(
        title=f"Plan vs {ENGINE_NAMES[inputs['engine']]} {inputs['engine_version']} default on "
        f"{_part_label(plan)}{at} (predicted)"
    )
    for column in ("", "plan", "default"):
        table.add_column(column, justify="left" if not column else "right", no_wrap=True)
    sections = (
        (
            "step time",
            (
                ("expected step", "expected_step_ms", lambda v: f"{v:.3f} ms"),
                ("decode graph coverage", "decode_coverage", lambda v: f"{v:.1%}"),
                ("extend graph coverage", "extend_coverage", lambda v: f"{v:.1%}"),
                ("padding waste", "padding_waste", lambda v: f"{v:.1%}"),
            ),
        ),
        (
            "graphs: set by the sizes",
            (
                ("graphs", "num_graphs", str),
                ("graph memory (predicted)", "graph_bytes", gib),
                ("capture time (predicted)", "capture_s", lambda v: f"{v:.1f} s"),
            ),
        ),
        (
            "KV cache: set by the memory fraction, not the sizes",
            (("KV tokens", "kv_tokens", lambda v: f"{v:,}"),),
        ),
    )
    for title, metrics in sections:
        table.add_row(Text(title, style="bold"), "", "")
        for label, key, fmt in metrics:
            table.add_row("  " + label, fmt(plan_row[key]), fmt(default_row[key]))
        if title == "step time" and tp_size(plan) > 1:
            comm = [f"{row.get('comm_ms', 0.0):.3f} ms" for row in (plan_row, default_row)]
            table.add_row("  of the step: all-reduces (estimated)", *comm)
    return table


def scenario_table(plan: dict[str, Any]) -> Table | None:
    """Expected step per load and eager assumption: held out, and as fitted."""
    rows = plan.get("scenarios") or []
    if not rows:
        return None
    index = {(r["part"], r["load"], r["eager"], r["schedule"]): r for r in rows}
    part = "held_out" if any(r["part"] == "held_out" for r in rows) else "fit"
    current = any(r["schedule"] == "current" for r in rows)
    table = Table(
        title=f"Every scenario on {_part_label(plan)}, predicted; ratio = plan / default",
        caption="in-sample: the same ratio on the steps the sizes were fitted on",
    )
    columns = ["load", "eager", "plan ms", "default ms", "ratio", "in-sample", "decode cov."]
    columns += ["current ms", "current ratio"] if current else []
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i < 2 else "right", no_wrap=True)
    keys = list(dict.fromkeys((r["load"], r["eager"]) for r in rows if r["part"] == part))
    for load, eager in keys:
        p, d = index[(part, load, eager, "plan")], index[(part, load, eager, "default")]
        fp, fd = index[("fit", load, eager, "plan")], index[("fit", load, eager, "default")]
        cells = [
            f"{load:g}x",
            eager,
            f"{p['expected_step_ms']:.3f}",
            f"{d['expected_step_ms']:.3f}",
            f"{p['expected_step_ms'] / d['expected_step_ms']:.3f}",
            f"{fp['expected_step_ms'] / fd['expected_step_ms']:.3f}",
            f"{p['decode_coverage']:.1%}",
        ]
        if current:
            c = index[(part, load, eager, "current")]
            cells += [f"{c['expected_step_ms']:.3f}", f"{c['expected_step_ms'] / d['expected_step_ms']:.3f}"]
        table.add_row(*cells)
    return table


def _default_memory(plan: dict[str, Any]) -> dict[str, float]:
    """The engine default's graph memory (from the comparison), its KV cache (the plan's bytes
    per KV token times the default's KV tokens) and what that leaves free. Weights and
    activations are the same under both."""
    memory = plan["memory"]
    default_row = next(r for r in plan["comparison"] if r["schedule"] == "default")
    per_token = memory["kv_bytes"] / memory["kv_tokens"] if memory["kv_tokens"] else 0.0
    kv_bytes = per_token * memory["default_kv_tokens"]
    used = memory["weights_bytes"] + memory["activation_bytes"] + default_row["graph_bytes"]
    return {"graph_bytes": default_row["graph_bytes"], "kv_bytes": kv_bytes,
            "margin_bytes": max(memory["gpu_memory_bytes"] - used - kv_bytes, 0.0)}


def memory_table(plan: dict[str, Any]) -> Table:
    memory, tp = plan["memory"], tp_size(plan)
    size = gib(memory["gpu_memory_bytes"])
    table = Table(
        title=f"Memory per GPU of {gpus_label(plan)}, {size} each"
        if tp > 1
        else f"Memory on {gpus_label(plan)} ({size})"
    )
    for column in ("", "plan", "engine default"):
        table.add_column(column, justify="left" if not column else "right", no_wrap=True)
    # Under tensor parallelism every figure is one GPU's: its shard of weights and KV heads.
    default = _default_memory(plan)
    shards = [("KV heads per GPU", str(memory.get("kv_heads_per_rank", "")), "")] if tp > 1 else []
    rows = shards + [
        ("weights", gib(memory["weights_bytes"]), gib(memory["weights_bytes"])),
        ("graphs", gib(memory["graph_bytes"]), gib(default["graph_bytes"])),
        ("activations (eager peak)", gib(memory["activation_bytes"]), gib(memory["activation_bytes"])),
        ("margin kept free" + (" (+ NCCL)" if tp > 1 else ""), gib(memory["margin_bytes"]),
         gib(default["margin_bytes"])),
        ("KV cache", gib(memory["kv_bytes"]), gib(default["kv_bytes"])),
        ("KV tokens", f"{memory['kv_tokens']:,}", f"{memory['default_kv_tokens']:,}"),
        (
            "SGLang --mem-fraction-static",
            f"{memory['mem_fraction_static']:.3f}",
            f"{memory['default_mem_fraction_static']:.3f}",
        ),
        ("vLLM --gpu-memory-utilization", f"{memory['gpu_memory_utilization']:.3f}",
         f"{VLLM_DEFAULT_GPU_MEMORY_UTILIZATION:.3f}"),
        (
            "TRT-LLM free_gpu_memory_fraction",
            f"{memory['trtllm_free_gpu_memory_fraction']:.3f}",
            f"{TRTLLM_DEFAULT_FREE_FRACTION:.3f}",
        ),
        (
            "peak KV reserved by admitted requests",
            f"{memory['peak_kv_demand_tokens']:,}",
            "not simulated",  # the trace runs once, at the plan's pool
        ),
    ]
    if memory.get("graph_bytes_measured") is not None:
        predicted, measured = memory["graph_bytes_predicted"], memory["graph_bytes_measured"]
        error = (predicted - measured) / measured if measured else 0.0
        rows.append(
            (
                "report's graphs: predicted, measured",
                gib(predicted),
                f"{gib(measured)} ({error:+.0%} off)",
            )
        )
    for row in rows:
        table.add_row(*row)
    return table


def _size_lines(plan: dict[str, Any]) -> list[Text]:
    decode, tokens = plan["decode"]["capture_bs"], plan["piecewise"]["capture_num_tokens"]
    if plan["inputs"]["engine"] == "vllm":
        return [
            Text(f"vLLM token sizes (one shared list): {_sizes(tokens)}"),
            Text(f"  of which full decode graphs (up to --max-num-seqs): {_sizes(decode)}"),
        ]
    return [
        Text(f"decode batch sizes: {_sizes(decode)}"),
        Text(f"extend token bins:  {_sizes(tokens)}"),
    ]


def _basis_lines(plan: dict[str, Any]) -> list[Text]:
    basis = plan.get("basis")
    if not basis:  # plans written before cgtool 1.1 carry none
        return []
    lines = [basis["statement"] + "."]
    lines += [f"  eager cost, {a['name']}: {a['basis']}" for a in basis["eager_assumptions"]]
    lines.append(f"  {basis['max_bs_reason']}")
    return [Text("\n".join(lines), style="dim")]


def plan_view(plan: dict[str, Any]) -> RenderableType:
    inputs, sim = plan["inputs"], plan["simulation"]
    engine = inputs["engine"]
    replicas = inputs.get("replicas") or 1
    per = f" (one of {replicas} replicas)" if replicas > 1 else ""
    head = Text(
        f"{inputs['model']} on {gpus_label(plan)}{per}, {ENGINE_NAMES[engine]} {inputs['engine_version']}; "
        f"trace {inputs['trace']} ({inputs['trace_kind']}: {sim['num_requests']:,} requests, {sim['steps']:,} steps); "
        f"step times from {inputs['profile'] or 'the roofline model'}",
    )
    warnings = plan["memory"]["warnings"] + plan.get("warnings", [])
    overload = [w for w in warnings if w.startswith("overloaded")]
    parts: list[RenderableType] = [head]
    parts += [Text(f"warning: {w}", style="bold red") for w in overload]
    parts += [
        flag_block(
            plan["flags"][engine],
            f"Recommended flags for {ENGINE_NAMES[engine]} {inputs['engine_version']}",
        ),
        *_size_lines(plan),
        *_basis_lines(plan),
        comparison_table(plan),
    ]
    scenarios = scenario_table(plan)
    if scenarios is not None:
        parts.append(scenarios)
    parts.append(memory_table(plan))
    rest = [w for w in warnings if w not in overload]
    if rest:
        parts.append(Text("\n".join(f"note: {w}" for w in rest), style="yellow"))
    others = [e for e in ("sglang", "vllm", "trtllm") if e != engine]
    for other in others:
        title = f"The same sizes for {ENGINE_NAMES[other]}"
        if other == "vllm":
            title += " (--engine vllm plans vLLM's one shared list instead)"
        parts.append(flag_block(plan["flags"][other], title))
    return Group(*parts)
