"""A plan end to end: simulate the trace, choose sizes, size memory, compare with the default.

Both schedules are scored on the same simulated steps: the trace is run once through the
scheduler with the engine default's step times (the server as it runs today), and the plan
and the default are then costed on the batches that run produced.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from cgtool.config import ModelConfig
from cgtool.errors import InputError
from cgtool.gpus import GpuSpec
from cgtool.planner.cost import (
    CostModel,
    Histogram,
    ScheduleScore,
    predicted_graph_bytes,
    profile_cost,
    roofline_cost,
    score_schedule,
    served_ms,
)
from cgtool.planner.flags import FlagValues, all_flags
from cgtool.planner.memory import (
    VLLM_DEFAULT_GPU_MEMORY_UTILIZATION,
    MemoryPlan,
    activation_bytes,
    check_plan_safety,
    kv_tokens_at,
    plan_memory,
    sglang_default_max_running,
    sglang_default_mem_fraction,
)
from cgtool.planner.optimiser import Limits, choose_separate, choose_shared
from cgtool.planner.parallel import check_tp_size, rank_shapes
from cgtool.planner.schedules import EngineSchedule, default_schedule, resolve_version
from cgtool.planner.simulator import SimulationResult, StepCost, simulate
from cgtool.provenance import collect_provenance
from cgtool.results import Provenance, utc_now_iso

Progress = Callable[[str, float], None]
# A batch trace says nothing of context: each decode request is taken to hold this many tokens.
BATCH_TRACE_CONTEXT_TOKENS = 1024


@dataclass(frozen=True, slots=True)
class PlanRequest:
    """Everything a plan depends on besides the trace."""

    cfg: ModelConfig
    gpu: GpuSpec
    engine: str = "sglang"
    engine_version: str | None = None
    trace_name: str = ""
    profile: dict[str, Any] | None = None  # a capture report's dict
    profile_name: str | None = None
    tp_size: int = 1
    chunked_prefill_size: int | None = None
    max_running_requests: int | None = None
    budget_graphs: int | None = None
    budget_memory_bytes: int | None = None

    def __post_init__(self) -> None:
        check_tp_size(self.cfg, self.tp_size, self.gpu)


@dataclass(slots=True)
class KindPlan:
    capture: list[int]
    max_size: int
    histogram: Histogram
    default_capture: list[int]


@dataclass(slots=True)
class Plan:
    inputs: dict[str, Any]
    decode: KindPlan
    piecewise: KindPlan
    memory: MemoryPlan
    comparison: list[ScheduleScore]
    flags: dict[str, list[str]]
    simulation: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    status: str = "complete"
    created: str = field(default_factory=utc_now_iso)
    provenance: Provenance = field(default_factory=collect_provenance)

    def to_dict(self) -> dict[str, Any]:
        def kind(k: KindPlan, sizes_key: str, max_key: str, default_key: str) -> dict[str, Any]:
            return {
                sizes_key: k.capture,
                max_key: k.max_size,
                "histogram": k.histogram.to_dict(),
                default_key: k.default_capture,
            }

        return {
            "schema": "cgtool.plan",
            "version": "1.0",
            "status": self.status,
            "created": self.created,
            "provenance": asdict(self.provenance),
            "inputs": self.inputs,
            "decode": kind(self.decode, "capture_bs", "max_bs", "default_capture_bs"),
            "piecewise": kind(
                self.piecewise, "capture_num_tokens", "max_tokens", "default_capture_num_tokens"
            ),
            "memory": self.memory.to_dict(),
            "comparison": [asdict(row) for row in self.comparison],
            "flags": self.flags,
            "simulation": self.simulation,
            "warnings": self.warnings,
        }


@dataclass(frozen=True, slots=True)
class _Setup:
    version: str
    chunk: int
    max_running: int
    context_len: int
    default: EngineSchedule
    default_fraction: float  # SGLang's, or vLLM's utilisation turned into the same meaning
    default_kv_tokens: int
    cost: CostModel


def _setup(req: PlanRequest) -> _Setup:
    cfg, memory, tp = req.cfg, req.gpu.memory_bytes, req.tp_size
    version = resolve_version(req.engine, req.engine_version)
    probe = default_schedule(
        req.engine,
        version,
        gpu_memory_bytes=memory,
        tp_size=req.tp_size,
        chunked_prefill_size=req.chunked_prefill_size,
        max_running_requests=req.max_running_requests,
    )
    chunk = req.chunked_prefill_size or probe.chunked_prefill_size
    if req.engine == "sglang":
        fraction = sglang_default_mem_fraction(
            version,
            memory,
            chunked_prefill_size=chunk,
            max_bs=probe.max_bs,
            num_piecewise_tokens=len(probe.piecewise_tokens),
            tp_size=req.tp_size,
        )
        kv_tokens = kv_tokens_at(cfg, memory, fraction, tp)
        max_running = req.max_running_requests or sglang_default_max_running(
            kv_tokens, cfg.max_context_len
        )
    else:
        # vLLM's utilisation, like SGLang's fraction, is of each GPU's memory.
        shard = rank_shapes(cfg, tp)
        max_running = req.max_running_requests or (1024 if memory >= 70 * (1 << 30) else 256)
        outside = activation_bytes(cfg, chunk, max_running, tp)
        kv_bytes = VLLM_DEFAULT_GPU_MEMORY_UTILIZATION * memory - shard.weight_bytes(2) - outside
        kv_tokens = max(0, int(kv_bytes // shard.kv_bytes_per_token(2)))
        fraction = round((shard.weight_bytes(2) + max(kv_bytes, 0)) / memory, 3)
    default = default_schedule(
        req.engine,
        version,
        gpu_memory_bytes=memory,
        tp_size=req.tp_size,
        chunked_prefill_size=chunk,
        max_running_requests=max_running,
    )
    # vLLM pads decode batches into its token list too, so its decode tables reach the tokens'.
    max_bs = max(max_running, default.max_bs, chunk if req.engine == "vllm" else 0)
    max_tokens = max(chunk, default.max_tokens)
    if req.profile is not None:
        cost = profile_cost(
            req.profile,
            cfg,
            req.gpu,
            max_bs=max_bs,
            max_tokens=max_tokens,
            source=req.profile_name or "report",
            tp_size=tp,
        )
    else:
        cost = roofline_cost(cfg, req.gpu, max_bs=max_bs, max_tokens=max_tokens, tp_size=tp)
    return _Setup(
        version, chunk, max_running, cfg.max_context_len, default, fraction, kv_tokens, cost
    )


def _default_step_cost(setup: _Setup) -> StepCost:
    cost, default = setup.cost, setup.default
    return StepCost(
        decode_ms=served_ms(
            cost.decode_graph_ms, cost.decode_eager_ms, default.decode_bs, default.pads
        ),
        extend_ms=served_ms(
            cost.extend_graph_ms, cost.extend_eager_ms, default.piecewise_tokens, default.pads
        ),
        kv_read_ms_per_token=cost.kv_read_ms_per_token,
        attention_ms_per_pair=cost.attention_ms_per_pair,
    )


def plan_requests(
    arrival_s: np.ndarray,
    input_len: np.ndarray,
    output_len: np.ndarray,
    cached_len: np.ndarray | None,
    req: PlanRequest,
    progress: Progress | None = None,
    stop: Callable[[], bool] | None = None,
) -> Plan:
    """Plan from request-level arrays (seconds, tokens); `stop` ends the simulation early and
    the plan then covers the requests simulated so far, marked incomplete."""
    setup = _setup(req)
    if len(arrival_s) == 0:
        raise InputError(
            f"{req.trace_name or 'the trace'} holds no request", "Plan from a trace with requests."
        )
    result = simulate(
        arrival_s,
        input_len,
        output_len,
        cached_len,
        cost=_default_step_cost(setup),
        max_running_requests=setup.max_running,
        chunked_prefill_size=setup.chunk,
        kv_capacity_tokens=setup.default_kv_tokens,
        context_len=setup.context_len,
        progress=None if progress is None else (lambda f: progress("simulate", f)),
        stop=stop,
    )
    if result.dropped_requests == result.num_requests:
        raise InputError(
            f"{req.trace_name or 'the trace'}: all {result.num_requests} requests are longer than "
            f"{req.cfg.name}'s context ({setup.context_len}) or its KV pool ({setup.default_kv_tokens} tokens)",
            "Plan for a model with a longer context, or a larger GPU.",
        )
    footprint = np.asarray(input_len) + np.maximum(np.asarray(output_len), 1)
    typical = int(np.median(footprint)) if len(footprint) else BATCH_TRACE_CONTEXT_TOKENS
    decode, extend = _histograms(result, setup.cost.kv_read_ms_per_token)
    fields = (
        "num_requests",
        "dropped_requests",
        "duration_s",
        "steps",
        "mean_queue_s",
        "p99_queue_s",
    )
    summary = {name: getattr(result, name) for name in fields}
    plan = _finish(
        req,
        setup,
        decode,
        extend,
        summary,
        result.peak_kv_demand_tokens,
        typical,
        "requests",
        progress,
    )
    if result.completed_fraction < 1.0:
        plan.status = "incomplete"
        plan.warnings.insert(
            0,
            f"incomplete: simulation stopped after {result.completed_fraction:.0%} of the "
            "requests; sizes fit only the traffic simulated so far",
        )
    if result.dropped_requests:
        plan.warnings.append(
            f"{result.dropped_requests} requests were longer than the context or the KV pool and were dropped"
        )
    return plan


def plan_batches(
    decode_sizes: np.ndarray,
    decode_counts: np.ndarray,
    extend_sizes: np.ndarray,
    extend_counts: np.ndarray,
    req: PlanRequest,
    progress: Progress | None = None,
) -> Plan:
    """Plan from step histograms a server logged (no simulation)."""
    setup = _setup(req)
    decode_sizes, decode_counts = _clip(decode_sizes, decode_counts, setup.cost.max_bs)
    extend_sizes, extend_counts = _clip(extend_sizes, extend_counts, setup.cost.max_tokens)
    context_ms = (
        decode_counts
        * decode_sizes
        * float(BATCH_TRACE_CONTEXT_TOKENS)
        * setup.cost.kv_read_ms_per_token
    )
    attention = (
        extend_counts * extend_sizes * (extend_sizes + 1) / 2.0 * setup.cost.attention_ms_per_pair
    )
    # No clock ran: time at each size is estimated as the default schedule would take it.
    step_cost = _default_step_cost(setup)
    decode_s = (decode_counts * step_cost.decode_ms[decode_sizes] + context_ms) / 1e3
    extend_s = (extend_counts * step_cost.extend_ms[extend_sizes] + attention) / 1e3
    decode = Histogram(decode_sizes, decode_counts, decode_s, context_ms)
    extend = Histogram(extend_sizes, extend_counts, extend_s, attention)
    summary = dict.fromkeys(("num_requests", "dropped_requests", "mean_queue_s", "p99_queue_s"), 0)
    summary["steps"] = int(decode_counts.sum() + extend_counts.sum())
    summary["duration_s"] = float(decode_s.sum() + extend_s.sum())
    plan = _finish(
        req, setup, decode, extend, summary, 0, BATCH_TRACE_CONTEXT_TOKENS, "batches", progress
    )
    plan.warnings.append(
        f"batch trace: decode context assumed {BATCH_TRACE_CONTEXT_TOKENS} tokens a request"
    )
    return plan


def _clip(sizes: np.ndarray, counts: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """One entry per size, ascending. Steps larger than the engine allows cannot occur in that
    server; a log from a server with larger limits is planned within this one's."""
    sizes, counts = np.asarray(sizes, np.int64), np.asarray(counts, np.int64)
    keep = (sizes >= 1) & (sizes <= limit) & (counts > 0)
    unique, index = np.unique(sizes[keep], return_inverse=True)
    return unique, np.bincount(index, weights=counts[keep], minlength=len(unique)).astype(np.int64)


