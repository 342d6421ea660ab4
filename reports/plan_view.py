"""Rich rendering of a plan: the flags to paste, then the plan against the engine default.

The comparison and memory tables are reports/plan_tables.py's, the rows plan.html and
`cgtool report` show; this module only lays them out for a terminal.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from cgtool.documents.plan_document import Plan
from cgtool.reports.plan_tables import (
    ENGINE_NAMES,
    engine_label,
    gpus_label,
    part_label,
    plan_comparison_rows,
    plan_memory_rows,
)
from cgtool.reports.tables import TableData, row_style
from cgtool.units import counted


def _sizes(sizes: list[int], limit: int = 40) -> str:
    if not sizes:
        return "none (eager)"
    shown = " ".join(str(s) for s in sizes[:limit])
    return shown + (f" … ({len(sizes)} sizes)" if len(sizes) > limit else f"  ({counted(len(sizes), 'size')})")


def flag_block(lines: list[str], title: str, launch: str | None = None) -> Text:
    # Plain lines, never wrapped or boxed, so that they paste into a shell as they are.
    text = Text(f"# {title}\n", style="bold", no_wrap=True, overflow="ignore")
    if launch:
        text.append(launch + " \\\n", style="")
    text.append(" \\\n".join(line for line in lines if line.startswith("--")), style="")
    for note in (line for line in lines if not line.startswith("--")):
        text.append("\n" + note, style="dim")
    return text


def terminal_table(data: TableData) -> Table:
    table = Table(title=data.title)
    for i, column in enumerate(data.columns):
        table.add_column(column, justify="left" if i == 0 else "right", no_wrap=True)
    for i, row in enumerate(data.rows):
        table.add_row(*row, style=row_style(data, i))
    return table


def comparison_table(plan: Plan) -> Table:
    return terminal_table(plan_comparison_rows(plan))


def memory_table(plan: Plan) -> Table:
    return terminal_table(plan_memory_rows(plan))


def scenario_table(plan: Plan) -> Table | None:
    """Expected step per load and eager assumption: held out, and as fitted."""
    rows = plan.scenarios
    if not rows:
        return None
    index = {(r.part, r.load, r.eager, r.schedule): r for r in rows}
    part = "held_out" if any(r.part == "held_out" for r in rows) else "fit"
    current = any(r.schedule == "current" for r in rows)
    table = Table(
        title=f"Every scenario on {part_label(plan)}, predicted; ratio = plan / default",
        caption="in-sample: the same ratio on the steps the sizes were fitted on",
    )
    columns = ["load", "eager", "plan ms", "default ms", "ratio", "in-sample", "decode cov."]
    columns += ["current ms", "current ratio"] if current else []
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i < 2 else "right", no_wrap=True)
    keys = list(dict.fromkeys((r.load, r.eager) for r in rows if r.part == part))
    for load, eager in keys:
        p, d = index[(part, load, eager, "plan")], index[(part, load, eager, "default")]
        fp, fd = index[("fit", load, eager, "plan")], index[("fit", load, eager, "default")]
        cells = [
            f"{load:g}x",
            eager,
            f"{p.expected_step_ms:.3f}",
            f"{d.expected_step_ms:.3f}",
            f"{p.expected_step_ms / d.expected_step_ms:.3f}",
            f"{fp.expected_step_ms / fd.expected_step_ms:.3f}",
            f"{p.decode_coverage:.1%}",
        ]
        if current:
            c = index[(part, load, eager, "current")]
            cells += [f"{c.expected_step_ms:.3f}", f"{c.expected_step_ms / d.expected_step_ms:.3f}"]
        table.add_row(*cells)
    return table


def _size_lines(plan: Plan) -> list[Text]:
    decode, tokens = plan.decode.capture_bs, plan.piecewise.capture_num_tokens
    if plan.inputs.engine == "vllm":
        return [
            Text(f"vLLM token sizes (one shared list): {_sizes(tokens)}"),
            Text(f"  of which full decode graphs (up to --max-num-seqs): {_sizes(decode)}"),
        ]
    return [
        Text(f"decode batch sizes: {_sizes(decode)}"),
        Text(f"extend token bins:  {_sizes(tokens)}"),
    ]


def vit_lines(plan: Plan) -> list[Text]:
    """The trace's images: the ViT graphs to capture, and how to measure them first."""
    vit = plan.vit
    if vit is None:
        return []
    refused = f", {vit.refused_images:,} refused by the processor" if vit.refused_images else ""
    sizes = ",".join(f"{h}x{w}" for h, w in vit.image_sizes)
    lines = [
        Text(f"ViT graphs for {vit.num_images:,} images{refused} ({vit.preset} processor), "
             f"serving {vit.coverage:.1%} of them; patch counts: {_sizes(vit.capture_patches)}"),
    ]
    if sizes:
        # Their memory is not in the memory plan above: no capture report measures it yet.
        lines.append(Text(f"  their memory is not in --mem-fraction-static; measure it: cgtool capture "
                          f"--kind vit --model {vit.preset} --image-sizes {sizes}",
                          style="dim", no_wrap=True, overflow="ignore"))
    return lines


def _basis_lines(plan: Plan) -> list[Text]:
    basis = plan.basis
    if basis is None:  # plans written before cgtool 1.1 carry none
        return []
    lines = [basis.statement + "."]
    lines += [f"  eager cost, {a.name}: {a.basis}" for a in basis.eager_assumptions]
    lines.append(f"  {basis.max_bs_reason}")
    return [Text("\n".join(lines), style="dim")]


def _head(plan: Plan) -> Text:
    inputs, sim = plan.inputs, plan.simulation
    per = f" (one of {inputs.replicas} replicas)" if inputs.replicas > 1 else ""
    kind = f"{inputs.trace_kind}: " if inputs.trace_kind else ""
    return Text(
        f"{inputs.model} on {gpus_label(plan)}{per}, {engine_label(plan)}; "
        f"trace {inputs.trace} ({kind}{counted(sim.num_requests, 'request')}, {counted(sim.steps, 'step')}); "
        f"step times from {inputs.profile or 'the roofline model'}",
    )


def plan_view(plan: Plan) -> RenderableType:
    engine = plan.inputs.engine
    warnings = plan.all_warnings()
    overload = [w for w in warnings if w.startswith("overloaded")]
    parts: list[RenderableType] = [_head(plan)]
    parts += [Text(f"warning: {w}", style="bold red") for w in overload]
    # SGLang's ViT graphs are switched on by an environment variable: it prefixes the launch.
    launch = f"{plan.vit.env} python -m sglang.launch_server" if plan.vit and engine == "sglang" else None
    parts += [
        flag_block(plan.flags[engine], f"Recommended flags for {engine_label(plan)}", launch),
        *_size_lines(plan),
        *vit_lines(plan),
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
    for other in (e for e in ENGINE_NAMES if e != engine and e in plan.flags):
        title = f"The same sizes for {ENGINE_NAMES[other]}"
        if other == "vllm":
            title += " (--engine vllm plans vLLM's one shared list instead)"
        parts.append(flag_block(plan.flags[other], title))
    return Group(*parts)
