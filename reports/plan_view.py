"""Rich rendering of a plan: the flags to paste, then the plan against the engine default.

The comparison and memory tables are reports/plan_tables.py's, the rows plan.html and
`cgtool report` show; this module only lays them out for a terminal.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from cgtool.documents.compare import plan_verdict
from cgtool.documents.plan_document import Plan
from cgtool.reports.fit import FittedTable
from cgtool.reports.plan_scenarios import (
    plan_closed_loop_rows,
    plan_scenario_rows,
    plan_serving_rows,
)
from cgtool.reports.plan_tables import (
    ENGINE_NAMES,
    engine_label,
    gpus_label,
    plan_comparison_rows,
    plan_memory_rows,
)
from cgtool.reports.tables import TableData
from cgtool.units import counted


def _sizes(sizes: list[int]) -> str:
    # Every size: a line wraps in the terminal, and a list cut short is a different list.
    return f"{' '.join(map(str, sizes))}  ({counted(len(sizes), 'size')})" if sizes else "none (eager)"


def flag_block(lines: list[str], title: str, launch: str | None = None) -> Text:
    # Plain lines, never wrapped or boxed, so that they paste into a shell as they are.
    text = Text(f"# {title}\n", style="bold", no_wrap=True, overflow="ignore")
    if launch:
        text.append(launch + " \\\n", style="")
    text.append(" \\\n".join(line for line in lines if line.startswith("--")), style="")
    for note in (line for line in lines if not line.startswith("--")):
        text.append("\n" + note, style="dim")
    return text


def terminal_table(data: TableData) -> FittedTable:
    return FittedTable(data, boxed=True, stack_headers=False)


def comparison_table(plan: Plan) -> FittedTable:
    return terminal_table(plan_comparison_rows(plan))


def memory_table(plan: Plan) -> FittedTable:
    return terminal_table(plan_memory_rows(plan))


def scenario_table(plan: Plan) -> FittedTable | None:
    """Expected step per load and eager assumption: held out, and as fitted."""
    data = plan_scenario_rows(plan)
    return None if data is None else terminal_table(data)


def scenario_tables(plan: Plan) -> list[FittedTable]:
    """The closed loop's headline figures per load, then every load and eager assumption
    held out, then any other figures the scenario rows carry."""
    tables = (plan_closed_loop_rows(plan, headline_only=True), plan_scenario_rows(plan),
              plan_serving_rows(plan))
    return [terminal_table(t) for t in tables if t is not None]


def verdict_line(plan: Plan) -> Text | None:
    verdict = plan_verdict(plan)
    if verdict is None:
        return None
    style = {True: "bold yellow", False: "bold green", None: "bold red"}[verdict.keep_current]
    return Text(f"--compare-plan {plan.inputs.compare_plan}: {verdict.sentence}", style=style)


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
    # Said first and in red: the server cannot keep up, or falls off its graph ceiling.
    overload = [w for w in warnings if w.startswith(("overloaded", "eager basin"))]
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
        *scenario_tables(plan),
    ]
    verdict = verdict_line(plan)
    if verdict is not None:
        parts.append(verdict)
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