def _histograms(result: SimulationResult, kv_ms_per_token: float) -> tuple[Histogram, Histogram]:
    d = np.nonzero(result.decode_counts)[0]
    e = np.nonzero(result.extend_counts)[0]
    return (
        Histogram(
            d,
            result.decode_counts[d],
            result.decode_time_s[d],
            result.decode_context_tokens[d] * kv_ms_per_token,
        ),
        Histogram(
            e, result.extend_counts[e], result.extend_time_s[e], result.extend_attention_ms[e]
        ),
    )


def _finish(
    req: PlanRequest,
    setup: _Setup,
    decode: Histogram,
    extend: Histogram,
    summary: dict[str, Any],
    peak_kv: int,
    typical_tokens: int,
    trace_kind: str,
    progress: Progress | None,
) -> Plan:
    if progress is not None:
        progress("optimise", 0.0)
    cost, default = setup.cost, setup.default
    limits = Limits(
        setup.max_running,
        min(setup.chunk, setup.context_len),
        req.budget_graphs,
        req.budget_memory_bytes,
    )
    choose = choose_shared if req.engine == "vllm" else choose_separate
    decode_bs, tokens = choose(decode, extend, cost, default, limits)
    memory = plan_memory(
        req.cfg,
        req.gpu.memory_bytes,
        graph_bytes=cost.graph_bytes(decode_bs, tokens),
        chunked_prefill_size=setup.chunk,
        max_running_requests=setup.max_running,
        peak_kv_demand_tokens=peak_kv,
        typical_request_tokens=typical_tokens,
        default_mem_fraction_static=setup.default_fraction,
        tp_size=req.tp_size,
    )
    if req.profile is not None:
        predicted, measured = predicted_graph_bytes(req.profile, req.cfg, req.gpu)
        memory = replace(memory, graph_bytes_predicted=predicted, graph_bytes_measured=measured)
    check_plan_safety(tokens, setup.chunk, setup.context_len, memory)
    comparison = [
        score_schedule("plan", decode, extend, cost, decode_bs, tokens, kv_tokens=memory.kv_tokens),
        score_schedule(
            "default",
            decode,
            extend,
            cost,
            default.decode_bs,
            default.piecewise_tokens,
            pads=default.pads,
            kv_tokens=setup.default_kv_tokens,
        ),
    ]
    values = FlagValues(
        tuple(decode_bs),
        tuple(tokens),
        memory.mem_fraction_static,
        memory.gpu_memory_utilization,
        memory.trtllm_free_gpu_memory_fraction,
        memory.kv_tokens,
        memory.kv_bytes,
        setup.chunk,
        setup.max_running,
        req.tp_size,
    )
    inputs = {
        "trace": req.trace_name,
        "trace_kind": trace_kind,
        "model": req.cfg.name,
        "gpu": req.gpu.name,
        "engine": req.engine,
        "engine_version": setup.version,
        "profile": req.profile_name,
        "tp_size": req.tp_size,
        "chunked_prefill_size": setup.chunk,
        "max_running_requests": setup.max_running,
        "context_len": setup.context_len,
    }
    plan = Plan(
        inputs=inputs,
        decode=KindPlan(decode_bs, max(decode_bs, default=0), decode, list(default.decode_bs)),
        piecewise=KindPlan(tokens, max(tokens, default=0), extend, list(default.piecewise_tokens)),
        memory=memory,
        comparison=comparison,
        flags=all_flags(values, setup.version if req.engine == "sglang" else None),
        simulation=summary | {"peak_kv_demand_tokens": peak_kv},
    )
    plan.warnings.extend(cost.warnings)
    plan.warnings.extend(_replication_warnings(req))
    plan.warnings.extend(_ceiling_warnings(decode, default))
    if comparison[0].expected_step_ms > comparison[1].expected_step_ms:
        plan.warnings.append(
            "the budgets given make the plan's expected step slower than the default's"
        )
    if progress is not None:
        progress("optimise", 1.0)
    return plan


def _replication_warnings(req: PlanRequest) -> list[str]:
    kv, tp = req.cfg.num_kv_heads, req.tp_size
    if kv >= tp:
        return []
    return [
        f"--tp {tp} is more ranks than {req.cfg.name}'s {kv} KV heads: each is replicated on "
        f"{tp // kv} ranks, so KV memory per token stops shrinking past --tp {kv}"
    ]


def _ceiling_warnings(decode: Histogram, default: EngineSchedule) -> list[str]:
    above = decode.sizes > default.max_bs
    if not above.any():
        return []
    share = decode.counts[above].sum() / max(decode.counts.sum(), 1)
    return [
        (
            f"the default's largest decode graph ({default.max_bs}) is below batches the trace "
            f"reaches (up to {int(decode.sizes.max())}): {share:.0%} of decode steps would run eagerly"
        )
    ]
