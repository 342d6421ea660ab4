"""The simulated steps a plan was chosen for, and the plan's cost model to predict them.

With the trace, the trace is planned again through the planner's public entry points and
the per-size attention time of that run gives each size's mean context (decode) or cached
prefix (extend). Without it, plan.json's histograms give sizes and counts and the context is
the planner's assumption for batch traces.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cgtool.documents.plan_document import Plan, StepHistogram
from cgtool.planner.cost import CostModel, roofline_cost
from cgtool.planner.plan import BATCH_TRACE_CONTEXT_TOKENS
from cgtool.planner.profile_fit import profile_cost
from cgtool.planner.request import PlanRequest
from cgtool.planner.scoring import padded_sizes
from cgtool.planner.step_time import attention_pairs, decode_step_ms, extend_step_ms
from cgtool.specs.config import ModelConfig, load_model_config
from cgtool.specs.gpus import GpuSpec, gpu_spec
from cgtool.verify.steps import KindPopulation, Step, StepPopulation, kind_steps


def plan_model(plan: Plan) -> tuple[ModelConfig, GpuSpec, int]:
    inputs = plan.inputs
    return load_model_config(inputs.model), gpu_spec(inputs.gpu), inputs.tp_size


def population_from_histograms(plan: Plan) -> StepPopulation:
    def of(hist: StepHistogram, context: int) -> KindPopulation:
        return kind_steps(hist.sizes, hist.counts, [context] * len(hist.sizes))

    return StepPopulation(of(plan.decode.histogram, BATCH_TRACE_CONTEXT_TOKENS),
                          of(plan.piecewise.histogram, 0), "histogram")


def population_from_trace(
    plan: Plan, trace: Path, trace_format: str = "cgtool"
) -> tuple[StepPopulation, list[str]]:
    """Re-simulate `trace` as the plan did; the warnings say where the result differs."""
    from cgtool.planner.plan import plan_batches, plan_requests
    from cgtool.traces.convert import load_trace
    from cgtool.traces.trace import RequestTrace

    request, notes = _plan_request(plan, str(trace))
    loaded = load_trace(trace, trace_format).trace
    if not isinstance(loaded, RequestTrace):
        again = plan_batches(
            loaded.decode_batch_size, loaded.decode_count, loaded.extend_num_tokens,
            loaded.extend_count, request,
        )
        return _with_context(again, request, source="histogram"), notes + _differs(plan, again)
    again = plan_requests(
        loaded.arrival_s, loaded.input_len, loaded.output_len, loaded.cached_len, request
    )
    return _with_context(again, request, source="trace"), notes + _differs(plan, again)


def _plan_request(plan: Plan, trace_name: str) -> tuple[PlanRequest, list[str]]:
    cfg, gpu, tp = plan_model(plan)
    inputs = plan.inputs
    profile, notes = None, []
    if inputs.profile:
        path = Path(inputs.profile)
        if path.is_file():
            from cgtool.verify.profile import load_profile

            profile = load_profile(path)
        else:
            notes.append(f"the plan's profile {path} is not here: steps re-simulated with the roofline")
    request = PlanRequest(
        cfg=cfg, gpu=gpu, engine=inputs.engine, engine_version=inputs.engine_version,
        trace_name=trace_name, profile=profile, profile_name=inputs.profile, tp_size=tp,
        chunked_prefill_size=inputs.chunked_prefill_size,
        max_running_requests=inputs.max_running_requests,
        # The plan's load scenarios and replicas (plans before 1.1 had neither: 1x, one server).
        loads=tuple(inputs.loads), replicas=inputs.replicas,
    )
    return request, notes


def _with_context(again: Plan, request: PlanRequest, source: str) -> StepPopulation:
    unit = roofline_cost(request.cfg, request.gpu, max_bs=1, max_tokens=1, tp_size=request.tp_size)
    decode, extend = again.decode.histogram, again.piecewise.histogram
    assert decode.attention_ms is not None and extend.attention_ms is not None  # a fresh plan's
    d_sizes, d_counts = np.asarray(decode.sizes, np.int64), np.asarray(decode.counts, np.int64)
    e_sizes, e_counts = np.asarray(extend.sizes, np.int64), np.asarray(extend.counts, np.int64)
    steps = np.maximum(d_counts * d_sizes, 1)
    context = np.asarray(decode.attention_ms, np.float64) / unit.kv_read_ms_per_token / steps
    if source == "histogram":
        context = np.full(len(d_sizes), BATCH_TRACE_CONTEXT_TOKENS)
    n = e_sizes.astype(np.float64)
    pairs = np.asarray(extend.attention_ms) / unit.attention_ms_per_pair / np.maximum(e_counts, 1)
    # One request of n new tokens after a prefix p does n*p + n(n+1)/2 query-key pairs: the
    # prefix that gives the simulated steps' mean attention work.
    prefix = np.maximum((pairs - n * (n + 1) / 2) / np.maximum(n, 1), 0)
    return StepPopulation(
        kind_steps(d_sizes, d_counts, np.rint(context)),
        kind_steps(e_sizes, e_counts, np.rint(prefix)),
        source,
    )


def _differs(plan: Plan, again: Plan) -> list[str]:
    def same(saved: StepHistogram, hist: StepHistogram) -> bool:
        return saved.sizes == hist.sizes and saved.counts == hist.counts

    if same(plan.decode.histogram, again.decode.histogram) and same(
        plan.piecewise.histogram, again.piecewise.histogram
    ):
        return []
    return [("the trace simulates to other steps than the plan's histograms: is it the trace "
            "the plan was made from?")]


def plan_cost(plan: Plan, max_bs: int, max_tokens: int) -> CostModel:
    """The cost model the plan predicted with: its profile when that file is here, else the
    roofline."""
    cfg, gpu, tp = plan_model(plan)
    profile = plan.inputs.profile
    if profile and Path(profile).is_file():
        from cgtool.verify.profile import load_profile

        return profile_cost(
            load_profile(Path(profile)), cfg, gpu, max_bs=max_bs, max_tokens=max_tokens,
            source=str(profile), tp_size=tp,
        )
    return roofline_cost(cfg, gpu, max_bs=max_bs, max_tokens=max_tokens, tp_size=tp)


def predicted_ms(cost: CostModel, step: Step, captured: list[int]) -> tuple[float, int]:
    """(predicted step ms, graph size it replays or 0 when eager), as the planner costs it."""
    padded = int(padded_sizes(np.array([step.size]), captured)[0])
    if step.kind == "decode":
        dense = cost.decode_graph_ms[padded] if padded else cost.decode_eager_ms[step.size]
        return float(decode_step_ms(dense, cost.kv_read_ms_per_token, step.size * step.context)), padded
    dense = cost.extend_graph_ms[padded] if padded else cost.extend_eager_ms[step.size]
    pairs = attention_pairs(step.size, step.context)
    return float(extend_step_ms(dense, cost.attention_ms_per_pair, pairs)), padded
