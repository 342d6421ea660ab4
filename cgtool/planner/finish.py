"""A chosen plan as the plan.json document: scored, its flags spelled out, its notes added.

The planner works with its own results (numpy histograms, the robust choice);
this is where they are copied into cgtool.documents.plan_document.Plan, the one shape readers see.
"""

from __future__ import annotations

from dataclasses import replace

from cgtool.documents.plan_document import (
    ClosedLoopRow,
    DecodePlan,
    PiecewisePlan,
    Plan,
    PlanInputs,
    PlanMemory,
    Simulation,
    StepHistogram,
)
from cgtool.documents.provenance import collect_provenance
from cgtool.planner.closed_loop import basin_lines, worse_lines
from cgtool.planner.flags import FlagValues, all_flags
from cgtool.planner.memory import check_plan_safety
from cgtool.planner.plan_notes import (
    ceiling_warnings,
    decode_part,
    plan_basis,
    replication_warnings,
)
from cgtool.planner.plan_scores import (
    ScoreSet,
    compared_schedules,
    plan_warnings,
    score_rows,
)
from cgtool.planner.profile_fit import predicted_graph_bytes
from cgtool.planner.proven import apply_proof
from cgtool.planner.request import PlanRequest
from cgtool.planner.robust import RobustChoice, Scenario
from cgtool.planner.scoring import Histogram
from cgtool.planner.server import Server


def finish_plan(
    req: PlanRequest,
    server: Server,
    choice: RobustChoice,
    memory: PlanMemory,
    fit: list[Scenario],
    held: list[Scenario],
    whole: tuple[Histogram, Histogram],
    simulation: Simulation,
    trace_kind: str,
    replicas: int,
    loop: list[ClosedLoopRow] | None = None,
) -> Plan:
    """The plan.json document of the sizes and memory chosen, scored and explained."""
    default = server.default
    decode_bs, tokens = choice.decode_bs, choice.tokens
    if req.profile is not None:
        predicted, measured = predicted_graph_bytes(req.profile, req.cfg, req.gpu)
        memory = replace(memory, graph_bytes_predicted=predicted, graph_bytes_measured=measured)
    check_plan_safety(tokens, server.chunk, server.context_len, memory)
    proof_notes: list[str] = []
    if req.engine == "sglang":  # verify rehearses SGLang's fraction
        memory, proof_notes = apply_proof(memory, req.profile, req.cfg, req.gpu, req.tp_size)
    schedules = compared_schedules(req, server, choice, memory)
    scores = ScoreSet.build(schedules, fit, held, server.assumptions)
    plan = Plan(
        provenance=collect_provenance(),
        inputs=_inputs(req, server, trace_kind, replicas),
        decode=DecodePlan(decode_bs, max(decode_bs, default=0), _recorded(whole[0]),
                          list(default.decode_bs)),
        piecewise=PiecewisePlan(tokens, max(tokens, default=0), _recorded(whole[1]),
                                list(default.piecewise_tokens)),
        memory=memory,
        comparison=scores.headline,
        comparison_fit=scores.headline_fit,
        scenarios=score_rows(scores),
        basis=plan_basis(server, choice, fit, held, replicas, req),
        flags=_flags(req, server, choice, memory),
        simulation=replace(simulation, peak_kv_demand_tokens=memory.peak_kv_demand_tokens),
        closed_loop=loop or [],
    )
    plan.warnings.extend(server.cost.warnings)
    plan.warnings.extend(replication_warnings(req))
    plan.warnings.extend(ceiling_warnings(whole[0], default))
    plan.warnings.extend(plan_warnings(scores, req))
    plan.warnings.extend(proof_notes)
    plan.warnings.extend(basin_lines(loop or []))
    plan.warnings.extend(worse_lines(loop or []))
    return plan


def _recorded(hist: Histogram) -> StepHistogram:
    return StepHistogram(hist.sizes.tolist(), hist.counts.tolist(), hist.time_s.tolist(),
                         hist.attention_ms.tolist())


def _flags(
    req: PlanRequest, server: Server, choice: RobustChoice, memory: PlanMemory
) -> dict[str, list[str]]:
    # vLLM's list holds token sizes too; other engines' decode flags take its decode part.
    decode_bs = choice.decode_bs
    flag_decode = decode_part(decode_bs, choice.cover) if req.engine == "vllm" else decode_bs
    values = FlagValues(
        tuple(flag_decode),
        tuple(choice.tokens),
        memory.mem_fraction_static,
        memory.gpu_memory_utilization,
        memory.trtllm_free_gpu_memory_fraction,
        memory.kv_tokens,
        memory.kv_bytes,
        server.chunk,
        server.max_running,
        req.tp_size,
    )
    return all_flags(values, server.version if req.engine == "sglang" else None)


def _inputs(req: PlanRequest, server: Server, trace_kind: str, replicas: int) -> PlanInputs:
    return PlanInputs(
        trace=req.trace_name,
        trace_kind=trace_kind,
        model=req.cfg.name,
        gpu=req.gpu.name,
        engine=req.engine,
        engine_version=server.version,
        profile=req.profile_name,
        tp_size=req.tp_size,
        chunked_prefill_size=server.chunk,
        max_running_requests=server.max_running,
        context_len=server.context_len,
        loads=list(req.loads) if trace_kind == "requests" else [1.0],
        replicas=replicas,
        compare_plan=req.compare_name,
    )
