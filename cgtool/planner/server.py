"""The server a plan is for: its limits, its default schedule and pool, its cost of a step."""

from __future__ import annotations

from dataclasses import dataclass

from cgtool.planner.cost import CostModel, roofline_cost, with_hidden_states
from cgtool.planner.eager import EagerAssumption, eager_range
from cgtool.planner.engine_buffers import default_attention_backend, with_engine_buffers
from cgtool.planner.memory import (
    kv_tokens_at,
    sglang_default_max_running,
    sglang_default_mem_fraction,
    vllm_default_pool,
)
from cgtool.planner.profile_fit import profile_cost
from cgtool.planner.request import PlanRequest
from cgtool.planner.schedules import (
    EngineSchedule,
    default_schedule,
    resolve_version,
    server_args_max_bs,
    vllm_default_max_num_seqs,
)
from cgtool.planner.scoring import schedule_step_cost
from cgtool.planner.step_time import StepCost


@dataclass(frozen=True, slots=True)
class Server:
    version: str
    chunk: int
    max_running: int
    context_len: int
    default: EngineSchedule
    default_fraction: float  # SGLang's, or vLLM's utilisation turned into the same meaning
    default_kv_tokens: int
    cost: CostModel  # the roofline's (low eager) or the profile's
    assumptions: tuple[EagerAssumption, ...]
    attention_backend: str | None = None  # SGLang's, whose graph buffers the cost counts


def server_for(req: PlanRequest) -> Server:
    """The server the engine starts for this request by its own defaults, and its step cost."""
    version = resolve_version(req.engine, req.engine_version)
    # A first schedule gives the engine's chunk when the request names none; the pool's
    # default depends on it, and the real schedule on the pool's running-request limit.
    probe = _schedule(req, version, req.chunked_prefill_size, req.max_running_requests)
    chunk = req.chunked_prefill_size or probe.chunked_prefill_size
    fraction, kv_tokens, max_running = _default_pool(req, version, chunk, len(probe.piecewise_tokens))
    default = _schedule(req, version, chunk, max_running)
    # vLLM pads decode batches into its token list too, so its decode tables reach the tokens'.
    # An existing plan (--compare-plan) may hold sizes past both: its steps pad up to them, and
    # its graphs' memory and capture time are priced there.
    old_bs, old_tokens = req.compare[:2] if req.compare is not None else ((), ())
    max_bs = max(max_running, default.max_bs, chunk if req.engine == "vllm" else 0, *old_bs)
    max_tokens = max(chunk, default.max_tokens, *old_tokens)
    cost = with_hidden_states(_cost_model(req, max_bs, max_tokens), req.cfg, req.hidden_mode)
    backend = _attention_backend(req, version)
    if backend is not None:
        cost = with_engine_buffers(
            cost, req.cfg, backend, req.cfg.max_context_len, req.gpu, version, req.tp_size
        )
    return Server(
        version,
        chunk,
        max_running,
        req.cfg.max_context_len,
        default,
        fraction,
        kv_tokens,
        cost,
        tuple(eager_range(cost, req.cfg, req.tp_size)),
        backend,
    )


def _attention_backend(req: PlanRequest, version: str) -> str | None:
    """SGLang's attention backend: the one asked for, else the one SGLang picks itself."""
    if req.engine != "sglang":
        return None
    return req.attention_backend or default_attention_backend(req.cfg, req.gpu, version)


def _cost_model(req: PlanRequest, max_bs: int, max_tokens: int) -> CostModel:
    """The profile's step times when a capture report is given, else the roofline's."""
    if req.profile is None:
        return roofline_cost(req.cfg, req.gpu, max_bs=max_bs, max_tokens=max_tokens, tp_size=req.tp_size)
    return profile_cost(
        req.profile,
        req.cfg,
        req.gpu,
        max_bs=max_bs,
        max_tokens=max_tokens,
        source=req.profile_name or "report",
        tp_size=req.tp_size,
    )


def _schedule(
    req: PlanRequest, version: str, chunk: int | None, max_running: int | None
) -> EngineSchedule:
    return default_schedule(
        req.engine,
        version,
        gpu_memory_bytes=req.gpu.memory_bytes,
        tp_size=req.tp_size,
        chunked_prefill_size=chunk,
        max_running_requests=max_running,
        gpu_name=req.gpu.name,
    )


def _default_pool(
    req: PlanRequest, version: str, chunk: int, num_piecewise_tokens: int
) -> tuple[float, int, int]:
    """The engine's own memory fraction, KV pool (tokens) and running-request limit."""
    cfg, memory, tp = req.cfg, req.gpu.memory_bytes, req.tp_size
    if req.engine == "sglang":
        fraction = sglang_default_mem_fraction(
            version,
            memory,
            chunked_prefill_size=chunk,
            max_bs=server_args_max_bs(version, memory, tp, req.max_running_requests),
            num_piecewise_tokens=num_piecewise_tokens,
            tp_size=tp,
        )
        kv_tokens = kv_tokens_at(cfg, memory, fraction, tp)
        max_running = req.max_running_requests or sglang_default_max_running(
            kv_tokens, cfg.max_context_len
        )
        return fraction, kv_tokens, max_running
    max_running = req.max_running_requests or vllm_default_max_num_seqs(memory, req.gpu.name)
    kv_tokens, fraction = vllm_default_pool(
        cfg, memory, chunked_prefill_size=chunk, max_num_seqs=max_running, tp_size=tp
    )
    return fraction, kv_tokens, max_running


def default_step_cost(server: Server) -> StepCost:
    """Step times of the server as it runs today (the default schedule), for the simulation."""
    default = server.default
    return schedule_step_cost(server.cost, default.decode_bs, default.piecewise_tokens, default.pads)
